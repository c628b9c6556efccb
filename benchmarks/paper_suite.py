"""The paper's comparison suite at CPU scale: every row of table 1 and every rung of figure 5,
trained from its own TOML (train_configs/paper/) on 2 CPU ranks with identical tokens, then
tabulated by `grt-titan table`.

    python benchmarks/paper_suite.py                      # small_* and ladder_* rows, 40 steps each
    python benchmarks/paper_suite.py --rows 'small_*' --steps 100 --out /tmp/suite
    python benchmarks/paper_suite.py --static --rows '*'  # architecture columns at paper scale, no training

The rows and their CPU-scale arguments are tables in tests/cases.py. Each TOML keeps its
method's parts ([grt]) and recipe; `cpu_scale_overrides` swaps only the
size: its flavor for the debug-size one with the same layout shape (1 + 2x4 + 1 or 0 + 2x5 + 0
at d = 128, 10 block applications, like dense_debug's 10 layers), sequence 64, float32, no
compile, no checkpoints, validation at the end. This shows that every row trains and reports
at debug size; it is no claim about the paper's numbers (docs/results/paper_suite_cpu.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cases import PAPER_CONFIGS, cpu_scale_overrides, paper_configs, static_table  # noqa: E402


def train_row(path: Path, steps: int, out: Path, seed: int = 0, nproc: int = 2) -> tuple[int, float, str]:
    """(exit code, seconds, output tail) of one row's training run."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        "--local-ranks-filter=0",
        "-m",
        "grt_titan.train",
        *cpu_scale_overrides(path, steps, out / path.stem, seed),
    ]
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
    parser.add_argument(
        "--static", action="store_true", help="print the rows' architecture columns at paper scale (no training)"
    )
    args = parser.parse_args(argv)
    if args.static:
        print(static_table(sorted({p for pattern in args.rows for p in paper_configs(pattern)})))
        return 0
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
    trained = [p for p in rows if p.stem not in failed]
    codes = []
    # Table 1's rows, then figure 5's ladder in rung order (a table of its own, and the PNG).
    for name, runs, extra in (
        ("table1", [p for p in trained if not p.stem.startswith("ladder_")], ["--csv", str(out / "table1.csv")]),
        (
            "ladder",
            [p for p in trained if p.stem.startswith("ladder_")],
            ["--csv", str(out / "ladder.csv"), "--ladder-png", str(out / "ladder.png")],
        ),
    ):
        if not runs:
            continue
        table = subprocess.run(
            [sys.executable, "-m", "grt_titan.cli", "table", *(str(out / p.stem) for p in runs), *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        print(f"\n{name}:\n{table.stdout}{table.stderr}")
        codes.append(table.returncode)
    return 1 if failed or any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
