"""Distillation at toy scale: train a dense_debug teacher, then train grt_debug twice on the
same tokens with the same seed, once distilled from the teacher and once without it
(docs/distillation.md).

    python benchmarks/distill_bench.py --out /tmp/distill_bench    # 250 teacher + 2 x 80 student steps, < 10 min on 2 cores
    python benchmarks/distill_bench.py --teacher-steps 10 --steps 16 --val-every 8 --out /tmp/db   # a smoke run

The pipeline, each stage a command a user would type:

1. `python -m grt_titan.train` on train_configs/dense_debug.toml for `--teacher-steps` steps
   (sequence `--seq-len`, batch `--batch`), a checkpoint at the last step: the teacher;
2. `--steps` steps of train_configs/grt_debug.toml without a teacher: the baseline;
3. the same `--steps` steps with `--distill.teacher <1's checkpoint> --distill.teacher_config
   train_configs/dense_debug.toml --distill.alpha A --distill.temperature T` (0.5 and 2, the
   setting docs/distillation.md shows).

2 and 3 have the same seed, tokens in the same order, the same sampled depths and noise (the
teacher draws no random numbers), and validate on the same sequences every `--val-every`
steps (default M / 5, and at step 1): `validation_metrics/loss`, the student's CE at its eval
depth r = 4 (what table 1 compares), and, in 3, `validation_metrics/distill_kd_loss` (T^2 KL
to the teacher per token). Per-depth validation and the gate statistics are off in both.

Step time: 2 and 3 run at the same time, so both see the same load from the rest of the
(shared) machine; torchtitan's `time_metrics/end_to_end(s)`, logged every step
(`--metrics.log_freq 1`; validation is outside it), over the steps after `--skip` that were
logged while both were training (from the later first step to the earlier last step), gives
the ratio 3 / 2 of the medians (and of the minima). The ratio is the figure, not the seconds.
The teacher forwards' own share is 3's `distill/teacher_time(%)` (wall clock on a CPU),
median over the same steps.

Every run is one process (gloo) with `--threads` threads (default 1: on the shared 2-core
machine a second OpenMP thread per process made a dense_debug step about 3x slower, not
faster). Values are read at full precision from each run's TensorBoard events.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The training command and its settings are the retrofit benchmark's (one process, gloo, the
# embedded corpus, validation on the same sequences), with every step logged here.
from benchmarks.retrofit_bench import ANSI, DENSE_DEBUG, GRT_DEBUG, add_run_arguments, window_mean  # noqa: E402
from benchmarks.retrofit_bench import train_cmd as retrofit_train_cmd  # noqa: E402


def train_cmd(config: Path, dump: Path, args, steps: int, *extra: str) -> list[str]:
    """retrofit_bench's command, logging every step (the step-time ratio reads each one)."""
    return retrofit_train_cmd(config, dump, args, steps, "--metrics.log_freq", "1", *extra)


def start(cmd: list[str], log: Path, threads: int) -> tuple[subprocess.Popen, float]:
    """Start `cmd` from the repo root, its output (stdout and stderr) into `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    handle = log.open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc, time.perf_counter()


def finish(proc: subprocess.Popen, started: float, timeout: int = 1800) -> float:
    """Wait for `proc`; its seconds. A failure raises with the log's tail (a failing stage is
    reported, never worked around)."""
    code = proc.wait(timeout=timeout)
    seconds = time.perf_counter() - started
    if code != 0:
        out = ANSI.sub("", proc.log.read_text())  # type: ignore[attr-defined]
        raise RuntimeError(f"exit {code}: {' '.join(proc.args)}\n{out[-4000:]}")
    return seconds


def tb_events(tb_root: Path, tag: str) -> dict[int, tuple[float, float]]:
    """{step: (wall time, value)} of `tag` in the TensorBoard events under `tb_root`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, tuple[float, float]] = {}
    for folder in sorted({p.parent for p in tb_root.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 1})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values.update({e.step: (e.wall_time, e.value) for e in acc.Scalars(tag)})
    return values


def tb_scalars(tb_root: Path, tag: str) -> dict[int, float]:
    return {step: value for step, (_, value) in tb_events(tb_root, tag).items()}


