"""Every GPU figure (docs/results/gpu_suite.md) in one run of at most 5 minutes on one GPU.

    python benchmarks/gpu/suite.py                  # one H100/H200: table, JSON, per-part times
    python benchmarks/gpu/suite.py --plan           # the time estimate below, nothing run
    python benchmarks/gpu/suite.py --cpu-smoke      # same code paths at debug size on CPU (CI)

Parts, in order (each writes its rows to the JSON file as soon as it ends, so a run cut
short keeps what it measured; a part that would start after `--budget-s` is skipped and
says so):

- train:   GRT vs its dense isoFLOP twin, small and medium, bf16 autocast, selective op AC,
           sampled r (GRT), compiled and eager. Reports MFU (FLOPs at the depths actually
           sampled), compiled / eager tokens/s, peak memory at equal tokens per step and the
           dynamo graphs compiled after warm-up (goal 0).
- float8:  GRT small and medium with torchao float8 (tensorwise), and the llama_1b flavor
           (d = 2048) in bf16 and float8: float8 / bf16 tokens/s per size.
- generate: benchmarks/generate_bench.py's measurement: GRT large vs dense_large, batch 4,
           prompt 1024, 128 new tokens, eager and compiled latency and peak memory; eager
           decoding memory at batch 1 and 32 for every KV strategy.
- halting: the same decode of GRT large with each per-token halting rule at the threshold
           where no token halts, against fixed r = R eager (and generate's compiled): what
           a rule's per-step measure and exit check cost on the GPU.

The models are built as the trainer builds them: torchtitan's JobConfig from the preset
TOML, torchtitan's model converters (float8), then the spec's `parallelize_grt` (AC, then
compile) on one device, where torchtitan trains with bf16 autocast. The compile cache
(inductor, AOTAutograd, triton) goes to `--cache-dir`, so a second run reuses it.

Time estimate (`--plan` prints it): timed work is FLOPs / (30% of the H200's 989 TFLOP/s)
from the FLOP formula (docs/architecture.md): 2.9 s for train's 8 runs (4 compiled, 4
eager), 5.9 s for float8's 4 new runs (small and medium reuse train's compiled bf16 runs),
0.3 s for generation, 0.5 s for halting's eager decodes (bound by kernel launches and the
per-step host sync, which the plan does not model; the last part, so a run over budget skips
it and says so). The run is bounded by compilation, not compute: `--plan` counts the
10 compiled models and budgets `COMPILE_S` per part for each one's cold compile (train and
float8 measured on an H200; generate's still assumed); a warm cache cuts that to a few
seconds each. A part that fails is recorded with its error and the parts after it still run
(exit status 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# Seconds a cold compile of one training model (forward + backward, AC) or one decode step
# is budgeted in the plan. train and float8: the first H200 run's warm-ups (2026-12-04, torch
# 2.11: 29.7 s and 141.5 s for 4 models each; float8 and d = 2048 graphs compile slower);
# generate: still an assumption. Every run prints its seconds per part.
COMPILE_S = {"train": 7.5, "float8": 35.5, "generate": 25.0, "halting": 0.0}
H200_BF16_PEAK = 989e12


@dataclasses.dataclass(frozen=True)
class SuiteSize:
    """What one run measures: the GPU sizes, or the debug sizes of --cpu-smoke."""

    train_pairs: tuple[tuple[str, str, str], ...]  # (label, GRT config, dense config)
    wide: tuple[str, str]  # (label, GRT config) of the float8 run at the largest width
    batch: int
    seq_len: int
    warmup: int
    steps: int
    gen_grt: str
    gen_dense: str
    gen_batch: int
    gen_prompt: int
    gen_new_tokens: int
    gen_memory_batches: tuple[int, ...]
    gen_repeats: int
    compile_backend: str
    float8_emulate: bool
    vocab_size: int | None = None  # None: the flavor's (GPT-2's 50257)


GPU = SuiteSize(
    train_pairs=(("small", "grt_small", "dense_small"), ("medium", "grt_medium", "dense_medium")),
    wide=("llama_1b", "grt_llama_1b"),
    batch=8,
    seq_len=1024,
    warmup=3,
    steps=6,
    gen_grt="large",
    gen_dense="dense_large",
    gen_batch=4,
    gen_prompt=1024,
    gen_new_tokens=128,
    gen_memory_batches=(1, 32),
    gen_repeats=3,
    compile_backend="inductor",
    float8_emulate=False,
)
# Debug size on CPU: the same parts and code paths; aot_eager traces and partitions like
# inductor without its code generation, and a 512-token vocabulary keeps the LM head from
# dominating (minutes saved on 2 cores).
CPU_SMOKE = SuiteSize(
    train_pairs=(("debug", "grt_debug", "dense_debug"),),
    wide=("debug", "grt_debug"),
    batch=2,
    seq_len=32,
    warmup=2,
    steps=1,
    gen_grt="debug",
    gen_dense="dense_debug",
    gen_batch=2,
    gen_prompt=8,
    gen_new_tokens=3,
    gen_memory_batches=(1, 2),
    gen_repeats=1,
    compile_backend="aot_eager",
    float8_emulate=True,
    vocab_size=512,
)


# ---- training --------------------------------------------------------------------------


def flavor_args(flavor: str, size: SuiteSize, job_config=None):
    """The flavor with the preset's [grt] options (the trainer's `update_from_config`)."""
    from grt_titan.model import grt_flavors

    args = grt_flavors[flavor].replace()
    if job_config is not None:
        args.update_from_config(job_config)
    return args.replace(vocab_size=size.vocab_size) if size.vocab_size else args


def generation_args(flavor: str, size: SuiteSize):
    """The flavor with positions for the whole decode: table 3's prompt 1024 + 128 new tokens
    runs past a preset's 1024 learned positions (the trainer widens them to seq_len alike)."""
    args = flavor_args(flavor, size)
    return args.replace(max_seq_len=max(args.max_seq_len, size.gen_prompt + size.gen_new_tokens))


