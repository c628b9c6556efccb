"""Retrofit at toy scale: train dense_debug, export it, retrofit it into a GRT and train that
beside a GRT of the same layout trained from scratch on the same tokens (docs/retrofit.md).

    python benchmarks/retrofit_bench.py                          # 400 dense + 200 GRT steps, ~10 min on 2 cores
    python benchmarks/retrofit_bench.py --dense-steps 40 --steps 20 --out /tmp/rb   # a smoke run

The pipeline, each stage a command a user would type:

1. `python -m grt_titan.train` on train_configs/dense_debug.toml for `--dense-steps` steps
   (sequence `--seq-len`, batch `--batch`), a checkpoint at the last step;
2. `grt-titan export-hf --format auto`: a stock GPT2LMHeadModel folder with the tokenizer;
3. `grt-titan retrofit` of that folder with grt_debug's layout, 1 + 2x4 + 1: prelude = source
   layer 0, core = layers 7-8, coda = layer 9, layers 1-6 dropped (McLeish et al.'s
   drop-the-middle split for a 10-layer source), R = 4; and a second retrofit that maps every
   layer (prelude 0, core 1-8, coda 9, R = 1), the case whose first loop is the dense model
   itself; both `--init first-loop` (FIRST_LOOP: the measurement predates `--init`);
4. one step of each retrofit at learning rate 0 with the noise off and validation at step 1:
   the retrofits' initial losses by depth on the validation sequences (weights unchanged);
5. `--steps` steps of the 1 + 2x4 + 1 retrofit from its written train.toml (its recipe: the
   grt_debug preset's with lr / 10);
6. `--steps` steps of a GRT of exactly that architecture (the same train.toml and
   model_args.json) from random weights, with grt_debug's recipe (lr 3e-3; the written args'
   gate_bias_init is the flavors' 4.0, the retrofit's closed gate being in its checkpoint),
   `[checkpoint]` off and no `initial_load_path`, so nothing is loaded. Same seed, same tokenizer (the export's), same
   data order as 5.

Every run is one process (gloo, `--threads` threads). Losses are parsed from the trainer's
log lines; each GRT run's sampled depth per step is read from its TensorBoard `grt/r_last`
(`--metrics.log_freq 1`), and the training FLOPs are `train_flops_per_token(S, r)` (the
model's count, grt_titan/model/flops.py) at each step's realised depth, times the step's
tokens, summed; the dense run's is its constant count times its tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# torchtitan's log lines (torchtitan/components/metrics.py, grt_titan/components/validate.py).
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.naninf]+)\s+grad_norm:")
VALIDATE_LINE = re.compile(r"validate step:\s*(\d+)\s+loss:\s*([0-9.naninf]+)")
DEPTH_LINE = re.compile(r"validate step\s+(\d+)\s+loss by depth r:\s*(.*)")

GRT_DEBUG = REPO / "train_configs" / "grt_debug.toml"
# The measurement in docs/results/retrofit_toy.md predates `--init` and the written TOML's healing recipe:
# it ran the first-loop init, with grt_debug's 10 warm-up steps and no depth curriculum.
FIRST_LOOP = ["--init", "first-loop"]
OLD_RECIPE = ["--grt.depth_curriculum_steps", "0", "--lr_scheduler.warmup_steps", "10"]
DENSE_DEBUG = REPO / "train_configs" / "dense_debug.toml"


def run(cmd: list[str], log: Path, threads: int, timeout: int = 1800) -> tuple[str, float]:
    """Run `cmd` from the repo root; its output goes to `log` and is returned. A failure
    raises with the output's tail (a failing stage is reported, never worked around)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    out = ANSI.sub("", proc.stdout + proc.stderr)
    log.write_text(out)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{out[-4000:]}")
    return out, seconds


def train_cmd(config: Path, dump: Path, args, steps: int, *extra: str) -> list[str]:
    s, b = str(args.seq_len), str(args.batch)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        "-m",
        "grt_titan.train",
        "--job.config_file",
        str(config),
        "--job.dump_folder",
        str(dump),
        "--training.dataset",
        "grt_default",
        "--training.steps",
        str(steps),
        "--training.seq_len",
        s,
        "--training.local_batch_size",
        b,
        "--training.global_batch_size",
        b,
        "--debug.seed",
        str(args.seed),
        "--compile.no-enable",
        "--metrics.enable-tensorboard",
        "--validation.enable",
        "--validation.dataset",
        "grt_default",
        "--validation.seq_len",
        s,
        "--validation.local_batch_size",
        b,
        "--validation.steps",
        str(args.val_steps),
        *extra,
    ]


def step_losses(out: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(out)}


def val_losses(out: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in VALIDATE_LINE.finditer(out)}


def depth_losses(out: str) -> dict[int, dict[int, float]]:
    """{step: {r: validation loss}} from the depth-wise validation lines."""
    found = {}
    for m in DEPTH_LINE.finditer(out):
        pairs = re.findall(r"(\d+):\s*([0-9.naninf]+)", m.group(2))
        found[int(m.group(1))] = {int(r): float(v) for r, v in pairs}
    return found


