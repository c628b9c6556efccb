"""Per-token halting: the forward FLOPs each rule saves at the fixed depth's loss, and what it
does to decode latency (docs/results/halting.md; docs/generation.md).

1. A GRT trained here: grt_debug's recipe (train_configs/grt_debug.toml: 1 + 2x4 + 1, d = 128,
   R = 4, the embedded corpus) for `--train-steps` steps on 2 CPU ranks (`--train-args` adds
   to its command), saved at the last step into `--run` (skipped when `--run` already holds a
   checkpoint). `--config` scores another run instead: its training TOML, with `--run` its
   dump folder (e.g. a healed retrofit of benchmarks/retrofit_real.py).
2. On `--sequences` validation sequences: the loss at every fixed depth r = 0..b (figure 3's
   curve, `DepthAnalysis`) and each halting rule's threshold sweep (`HaltingSweep`: loss
   against the mean forward FLOPs per token at the depths the tokens used), b = R, a = 1.
3. Per rule: the cheapest swept point whose loss is within `--loss-tolerance` (relative) of
   the fixed depth R's, and the forward FLOPs per token it saves against r = R; and every
   swept point against early exit at a fixed depth reaching the same loss (figure 3's curve,
   FLOPs interpolated between neighbouring depths): what halting per token adds over a
   smaller r for every token. Huginn's
   continuous compute (a token's recurrence starts from the previous token's final state) at
   r = 1 and R on `--continuous-sequences` sequences, against the fixed depth on the same.
4. Decode (the exported transformers model, batch 1, greedy, `--new-tokens` after a
   `--prompt`-token prefill, benchmarks/generate_bench.py's `Generator`): wall time of fixed
   r = R eager, fixed r = R compiled (static cache, one compiled decode step), and each rule
   eager at that point's threshold; repeats interleaved, the minimum of each kept (noise only adds).
   Halting decodes eagerly: a token's exit is a host-side decision after each step, which a
   single compiled (or CUDA-graph) decode step cannot make without running every step.

    python benchmarks/halting_bench.py --run outputs/halting_bench --train-steps 900
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from grt_titan.runtime.quiet_imports import quiet_torchao_import  # noqa: E402

quiet_torchao_import()  # before transformers imports torchao (grt_titan/runtime/quiet_imports.py)

CONFIG = REPO / "train_configs" / "grt_debug.toml"


def train_command(run: Path, steps: int, extra: list[str], config: Path = CONFIG) -> list[str]:
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"),
        *("-m", "grt_titan.train", "--job.config_file", str(config)),
        *("--training.steps", str(steps), "--validation.no-enable", "--metrics.log_freq", "25"),
        *("--checkpoint.enable", "--checkpoint.interval", str(steps), "--job.dump_folder", str(run)),
        *extra,
    ]


def ensure_trained(run: Path, steps: int, extra: list[str], config: Path = CONFIG) -> Path:
    checkpoint = run / "checkpoint"
    if not any(checkpoint.glob("step-*")):
        command = train_command(run, steps, extra, config)
        print("training:", " ".join(command), flush=True)
        run.mkdir(parents=True, exist_ok=True)
        with open(run / "train.log", "w") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    return checkpoint


def validation_dataset(loaded, seq_len: int):
    from grt_titan.data.loader import TokenSequenceDataset, data_config, open_dataset_split

    job = loaded.job_config
    stream = open_dataset_split(
        job.validation.dataset, job.validation.dataset_path, "val", loaded.tokenizer, data_config(job), "halting"
    )
    return TokenSequenceDataset(stream, seq_len, dp_rank=0, dp_world_size=1, seed=0, shuffle=False)


def continuous_compute_loss(model, inputs: torch.Tensor, labels: torch.Tensor, depth: int, carry: bool = True):
    """(summed loss, tokens) at fixed depth `depth` with Huginn's continuous compute: token t's
    recurrence starts from token t - 1's final state instead of h_0 = its prelude output (the
    first token from its own), as a decoder that carries the state would compute it. Position
    by position: token t's final state depends on tokens <= t only (causal), so pass t runs
    the prefix 0..t with the starts fixed so far. `carry=False` starts every token from its
    own h_0: the fixed-depth forward (the check that this loop is that forward)."""
    import torch.nn.functional as F

    h_pre = model.prelude(model.embed(inputs), model.freqs_cis)
    start, final = h_pre.clone(), torch.empty_like(h_pre)
    for t in range(inputs.shape[1]):
        h = start[:, : t + 1]
        for _ in range(depth):
            h = model.recurrence.step(h, h_pre[:, : t + 1], model.freqs_cis)
        final[:, t] = h[:, t]
        if carry and t + 1 < inputs.shape[1]:
            start[:, t + 1] = h[:, t]
    logp = F.log_softmax(model.logits_from_state(final).float(), dim=-1)
    loss = F.nll_loss(logp.reshape(-1, logp.shape[-1]), labels.reshape(-1), reduction="sum").item()
    return loss, labels.numel()


def cheapest_within(rule: dict, target: float) -> int | None:
    """Index of the rule's swept point with the fewest FLOPs whose loss <= target."""
    ok = [i for i, loss in enumerate(rule["loss"]) if loss <= target]
    return min(ok, key=lambda i: rule["forward_flops_per_token"][i]) if ok else None


