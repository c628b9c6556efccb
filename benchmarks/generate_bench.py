"""Generation latency and memory of a GRT vs its dense isoFLOP twin (paper tables 3 and 4).

Both models are the exported transformers model (grt_titan/hf/remote/modeling_grt.py) with
random weights (timing and memory do not depend on the values), greedy decoding of
`--new-tokens` after a `--prompt`-token prefill, per KV-cache strategy:

- eager:    growing (concatenating) GRTCache, plain PyTorch.
- compiled: static GRTCache (preallocated buffers written in place) and the one-token
            decode step under torch.compile (mode "reduce-overhead", i.e. CUDA graphs, on
            GPU; inductor's default mode on CPU). The prefill runs eager.

Memory: "weights+KV" is exact bytes (parameters + the growing cache after the last
token); on CUDA "peak" is torch.cuda.max_memory_allocated over the run less what was held
before it (the other model), plus this model's weights: weights, cache, activations, logits. `--memory-batch` repeats the eager run at that batch size for the
memory table (the paper's goal: `average` <= 0.45 x dense at batch 32).

Paper setting on one GPU (large vs dense_large, batch 4, prompt 1024, 128 new tokens):

    python benchmarks/generate_bench.py --grt large --dense dense_large --device cuda \\
        --dtype bfloat16 --batch 4 --prompt 1024 --new-tokens 128 --memory-batch 32

The issue's setting (batch 4, prompt 256, 64 new tokens) is the default.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grt_titan.runtime.quiet_imports import quiet_torchao_import  # noqa: E402

quiet_torchao_import()  # before transformers imports torchao (grt_titan/runtime/quiet_imports.py)

from grt_titan.analysis.decode import Generator  # noqa: E402
from grt_titan.hf.convert import build_hf_config  # noqa: E402
from grt_titan.hf.remote.modeling_grt import GRTForCausalLM  # noqa: E402
from grt_titan.model import grt_flavors  # noqa: E402
from grt_titan.model.args import GRTModelArgs  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STRATEGIES = ("per_step", "first", "last", "average")


def build_model(args: GRTModelArgs, dtype: torch.dtype, device: str) -> GRTForCausalLM:
    config = build_hf_config(args)
    torch.manual_seed(0)
    with torch.device(device):
        model = GRTForCausalLM(config)
    return model.to(dtype).eval()


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied weight once


def measure(model, strategy, compiled, opts, batch, halting: dict | None = None) -> dict:
    ids = torch.randint(
        0, model.config.vocab_size, (batch, opts.prompt), generator=torch.Generator().manual_seed(0)
    ).to(opts.device)
    cuda = opts.device.startswith("cuda")
    # Memory held before this run (every model's weights, earlier CUDA graph pools) is not its own.
    held = torch.cuda.memory_allocated() if cuda else 0
    gen = Generator(
        model,
        strategy,
        compiled,
        batch,
        opts.prompt,
        opts.new_tokens,
        opts.device,
        getattr(opts, "compile_backend", "inductor"),
        halting,
    )
    warmup_start = time.perf_counter()
    for _ in range(opts.warmup + (1 if compiled else 0)):
        gen.run(ids)
    warmup = time.perf_counter() - warmup_start
    if opts.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(opts.repeats):
        tokens, seconds = gen.run(ids)
        times.append(seconds)
    # The minimum: on a shared machine the noise only ever adds time.
    latency = min(times)
    result = {
        "tokens": tokens.cpu(),
        "latency_s": latency,
        "median_s": statistics.median(times),
        "ms_per_token": 1e3 * latency / opts.new_tokens,
        "warmup_s": warmup,
        "weights_bytes": weight_bytes(model),
        "kv_bytes": gen.cache.nbytes(),
    }
    if gen.depths:  # the depth range the halting rule gave the last run's tokens
        depths = torch.cat([d.flatten() for d in gen.depths])
        result["depth_range"] = (int(depths.min()), int(depths.max()))
    if cuda:  # this model's weights + cache + activations + logits at their peak
        result["peak_bytes"] = torch.cuda.max_memory_allocated() - held + weight_bytes(model)
    return result


def predicted_bytes(args: GRTModelArgs, strategy: str, batch: int, tokens: int, dtype_bytes: int) -> tuple[int, int]:
    """(weights, KV) bytes from the parameter count and GRTCache's documented formula."""
    with torch.device("meta"):
        weights = weight_bytes(GRTForCausalLM(build_hf_config(args))) // 4 * dtype_bytes
    depth = 0
    if args.is_recurrent:
        depth = args.eval_depth
    core = args.n_core_layers * (depth if strategy == "per_step" else 1)
    layers = args.n_prelude_layers + core + args.n_coda_layers
    kv_heads = args.n_kv_heads or args.n_heads
    return weights, 2 * batch * tokens * kv_heads * args.head_dim * dtype_bytes * layers