def tb_scalars(tb_root: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for folder in sorted({p.parent for p in tb_root.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 1})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values.update({e.step: e.value for e in acc.Scalars(tag)})
    return values


def training_flops(dump: Path, steps: int, tokens_per_step: int, seq_len: int) -> tuple[float, float | None]:
    """(training FLOPs of the run, mean sampled depth or None for a dense model)."""
    from grt_titan.run_record import model_args_from_record, read_run_record

    margs = model_args_from_record(read_run_record(dump), dump)
    if not margs.is_recurrent:
        return margs.train_flops_per_token(seq_len) * tokens_per_step * steps, None
    depths = tb_scalars(dump, "grt/r_last")
    missing = [s for s in range(1, steps + 1) if s not in depths]
    if missing:
        raise RuntimeError(f"{dump}: no grt/r_last logged at steps {missing[:5]}... (needs --metrics.log_freq 1)")
    total = sum(margs.train_flops_per_token(seq_len, depths[s]) for s in range(1, steps + 1))
    return total * tokens_per_step, sum(depths[s] for s in range(1, steps + 1)) / steps


def window_mean(losses: dict[int, float], step: int, width: int = 10) -> float:
    vals = [losses[s] for s in range(max(1, step - width + 1), step + 1) if s in losses]
    return sum(vals) / len(vals)


def checkpoints(steps: int, count: int = 5) -> list[int]:
    marks = sorted({1, *(round(steps * k / count) for k in range(1, count + 1))})
    return [m for m in marks if m >= 1]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `train_cmd` reads (sequence, batch, validation, seed)."""
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--val-steps", type=int, default=4, help="validation batches (the same sequences each time)")
    parser.add_argument("--val-every", type=int, default=None, help="validation interval (default: M / 5)")
    parser.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dense-steps", type=int, default=400, help="N: steps of dense_debug before the export")
    parser.add_argument("--steps", type=int, default=200, help="M: steps of the retrofit and of the scratch GRT")
    add_run_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir)")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="retrofit_bench_"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n, m = args.dense_steps, args.steps
    val_every = args.val_every or max(1, m // 5)
    tokens = args.seq_len * args.batch
    grt_debug = tomllib.loads(GRT_DEBUG.read_text())
    seconds: dict[str, float] = {}
    cli = [sys.executable, "-m", "grt_titan.cli"]
    print(f"work folder {out}; {tokens} tokens per step (batch {args.batch} x seq {args.seq_len})", flush=True)

    # 1. dense_debug, checkpoint at the last step.
    dense_dir = out / "dense"
    dense_out, seconds["dense"] = run(
        train_cmd(
            DENSE_DEBUG,
            dense_dir,
            args,
            n,
            "--checkpoint.enable",
            "--checkpoint.interval",
            str(n),
            "--checkpoint.folder",
            "checkpoint",
            "--validation.freq",
            str(n),
            "--metrics.log_freq",
            "1",
        ),
        out / "dense.log",
        args.threads,
    )
    dense_steps, dense_val = step_losses(dense_out), val_losses(dense_out)
    print(f"dense_debug: {n} steps in {seconds['dense']:.0f} s", flush=True)

    # 2. export as a stock GPT-2 folder.
    hf = out / "dense_hf"
    export_out, seconds["export"] = run(
        [
            *cli,
            "export-hf",
            "--checkpoint",
            str(dense_dir / "checkpoint"),
            "--config",
            str(DENSE_DEBUG),
            "--out",
            str(hf),
            "--format",
            "auto",
            "--overwrite",
        ],
        out / "export.log",
        args.threads,
    )
    model_type = json.loads((hf / "config.json").read_text()).get("model_type")
    exported = [line for line in export_out.splitlines() if line.startswith("exported ")]
    print(f"export-hf: {exported[-1] if exported else '?'} (config.json model_type {model_type})", flush=True)

    # 3. retrofits: grt_debug's layout (1 + 2x4 + 1) and every layer mapped (1 + 8x1 + 1).
    layouts = {
        "retrofit": ["--prelude", "1", "--core", "7:9", "--coda", "1", "--recurrences", "4", *FIRST_LOOP],
        "retrofit_all": ["--prelude", "1", "--core", "1:9", "--coda", "1", "--recurrences", "1", *FIRST_LOOP],
    }
    for name, split in layouts.items():
        _, seconds[f"grt-titan retrofit ({name})"] = run(
            [*cli, "retrofit", str(hf), "--out", str(out / name), "--overwrite", *split],
            out / f"{name}.log",
            args.threads,
        )
        record = json.loads((out / name / "retrofit.json").read_text())
        print(
            f"{name}: prelude {record['prelude']} core {record['core']} coda {record['coda']} "
            f"dropped {record['dropped']}",
            flush=True,
        )

    # 4. initial losses: one step at lr 0, no noise, validation at step 1 (weights unchanged).
    init: dict[str, dict[int, float]] = {}
    for name in layouts:
        init_out, seconds[f"{name} init"] = run(
            train_cmd(
                out / name / "train.toml",
                out / f"{name}_init",
                args,
                1,
                "--optimizer.lr",
                "0",
                "--lr_scheduler.warmup_steps",
                "1",
                "--grt.state_noise_std",
                "0",
                "--grt.gate_noise_std",
                "0",
                "--checkpoint.interval",
                "1000000",
                "--validation.freq",
                "1000000",
                "--metrics.log_freq",
                "1",
            ),
            out / f"{name}_init.log",
            args.threads,
        )
        # Full precision from TensorBoard (the log line rounds to 4 decimals).
        init[name] = {
            r: tb_scalars(out / f"{name}_init", f"validation_metrics/loss_r{r}")[1] for r in depth_losses(init_out)[1]
        }

    # 5. the retrofit, M steps from its train.toml; 6. the same architecture from scratch.
    common = ["--validation.freq", str(val_every), "--metrics.log_freq", "1", "--grt_metrics.no-enable", *OLD_RECIPE]
    runs = {
        "retrofit": [*common, "--checkpoint.interval", str(m)],
        "scratch": [
            *common,
            "--checkpoint.no-enable",
            "--checkpoint.initial_load_path",  # checkpointing off still loads it (docs/reliability.md)
            "",
            "--optimizer.lr",
            str(grt_debug["optimizer"]["lr"]),
        ],
    }
    results = {}
    for name, extra in runs.items():
        dump = out / f"{name}_run"
        text, seconds[name] = run(
            train_cmd(out / "retrofit" / "train.toml", dump, args, m, *extra), out / f"{name}_run.log", args.threads
        )
        flops, r_mean = training_flops(dump, m, tokens, args.seq_len)
        results[name] = {
            "steps": step_losses(text),
            "val": val_losses(text),
            "depth": depth_losses(text),
            "flops": flops,
            "r": r_mean,
        }
        print(f"{name}: {m} steps in {seconds[name]:.0f} s", flush=True)
    dense_flops, _ = training_flops(dense_dir, n, tokens, args.seq_len)
    dense_val_full = tb_scalars(dense_dir, "validation_metrics/loss")[n]

    # ---- report ---------------------------------------------------------------------------
    ret, scr = results["retrofit"], results["scratch"]
    print()
    print(
        f"dense_debug after {n} steps: train loss {dense_steps[n]:.4f} (mean of steps {max(1, n - 9)}-{n}: "
        f"{window_mean(dense_steps, n):.4f}), validation loss {dense_val[n]:.4f}"
    )

    def by_depth(losses: dict[int, float]) -> str:
        return "  ".join(f"r={r}: {v:.6f}" for r, v in sorted(losses.items()))

    print(f"dense_debug validation loss at step {n}, full precision: {dense_val_full:.6f}")
    print(
        f"retrofit_all (every layer mapped, R = 1) at init, validation loss by depth: {by_depth(init['retrofit_all'])}"
    )
    print(f"  r = 1 minus the dense model's validation loss: {init['retrofit_all'][1] - dense_val_full:+.2e}")
    print(f"retrofit (1 + 2x4 + 1, layers 1-6 dropped) at init, validation loss by depth: {by_depth(init['retrofit'])}")
    print(f"step-1 training loss (sampled r, noise on): retrofit {ret['steps'][1]:.4f}, scratch {scr['steps'][1]:.4f}")
    print()
    print(
        "| step | retrofit train loss (10-step mean) | scratch train loss (10-step mean) "
        "| retrofit val loss (r = 4) | scratch val loss (r = 4) | retrofit val r = 1 | scratch val r = 1 |"
    )
    print("|---|---|---|---|---|---|---|")
    marks = sorted(set(checkpoints(m)) | set(ret["val"]))
    for s in marks:
        cells = [
            window_mean(ret["steps"], s),
            window_mean(scr["steps"], s),
            ret["val"].get(s),
            scr["val"].get(s),
            ret["depth"].get(s, {}).get(1),
            scr["depth"].get(s, {}).get(1),
        ]
        print(f"| {s} | " + " | ".join("" if v is None else f"{v:.4f}" for v in cells) + " |")
    print()
    print("| run | steps | tokens | mean sampled r | training FLOPs (model count x tokens) |")
    print("|---|---|---|---|---|")
    print(f"| dense_debug | {n} | {n * tokens:,} | | {dense_flops:.3e} |")
    print(f"| retrofit | {m} | {m * tokens:,} | {ret['r']:.2f} | {ret['flops']:.3e} |")
    print(f"| retrofit incl. the dense run | {n + m} | {(n + m) * tokens:,} | | {dense_flops + ret['flops']:.3e} |")
    print(f"| scratch GRT | {m} | {m * tokens:,} | {scr['r']:.2f} | {scr['flops']:.3e} |")
    print()
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()) + f"; total {sum(seconds.values()):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