def job_config(config: str, size: SuiteSize, compiled: bool, float8: bool):
    """torchtitan's JobConfig for a preset TOML, as `--job.config_file` would parse it."""
    from torchtitan.config import ConfigManager

    args = [
        "--job.config_file",
        str(REPO / "train_configs" / f"{config}.toml"),
        "--training.seq_len",
        str(size.seq_len),
        "--activation_checkpoint.mode",
        "selective",
        "--activation_checkpoint.selective_ac_option",
        "op",
        "--compile.backend",
        size.compile_backend,
        "--compile.enable" if compiled else "--compile.no-enable",
    ]
    if float8:
        args += ["--model.converters", "quantize.linear.float8"]
        if size.float8_emulate:
            args += ["--quantize.linear.float8.emulate"]
    return ConfigManager().parse_args(args)


def build_trained_model(config: str, size: SuiteSize, device: str, compiled: bool, float8: bool):
    """Flavor + [grt] options, converters, `parallelize_grt`, init: the trainer's order."""
    import torch

    importlib.import_module("torchtitan.components.quantization")  # registers the float8 converter
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.model_converter import build_model_converters

    from grt_titan.infra.parallelize import parallelize_grt
    from grt_titan.model.model import build_meta_model

    jc = job_config(config, size, compiled, float8)
    args = flavor_args(jc.model.flavor, size, jc)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    model = build_meta_model(args)
    # torchtitan allows emulated float8 only with compile off (a CPU has no float8 matmul):
    # the converter sees an eager config, the model is compiled all the same.
    converter_jc = job_config(config, size, False, float8) if size.float8_emulate else jc
    build_model_converters(converter_jc, dims).convert(model)
    model = parallelize_grt(model, dims, jc)
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(device))
    return model.train(), args


def compiled_graphs() -> int:
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


_RUNS: dict[tuple, dict] = {}  # one measurement per configuration and run: float8 reuses train's bf16 rows


def train_run(config: str, size: SuiteSize, device: str, compiled: bool, float8: bool = False) -> dict:
    key = (config, size, device, compiled, float8)
    if key not in _RUNS:
        _RUNS[key] = measure_training(config, size, device, compiled, float8)
    return _RUNS[key]


