"""The paper's comparison suite at CPU scale: every row of table 1 and every rung of figure 5,
trained from its own TOML (train_configs/paper/) on 2 CPU ranks with identical tokens, then
tabulated by `grt-titan table`.

    python benchmarks/paper_suite.py                      # small_* and ladder_* rows, 40 steps each
    python benchmarks/paper_suite.py --rows 'small_*' --steps 100 --out /tmp/suite

Each TOML keeps its method's parts ([grt]) and recipe; `cpu_scale_overrides` swaps only the
size: its flavor for the debug-size one with the same layout shape (1 + 2x4 + 1 or 0 + 2x5 + 0
at d = 128, 10 block applications, like dense_debug's 10 layers), sequence 64, float32, no
compile, no checkpoints, validation at the end. This shows that every row trains and reports
at debug size; it is no claim about the paper's numbers (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli

REPO = Path(__file__).resolve().parents[1]
PAPER_CONFIGS = REPO / "train_configs" / "paper"
# flavor of a paper TOML -> (debug flavor with the same layout shape, its R)
DEBUG_FLAVOR = {
    "small_core_only": ("debug_core_only", 5),
    **{name: ("debug", 4) for name in ("small", "medium", "large", "medium_isoparams", "large_isoparams")},
    **{f"dense_{size}": ("dense_debug", None) for size in ("small", "medium", "large")},
}


def paper_configs(pattern: str = "*") -> list[Path]:
    return sorted(p for p in PAPER_CONFIGS.glob("*.toml") if fnmatch.fnmatch(p.stem, pattern))


def cpu_scale_overrides(path: Path, steps: int, dump_folder: Path, seed: int = 0) -> list[str]:
    """Command-line arguments that train `path` at debug size on CPU, its parts unchanged."""
    flavor = tomli.loads(path.read_text())["model"]["flavor"]
    if flavor not in DEBUG_FLAVOR:
        raise ValueError(f"{path}: flavor {flavor!r} has no debug-size counterpart; known: {sorted(DEBUG_FLAVOR)}")
    debug_flavor, recurrences = DEBUG_FLAVOR[flavor]
    args = [
        "--job.config_file", str(path), "--job.dump_folder", str(dump_folder),
        "--model.flavor", debug_flavor,
        "--training.steps", str(steps), "--training.seq_len", "64",
        "--training.local_batch_size", "4", "--training.global_batch_size", "8",
        "--training.mixed_precision_param", "float32", "--debug.seed", str(seed),
        "--lr_scheduler.warmup_steps", str(max(1, steps // 10)),
        "--compile.no-enable", "--activation_checkpoint.mode", "none", "--checkpoint.no-enable",
        "--metrics.log_freq", "10", "--metrics.enable-tensorboard",
        "--validation.freq", str(steps), "--validation.steps", "4",
        "--validation.local_batch_size", "4", "--validation.seq_len", "64",
    ]
    if recurrences is not None:
        args += ["--grt.num_recurrences", str(recurrences)]
    return args


def train_row(path: Path, steps: int, out: Path, seed: int = 0, nproc: int = 2) -> tuple[int, float, str]:
    """(exit code, seconds, output tail) of one row's training run."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--local-ranks-filter=0",
           "-m", "grt_titan.train", *cpu_scale_overrides(path, steps, out / path.stem, seed)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    return proc.returncode, time.perf_counter() - start, (proc.stdout + proc.stderr)[-3000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["small_*", "ladder_*"], help="TOML name patterns")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="paper_suite_"))
    rows = sorted({p for pattern in args.rows for p in paper_configs(pattern)})
    if not rows:
        parser.error(f"no TOML in {PAPER_CONFIGS} matches {args.rows}")
    failed = []
    for path in rows:
        code, seconds, tail = train_row(path, args.steps, out, args.seed)
        print(f"{path.stem:28s} exit {code}  {seconds:6.1f} s", flush=True)
        if code != 0:
            failed.append(path.stem)
            print(tail, file=sys.stderr)
    trained = [str(out / p.stem) for p in rows if p.stem not in failed]
    table = subprocess.run([sys.executable, "-m", "grt_titan.cli", "table", *trained,
                            "--csv", str(out / "table.csv"), "--ladder-png", str(out / "ladder.png")],
                           cwd=REPO, capture_output=True, text=True)
    print(table.stdout, table.stderr, sep="\n")
    return 1 if failed or table.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