PAPER_PAIRS = (("small", "dense_small"), ("medium", "dense_medium"), ("large", "dense_large"))


def print_predicted_memory(batch: int, tokens: int, strategies) -> None:
    print(
        f"\nPredicted decoding memory of the paper's models (bf16 weights + KV, batch {batch}, "
        f"{tokens} cached tokens; formula checked against measured caches in tests/hf):\n"
    )
    print("| GRT | KV strategy | GRT GiB | dense twin GiB | GRT / dense |")
    print("|---|---|---|---|---|")
    for grt, dense in PAPER_PAIRS:
        d_w, d_kv = predicted_bytes(grt_flavors[dense], "per_step", batch, tokens, 2)
        for strategy in strategies:
            g_w, g_kv = predicted_bytes(grt_flavors[grt], strategy, batch, tokens, 2)
            print(
                f"| {grt} ({layout(grt_flavors[grt])}) | {strategy} | {(g_w + g_kv) / 2**30:.2f} | "
                f"{(d_w + d_kv) / 2**30:.2f} | {(g_w + g_kv) / (d_w + d_kv):.2f}x |"
            )


def layout(args: GRTModelArgs) -> str:
    if not args.is_recurrent:
        return f"dense {args.n_prelude_layers + args.n_coda_layers}"
    return f"{args.n_prelude_layers}+{args.n_core_layers}x{args.num_recurrences}+{args.n_coda_layers}"


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grt", default="small", help="GRT flavor (grt_flavors)")
    p.add_argument("--dense", default="dense_small", help="its dense isoFLOP twin")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--memory-batch", type=int, default=32, help="batch of the memory table (0: skip)")
    p.add_argument(
        "--predict-tokens",
        type=int,
        default=256 + 64 - 1,
        help="cached tokens of the predicted-memory table (default: prompt 256 + 64 new)",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on CPU")
    p.add_argument("--json", default=None, help="also write the results here")
    opts = p.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    dtype = DTYPES[opts.dtype or ("bfloat16" if opts.device.startswith("cuda") else "float32")]
    strategies = [s for s in opts.strategies.split(",") if s]
    modes = [m for m in opts.modes.split(",") if m]

    grt_args, dense_args = grt_flavors[opts.grt], grt_flavors[opts.dense]
    max_len = opts.prompt + opts.new_tokens
    for a in (grt_args, dense_args):
        if a.block_style == "gpt2" and max_len > a.max_seq_len:
            raise SystemExit(f"prompt + new tokens = {max_len} > max_seq_len {a.max_seq_len}")
    device_name = (
        torch.cuda.get_device_name()
        if opts.device.startswith("cuda")
        else (f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    )
    print(f"# generate_bench {datetime.date.today()} | {device_name} | torch {torch.__version__} | {dtype}")
    print(f"# command: python benchmarks/generate_bench.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"# GRT {opts.grt} ({layout(grt_args)}, d={grt_args.dim}) vs {opts.dense} "
        f"({layout(dense_args)}, d={dense_args.dim}); batch {opts.batch}, prompt {opts.prompt}, "
        f"{opts.new_tokens} new tokens, greedy"
    )

    rows = []
    models = {"dense": build_model(dense_args, dtype, opts.device), "grt": build_model(grt_args, dtype, opts.device)}
    for mode in modes:
        compiled = mode == "compiled"
        for name, model in models.items():
            for strategy in strategies if name == "grt" else ["per_step"]:
                r = measure(model, strategy, compiled, opts, opts.batch)
                r.update(model=name, strategy=strategy if name == "grt" else "-", mode=mode)
                rows.append(r)

    dense_latency = {r["mode"]: r["latency_s"] for r in rows if r["model"] == "dense"}
    eager_tokens = {(r["model"], r["strategy"]): r["tokens"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        ref = eager_tokens.get((r["model"], r["strategy"]))
        r["same_tokens_as_eager"] = (
            "-" if ref is None or r["mode"] == "eager" else ("yes" if torch.equal(ref, r["tokens"]) else "no")
        )
    header = (
        "| model | KV strategy | mode | latency (s) | ms/token | vs dense | weights MiB | KV MiB | = eager tokens |"
    )
    header += " peak MiB |" if opts.device.startswith("cuda") else ""
    print(f"\nLatency (batch {opts.batch}; min of {opts.repeats} runs):\n")
    print(header)
    print("|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|")
    for r in rows:
        line = (
            f"| {r['model']} | {r['strategy']} | {r['mode']} | {r['latency_s']:.3f} | {r['ms_per_token']:.2f} | "
            f"{r['latency_s'] / dense_latency[r['mode']]:.2f}x | {mib(r['weights_bytes'])} | {mib(r['kv_bytes'])} | "
            f"{r['same_tokens_as_eager']} |"
        )
        if opts.device.startswith("cuda"):
            line += f" {mib(r.get('peak_bytes'))} |"
        print(line)
    compile_rows = [r for r in rows if r["mode"] == "compiled"]
    if compile_rows:
        print(
            "\n(compiled warm-up incl. compilation: "
            + ", ".join(f"{r['model']}/{r['strategy']} {r['warmup_s']:.0f}s" for r in compile_rows)
            + ")"
        )

    memory = []
    if opts.memory_batch:

        class MemOpts:  # one eager run at the memory batch
            device, prompt, new_tokens, warmup, repeats = opts.device, opts.prompt, opts.new_tokens, 0, 1

        for name, model in models.items():
            for strategy in strategies if name == "grt" else ["per_step"]:
                r = measure(model, strategy, False, MemOpts, opts.memory_batch)
                r.update(model=name, strategy=strategy if name == "grt" else "-")
                r["total_bytes"] = r["weights_bytes"] + r["kv_bytes"]
                memory.append(r)
        dense_total = next(r["total_bytes"] for r in memory if r["model"] == "dense")
        dense_peak = next((r.get("peak_bytes") for r in memory if r["model"] == "dense"), None)
        print(f"\nDecoding memory (batch {opts.memory_batch}, {max_len - 1} cached tokens):\n")
        head = "| model | KV strategy | weights MiB | KV MiB | weights+KV MiB | vs dense |"
        head += " peak MiB | peak vs dense |" if dense_peak else ""
        print(head)
        print("|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|")
        for r in memory:
            line = (
                f"| {r['model']} | {r['strategy']} | {mib(r['weights_bytes'])} | {mib(r['kv_bytes'])} | "
                f"{mib(r['total_bytes'])} | {r['total_bytes'] / dense_total:.2f}x |"
            )
            if dense_peak:
                line += f" {mib(r['peak_bytes'])} | {r['peak_bytes'] / dense_peak:.2f}x |"
            print(line)
    if opts.memory_batch:
        print_predicted_memory(opts.memory_batch, opts.predict_tokens, strategies)
    if opts.json:
        strip = lambda rs: [{k: v for k, v in r.items() if k != "tokens"} for r in rs]  # noqa: E731
        Path(opts.json).write_text(json.dumps({"latency": strip(rows), "memory": strip(memory)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