def measure_training(config: str, size: SuiteSize, device: str, compiled: bool, float8: bool) -> dict:
    """Warm-up, then timed steps: tokens/s, achieved FLOP/s at the sampled depths, peak memory."""
    import torch
    import torch.nn.functional as F

    free_memory()
    started = time.perf_counter()
    model, args = build_trained_model(config, size, device, compiled, float8)
    fused = device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab_size, (size.batch, size.seq_len + 1), generator=gen).to(device)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    depths = model.recurrence.depth_sampler.history if model.recurrence is not None else None

    def step():
        optimizer.zero_grad(set_to_none=True)
        # No autocast weight cache: AC's recomputation (outside this context) must cast again.
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, cache_enabled=False):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(size.warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - started
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    graphs_before = compiled_graphs()
    if depths is not None:
        depths.clear()
    start = time.perf_counter()
    for _ in range(size.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - start
    sampled = list(depths) if depths is not None else []
    if sampled:
        flops = sum(args.train_flops_per_token(size.seq_len, r) for r in sampled)
    else:
        flops = size.steps * args.expected_train_flops_per_token(size.seq_len)
    flops *= size.batch * size.seq_len
    result = {
        "config": config,
        "compiled": compiled,
        "float8": float8,
        "tokens_per_s": size.steps * size.batch * size.seq_len / seconds,
        "tflops": flops / seconds / 1e12,
        "sampled_r": sampled,
        "recompiles_after_warmup": compiled_graphs() - graphs_before,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "loss": loss.item(),
        "warmup_s": warmup_s,
    }
    return result


def free_memory() -> None:
    """Drop the last run's model and optimizer before the next one's peak is measured."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_flops(device: str) -> float | None:
    import torch

    if not device.startswith("cuda"):
        return None
    from torchtitan.tools.utils import get_peak_flops

    return get_peak_flops(torch.cuda.get_device_name())


def part_train(size: SuiteSize, device: str) -> dict:
    peak = peak_flops(device)
    rows = []
    for label, grt, dense in size.train_pairs:
        runs = {
            (model, mode): train_run(config, size, device, mode == "compiled")
            for mode in ("compiled", "eager")
            for model, config in (("grt", grt), ("dense", dense))
        }
        g, d = runs[("grt", "compiled")], runs[("dense", "compiled")]
        rows.append(
            {
                "size": label,
                "grt_mfu": g["tflops"] * 1e12 / peak if peak else None,
                "dense_mfu": d["tflops"] * 1e12 / peak if peak else None,
                "mfu_ratio": g["tflops"] / d["tflops"],
                "compiled_over_eager_grt": g["tokens_per_s"] / runs[("grt", "eager")]["tokens_per_s"],
                "compiled_over_eager_dense": d["tokens_per_s"] / runs[("dense", "eager")]["tokens_per_s"],
                "peak_memory_ratio": g["peak_gib"] / d["peak_gib"] if g["peak_gib"] else None,
                "recompiles_after_warmup": g["recompiles_after_warmup"] + d["recompiles_after_warmup"],
                "runs": [{"model": k[0], "mode": k[1], **v} for k, v in runs.items()],
            }
        )
    return {"peak_tflops": peak / 1e12 if peak else None, "rows": rows}


def part_float8(size: SuiteSize, device: str) -> dict:
    rows = []
    sizes = [(label, grt) for label, grt, _ in size.train_pairs] + [size.wide]
    for label, config in dict(sizes).items():  # --cpu-smoke: the wide run is the debug one
        bf16 = train_run(config, size, device, compiled=True)
        fp8 = train_run(config, size, device, compiled=True, float8=True)
        rows.append(
            {
                "size": label,
                "config": config,
                "float8_over_bf16": fp8["tokens_per_s"] / bf16["tokens_per_s"],
                "bf16": bf16,
                "float8": fp8,
            }
        )
    return {"rows": rows}


# ---- generation (benchmarks/generate_bench.py) ------------------------------------------


def part_generate(size: SuiteSize, device: str) -> dict:
    import generate_bench as gb
    import torch

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32

    @dataclasses.dataclass
    class Opts:  # the fields generate_bench.measure reads
        device: str
        prompt: int
        new_tokens: int
        warmup: int
        repeats: int
        compile_backend: str

    models = {
        "dense": gb.build_model(generation_args(size.gen_dense, size), dtype, device),
        "grt": gb.build_model(generation_args(size.gen_grt, size), dtype, device),
    }
    latency = {}
    opts = Opts(device, size.gen_prompt, size.gen_new_tokens, 1, size.gen_repeats, size.compile_backend)
    for mode in ("eager", "compiled"):
        for name, model in models.items():
            r = gb.measure(model, "per_step", mode == "compiled", opts, size.gen_batch)
            latency[(name, mode)] = {k: v for k, v in r.items() if k != "tokens"}
    rows = {
        f"{mode}_latency_ratio": latency[("grt", mode)]["latency_s"] / latency[("dense", mode)]["latency_s"]
        for mode in ("eager", "compiled")
    }
    peaks = {name: latency[(name, "eager")].get("peak_bytes") for name in models}
    rows["eager_peak_memory_ratio"] = peaks["grt"] / peaks["dense"] if peaks["dense"] else None
    memory = []
    once = dataclasses.replace(opts, warmup=0, repeats=1)
    for batch in size.gen_memory_batches:
        dense = gb.measure(models["dense"], "per_step", False, once, batch)
        dense_total = dense["weights_bytes"] + dense["kv_bytes"]
        for strategy in gb.STRATEGIES:
            r = gb.measure(models["grt"], strategy, False, once, batch)
            total = r["weights_bytes"] + r["kv_bytes"]
            memory.append(
                {
                    "batch": batch,
                    "strategy": strategy,
                    "grt_mib": total / 2**20,
                    "dense_mib": dense_total / 2**20,
                    "ratio": total / dense_total,
                    "peak_ratio": r["peak_bytes"] / dense["peak_bytes"] if "peak_bytes" in r else None,
                }
            )
    return {
        "grt": size.gen_grt,
        "dense": size.gen_dense,
        "batch": size.gen_batch,
        "prompt": size.gen_prompt,
        "new_tokens": size.gen_new_tokens,
        **rows,
        "latency": [{"model": k[0], "mode": k[1], **v} for k, v in latency.items()],
        "memory": memory,
    }


# ---- per-token halting's decode cost (benchmarks/halting_bench.py measures its saving) ---


def part_halting(size: SuiteSize, device: str) -> dict:
    """Each halting rule's decode latency against fixed r = R eager, at the threshold where no
    token halts (every token runs R steps, as the fixed decode): what the rule itself costs,
    its measure after each step and the host-side exit check that a compiled step cannot
    take (docs/generation.md). What a rule saves needs a trained model: halting_bench.py."""
    import generate_bench as gb
    import torch

    from grt_titan.model.halting.rules import HALTING_RULES

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = gb.build_model(generation_args(size.gen_grt, size), dtype, device)
    opts = SimpleNamespace(
        device=device, prompt=size.gen_prompt, new_tokens=size.gen_new_tokens, warmup=1, repeats=size.gen_repeats
    )
    fixed = gb.measure(model, "per_step", False, opts, size.gen_batch)
    rows = []
    for rule in HALTING_RULES:
        never = {"halting": rule, "halting_threshold": float("inf") if rule == "argmax" else 0.0}
        r = gb.measure(model, "per_step", False, opts, size.gen_batch, halting=never)
        # Every token ran R steps. Not the tokens' equality: bf16 kernels differ between the two
        # paths, and a random model's near-tied logits flip (2026-12-04, H200: the state rule).
        depth = model.config.eval_depth
        assert r["depth_range"] == (depth, depth), f"{rule} at {never['halting_threshold']}: depths {r['depth_range']}"
        rows.append(
            {"rule": rule, "latency_s": r["latency_s"], "over_fixed_eager": r["latency_s"] / fixed["latency_s"]}
        )
    del model
    free_memory()
    return {
        "grt": size.gen_grt,
        "batch": size.gen_batch,
        "prompt": size.gen_prompt,
        "new_tokens": size.gen_new_tokens,
        "fixed_eager_s": fixed["latency_s"],
        "rules": rows,
    }


PARTS = {"train": part_train, "float8": part_float8, "generate": part_generate, "halting": part_halting}


# ---- plan, table -----------------------------------------------------------------------


def plan(size: SuiteSize) -> list[tuple[str, int, float]]:
    """(part, compiled models, compute seconds at 30% of an H200's bf16 peak) per part."""
    from grt_titan.model import grt_flavors
    from grt_titan.model.halting.rules import HALTING_RULES

    def flavor(config: str):
        import tomllib

        with open(REPO / "train_configs" / f"{config}.toml", "rb") as f:
            return grt_flavors[tomllib.load(f)["model"]["flavor"]]

    tokens = size.batch * size.seq_len * (size.warmup + size.steps)
    rate = 0.3 * H200_BF16_PEAK

    def seconds(configs, runs_each):
        return sum(runs_each * tokens * flavor(c).expected_train_flops_per_token(size.seq_len) / rate for c in configs)

    train_configs = [c for _, g, d in size.train_pairs for c in (g, d)]
    float8_configs = [g for _, g, _ in size.train_pairs] + [size.wide[1]] * 2  # bf16 reused but the wide one
    gen = grt_flavors[size.gen_grt]
    gen_tokens = size.gen_batch * (size.gen_prompt + size.gen_new_tokens) * (2 + 2 * size.gen_repeats)
    return [
        ("train", len(train_configs), seconds(train_configs, 2)),
        ("float8", len(float8_configs), seconds(float8_configs, 1)),
        ("generate", 2, 2 * gen_tokens * gen.forward_flops_per_token(size.gen_prompt) / rate),
        # fixed eager and one run per rule, no compile (the per-step host sync is the cost)
        ("halting", 0, (1 + len(HALTING_RULES)) * gen_tokens / 2 * gen.forward_flops_per_token(size.gen_prompt) / rate),
    ]


def fmt(value, spec=".3f") -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict) -> str:
    lines = ["| figure | size | result | goal / reference |", "|---|---|---|---|"]
    measured = {k: v for k, v in results.items() if isinstance(v, dict) and not {"skipped", "failed"} & set(v)}
    for row in measured.get("train", {}).get("rows", []):
        s = row["size"]
        lines += [
            f"| MFU GRT / dense (compile + op SAC, bf16, sampled r) | {s} | {fmt(row['mfu_ratio'])} "
            f"(GRT {fmt(row['grt_mfu'], '.1%')}, dense {fmt(row['dense_mfu'], '.1%')}) | >= 0.98 |",
            f"| recompiles after warm-up | {s} | {row['recompiles_after_warmup']} | 0 |",
            f"| compiled / eager tokens/s, GRT | {s} | {fmt(row['compiled_over_eager_grt'])} | llama: 1.157 |",
            f"| compiled / eager tokens/s, dense | {s} | {fmt(row['compiled_over_eager_dense'])} | llama: 1.157 |",
            f"| peak training memory GRT / dense, equal tokens | {s} | {fmt(row['peak_memory_ratio'])} | |",
        ]
    for row in measured.get("float8", {}).get("rows", []):
        lines.append(
            f"| float8 / bf16 tokens/s, GRT | {row['size']} | {fmt(row['float8_over_bf16'])} | llama 8B: 1.28 |"
        )
    gen = measured.get("generate")
    if gen:
        s = f"{gen['grt']} vs {gen['dense']}"
        lines += [
            f"| generation latency GRT / dense, compiled | {s} | {fmt(gen['compiled_latency_ratio'])} | paper: 1.10 |",
            f"| generation latency GRT / dense, eager | {s} | {fmt(gen['eager_latency_ratio'])} | paper: 1.23 |",
            f"| generation peak memory GRT / dense | {s} | {fmt(gen['eager_peak_memory_ratio'])} | paper: 0.41 |",
        ]
        paper = {"per_step": "0.91 (naive)", "average": "0.39"}
        for m in gen["memory"]:
            lines.append(
                f"| decoding memory (weights + KV) GRT / dense, batch {m['batch']}, {m['strategy']} "
                f"| {s} | {fmt(m['ratio'])} | {paper.get(m['strategy'], '')} |"
            )
    halting = measured.get("halting")
    if halting:
        compiled = next(
            (r["latency_s"] for r in (gen or {}).get("latency", []) if (r["model"], r["mode"]) == ("grt", "compiled")),
            None,
        )
        s = f"{halting['grt']}, batch {halting['batch']}"
        for row in halting["rules"]:
            lines.append(
                f"| halting decode latency / fixed r = R eager, {row['rule']} never halting (its own cost) "
                f"| {s} | {fmt(row['over_fixed_eager'])} (/ fixed compiled: "
                f"{fmt(row['latency_s'] / compiled if compiled else None)}) | CPU, grt_debug: docs/results/halting.md |"
            )
    for name, value in results.items():
        for outcome in ("skipped", "failed"):
            if isinstance(value, dict) and outcome in value:
                lines.append(f"| {name} | | {outcome}: {value[outcome]} | |")
    return "\n".join(lines)


def environment(device: str) -> dict:
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="debug size on CPU, the same parts (CI)")
    p.add_argument("--plan", action="store_true", help="print the time estimate per part and exit")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip the parts that would start later than this (default: 300 on a GPU, none with --cpu-smoke)",
    )
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "gpu_suite", help="results.json goes here")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="compile cache (default: OUT/compile_cache), reused by the next run",
    )
    opts = p.parse_args(argv)
    size = CPU_SMOKE if opts.cpu_smoke else GPU
    budget = opts.budget_s if opts.budget_s is not None else (float("inf") if opts.cpu_smoke else 300.0)
    parts = [x for x in opts.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts {', '.join(unknown)}: unknown; allowed: {', '.join(PARTS)}")
    if opts.plan:
        print("| part | compiled models | compute s (30% of H200 bf16 peak) | budget s (+ cold compiles) |")
        print("|---|---|---|---|")
        total = 0.0
        for name, compiles, compute in plan(size):
            total += compute + compiles * COMPILE_S[name]
            print(f"| {name} | {compiles} | {compute:.1f} | {compute + compiles * COMPILE_S[name]:.0f} |")
        print(f"| total | | | {total:.0f} |")
        return 0

    cache = opts.cache_dir or opts.out / "compile_cache"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    import torch

    importlib.import_module("grt_titan")  # registers the spec and its job config

    if not opts.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --cpu-smoke")
    device = "cpu" if opts.cpu_smoke else "cuda"
    opts.out.mkdir(parents=True, exist_ok=True)
    out_file = opts.out / "results.json"
    results = {"environment": environment(device), "cpu_smoke": opts.cpu_smoke, "seconds": {}}
    start = time.perf_counter()
    for name in parts:
        elapsed = time.perf_counter() - start
        if elapsed > budget:
            results[name] = {"skipped": f"{elapsed:.0f} s spent, over --budget-s {budget:.0f}"}
        else:
            part_start = time.perf_counter()
            try:
                results[name] = PARTS[name](size, device)
            except Exception as error:  # one part's defect costs the GPU window nothing more
                traceback.print_exc()
                results[name] = {"failed": f"{type(error).__name__}: {error}"}
                free_memory()
            results["seconds"][name] = round(time.perf_counter() - part_start, 1)
            print(f"[suite] {name}: {results['seconds'][name]:.1f} s", flush=True)
        out_file.write_text(json.dumps(results, indent=1))
    results["seconds"]["total"] = round(time.perf_counter() - start, 1)
    out_file.write_text(json.dumps(results, indent=1))
    env = results["environment"]
    print(f"\n# GPU suite {env['date']} | {env['device']} | torch {env['torch']} | CUDA {env['cuda']}\n")
    print(table(results))
    print("\nseconds per part: " + ", ".join(f"{k} {v:.1f}" for k, v in results["seconds"].items()))
    print(f"results: {out_file}")
    failed = [name for name in parts if "failed" in results[name]]
    if failed:
        print(f"failed parts: {', '.join(failed)} (their errors are in the table and the JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