def overlapping(runs: list[dict[int, tuple[float, float]]], skip: int) -> list[dict[int, float]]:
    """Each run's step times after `skip` warm-up steps, keeping the steps logged while every
    run was training (between the latest first log and the earliest last log)."""
    begin = max(min(t for t, _ in r.values()) for r in runs)
    end = min(max(t for t, _ in r.values()) for r in runs)
    return [{s: v for s, (t, v) in r.items() if s > skip and begin <= t <= end} for r in runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher-steps", type=int, default=250, help="N: steps of the dense_debug teacher")
    parser.add_argument("--steps", type=int, default=80, help="M: steps of each grt_debug student")
    add_run_arguments(parser)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the step times")
    parser.add_argument("--threads", type=int, default=1, help="threads per process (see the docstring)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir)")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="distill_bench_"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n, m = args.teacher_steps, args.steps
    val_every = args.val_every or max(1, m // 5)
    tokens = args.seq_len * args.batch
    seconds: dict[str, float] = {}
    print(f"work folder {out}; {tokens} tokens per step (batch {args.batch} x seq {args.seq_len})", flush=True)

    # 1. the dense_debug teacher, checkpoint at the last step.
    teacher_dir = out / "teacher"
    teacher_cmd = train_cmd(
        DENSE_DEBUG,
        teacher_dir,
        args,
        n,
        "--checkpoint.enable",
        "--checkpoint.interval",
        str(n),
        "--checkpoint.folder",
        "checkpoint",
        "--validation.freq",
        str(n),
    )
    seconds["teacher"] = finish(*start(teacher_cmd, out / "teacher.log", args.threads))
    print(f"teacher (dense_debug): {n} steps in {seconds['teacher']:.0f} s", flush=True)

    # 2. grt_debug without a teacher and 3. with it, at the same time: both see the same load
    # from the rest of the machine.
    common = [
        "--validation.freq",
        str(val_every),
        "--checkpoint.no-enable",
        "--grt_metrics.no-enable",
        "--grt_metrics.no-validation-depths",
    ]
    distill = [
        "--distill.teacher",
        str(teacher_dir / "checkpoint"),
        "--distill.teacher_config",
        str(DENSE_DEBUG),
        "--distill.alpha",
        str(args.alpha),
        "--distill.temperature",
        str(args.temperature),
    ]
    runs = {"baseline": common, "distilled": [*common, *distill]}
    dumps = {name: out / name for name in runs}
    procs = {
        name: start(train_cmd(GRT_DEBUG, dumps[name], args, m, *extra), out / f"{name}.log", args.threads)
        for name, extra in runs.items()
    }
    for name, (proc, started) in procs.items():
        seconds[name] = finish(proc, started)
        print(f"{name}: {m} steps in {seconds[name]:.0f} s", flush=True)

    # ---- report ---------------------------------------------------------------------------
    t_train = tb_scalars(teacher_dir, "loss_metrics/global_avg_loss")
    t_val = tb_scalars(teacher_dir, "validation_metrics/loss")[n]
    base, dist = dumps["baseline"], dumps["distilled"]
    b_val, d_val = tb_scalars(base, "validation_metrics/loss"), tb_scalars(dist, "validation_metrics/loss")
    d_kd_val = tb_scalars(dist, "validation_metrics/distill_kd_loss")
    b_train = tb_scalars(base, "loss_metrics/global_avg_loss")
    d_ce, d_kd = tb_scalars(dist, "distill/ce_loss"), tb_scalars(dist, "distill/kd_loss")
    b_time, d_time = overlapping(
        [tb_events(base, "time_metrics/end_to_end(s)"), tb_events(dist, "time_metrics/end_to_end(s)")], args.skip
    )
    share = tb_scalars(dist, "distill/teacher_time(%)")

    print()
    print(
        f"teacher dense_debug after {n} steps: train loss (mean of steps {max(1, n - 9)}-{n}) "
        f"{window_mean(t_train, n):.4f}, validation loss {t_val:.6f}"
    )
    print(f"students: grt_debug, {m} steps each, alpha {args.alpha:g}, T {args.temperature:g}")
    print()
    print(
        "| step | baseline val CE (r = 4) | distilled val CE (r = 4) | distilled - baseline "
        "| distilled val KD (T^2 KL) | baseline train CE (10-step mean) | distilled train CE (10-step mean) "
        "| distilled train KD (10-step mean) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in sorted(set(b_val) | set(d_val)):
        bv, dv = b_val.get(s), d_val.get(s)
        cells = [
            bv,
            dv,
            None if bv is None or dv is None else dv - bv,
            d_kd_val.get(s),
            window_mean(b_train, s),
            window_mean(d_ce, s),
            window_mean(d_kd, s),
        ]
        print(
            f"| {s} | "
            + " | ".join("" if v is None else f"{v:+.4f}" if i == 2 else f"{v:.4f}" for i, v in enumerate(cells))
            + " |"
        )
    print()
    if not b_time or not d_time:
        raise RuntimeError(f"no step after --skip {args.skip} was logged while both students ran: more --steps")
    b_med, d_med = statistics.median(b_time.values()), statistics.median(d_time.values())
    b_min, d_min = min(b_time.values()), min(d_time.values())
    print(
        f"step time while both students ran (baseline steps {min(b_time)}-{max(b_time)}, "
        f"distilled steps {min(d_time)}-{max(d_time)}): distilled / baseline = {d_med / b_med:.3f} (medians), "
        f"{d_min / b_min:.3f} (minima)"
    )
    shares = [share[s] for s in d_time if s in share]
    print(
        f"teacher forwards' share of the distilled step time (distill/teacher_time(%)), median: {statistics.median(shares):.1f}%"
    )
    print()
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