def export(model, args, folder: Path):
    from grt_titan.hf.convert import write_hf_folder
    from grt_titan.hf.remote.modeling_grt import GRTForCausalLM

    if not folder.exists():
        write_hf_folder(folder, model.state_dict(), args, write_tokenizer=False)
    return GRTForCausalLM.from_pretrained(folder).eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=REPO / "outputs" / "halting_bench")
    parser.add_argument("--train-steps", type=int, default=900)
    parser.add_argument(
        "--train-args",
        default="",
        help="torchtitan arguments added to the training run, as --train-args='--grt.min_recurrences 4' (every step at R)",
    )
    parser.add_argument("--sequences", type=int, default=32, help="validation sequences scored")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--loss-tolerance", type=float, default=0.0, help="relative, against fixed r = R")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compiled", action="store_true", help="skip the compiled fixed-depth decode")
    parser.add_argument(
        "--continuous-sequences", type=int, default=8, help="validation sequences scored with continuous compute"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--config", type=Path, default=CONFIG, help="the run's training TOML (default grt_debug's)")
    opts = parser.parse_args()
    torch.set_grad_enabled(False)

    from grt_titan.analysis.diagnostics import DepthAnalysis, HaltingSweep, batches
    from grt_titan.analysis.load import load_model

    checkpoint = ensure_trained(opts.run, opts.train_steps, shlex.split(opts.train_args), opts.config)
    loaded = load_model(checkpoint, opts.config)
    model, args = loaded.model, loaded.args
    depth = args.num_recurrences
    dataset = validation_dataset(loaded, opts.seq_len)

    start = time.perf_counter()
    fixed = DepthAnalysis(max_depth=depth, final_depth=depth)
    sweep = HaltingSweep(min_depth=1, max_depth=depth)
    sweep.skip(model)
    for inputs, labels in batches(dataset, opts.sequences, opts.batch_size):
        fixed.add_batch(model, inputs, labels)
        sweep.add_batch(model, inputs, labels)
    fixed_loss = fixed.result()["loss"]
    curves = sweep.result(args, opts.seq_len, fixed_loss=fixed_loss)
    scoring_s = time.perf_counter() - start
    flops = [args.forward_flops_per_token(opts.seq_len, r) for r in range(depth + 1)]
    target = fixed_loss[depth] * (1 + opts.loss_tolerance)

    print(f"\n{loaded.source['path']} (step {loaded.source['step']}), {fixed.tokens} validation tokens")
    print("fixed depth: " + "  ".join(f"r={r}: {loss:.4f}" for r, loss in enumerate(fixed_loss)))
    print(
        f"\nAt the loss of r = R = {depth} ({fixed_loss[depth]:.4f}, within {opts.loss_tolerance:.1%}: "
        f"<= {target:.4f}), {flops[depth] / 1e6:.2f} MFLOPs per token:\n"
    )
    print("| rule | threshold | loss | mean depth | forward MFLOPs / token | saved |")
    print("|---|---|---|---|---|---|")
    chosen = {}
    for rule, curve in curves["rules"].items():
        i = cheapest_within(curve, target)
        if i is None:
            print(f"| {rule} | none within the tolerance | | | | |")
            continue
        chosen[rule] = curve["thresholds"][i]
        saved = 1 - curve["forward_flops_per_token"][i] / flops[depth]
        print(
            f"| {rule} | {curve['thresholds'][i]:g} | {curve['loss'][i]:.4f} | {curve['mean_depth'][i]:.2f} | "
            f"{curve['forward_flops_per_token'][i] / 1e6:.2f} | {saved:.1%} |"
        )
    for rule, reason in curves["skipped"].items():
        print(f"| {rule} | skipped: {reason} | | | | |")

    # Every swept point against early exit at a fixed depth (figure 3's curve) at its loss:
    # what halting per token saves over choosing a smaller r for every token.
    print("\nEach swept point against a fixed depth at the same loss (FLOPs interpolated between depths):\n")
    print("| rule | threshold | loss | mean depth | MFLOPs / token | fixed depth's MFLOPs | halting / fixed |")
    print("|---|---|---|---|---|---|---|")
    for rule, curve in curves["rules"].items():
        for x, loss, mean, cost, fixed_cost in zip(
            curve["thresholds"],
            curve["loss"],
            curve["mean_depth"],
            curve["forward_flops_per_token"],
            curve["fixed_depth_flops_per_token"],
        ):
            versus = "no fixed depth reaches it" if fixed_cost is None else f"{cost / fixed_cost:.3f}"
            shown = "" if fixed_cost is None else f"{fixed_cost / 1e6:.2f}"
            print(f"| {rule} | {x:g} | {loss:.4f} | {mean:.2f} | {cost / 1e6:.2f} | {shown} | {versus} |")

    # Huginn's continuous compute (each token starts from the previous token's final state),
    # at r = 1 and R, against the fixed depth on the same sequences.
    continuous = {"sequences": opts.continuous_sequences, "depths": [1, depth], "fixed": [], "continuous": []}
    same = DepthAnalysis(max_depth=depth, final_depth=depth)
    sums = [0.0, 0.0]
    for inputs, labels in batches(dataset, opts.continuous_sequences, opts.batch_size):
        same.add_batch(model, inputs, labels)
        for i, r in enumerate(continuous["depths"]):
            sums[i] += continuous_compute_loss(model, inputs, labels, r)[0]
    continuous["fixed"] = [same.result()["loss"][r] for r in continuous["depths"]]
    continuous["continuous"] = [total / same.tokens for total in sums]
    print(f"\nContinuous compute, {same.tokens} tokens (the first {opts.continuous_sequences} sequences):\n")
    print("| depth r | fixed (h_0 = prelude output) | continuous compute (h_0 = previous token's h_r) |")
    print("|---|---|---|")
    for r, a, b in zip(continuous["depths"], continuous["fixed"], continuous["continuous"]):
        print(f"| {r} | {a:.4f} | {b:.4f} |")

    hf = export(model, args, opts.run / "hf")
    ids = next(iter(batches(dataset, 1, 1)))[0][:, : opts.prompt]
    runs = {"fixed": {}} | {rule: {"halting": rule, "halting_threshold": x} for rule, x in chosen.items()}
    from generate_bench import measure

    from grt_titan.analysis.decode import Generator

    generators = {
        name: Generator(hf, "per_step", False, 1, opts.prompt, opts.new_tokens, "cpu", halting=halting)
        for name, halting in runs.items()
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(opts.repeats):
        for name, generator in generators.items():
            times[name].append(generator.run(ids)[1])
    best = {name: min(t) for name, t in times.items()}
    compiled = None
    if not opts.no_compiled:
        settings = SimpleNamespace(prompt=opts.prompt, new_tokens=opts.new_tokens, device="cpu", warmup=1)
        compiled = measure(hf, "per_step", True, SimpleNamespace(**vars(settings), repeats=opts.repeats), 1)
    print(f"\nDecode, batch 1, {opts.prompt}-token prompt, {opts.new_tokens} new tokens (eager, growing cache):\n")
    print("| decode | ms / token | / fixed r = R eager |")
    print("|---|---|---|")
    for name, seconds in best.items():
        label = "fixed r = R" if name == "fixed" else f"{name} at {runs[name]['halting_threshold']:g}"
        print(f"| {label} | {1e3 * seconds / opts.new_tokens:.1f} | {seconds / best['fixed']:.2f}x |")
    if compiled is not None:
        print(
            f"| fixed r = R compiled (static cache, inductor) | {compiled['ms_per_token']:.1f} | "
            f"{compiled['latency_s'] / best['fixed']:.2f}x |"
        )
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "source": loaded.source,
        "train_steps": opts.train_steps,
        "train_args": opts.train_args,
        "tokens_scored": fixed.tokens,
        "scoring_s": scoring_s,
        "fixed_loss": fixed_loss,
        "fixed_flops": flops,
        "halting": curves,
        "chosen_thresholds": chosen,
        "continuous_compute": continuous,
        "decode_s": best,
        "decode_compiled_s": None if compiled is None else compiled["latency_s"],
    }
    out = opts.json or opts.run / "halting_bench.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
