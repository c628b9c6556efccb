"""Every parallel combination a user of the large presets will try, one training step each.

FSDP x TP {1, 2, 4} x compile {off, on} x AC {none, selective op, full} x float8 {off, on}
on 8 ranks of torchtitan's fake backend (one process plays rank 0 and runs the real
trainer, plans, compile and a full step; collectives return without communicating), at
d = 128 (grt_debug, 4 heads), sequence 64. TP t leaves FSDP 8 / t. float8 is torchao's
emulated tensorwise recipe (this CPU has no float8 matmul) with float8 FSDP all-gather and,
under TP, float8 TP.

    python benchmarks/parallel_matrix.py                 # all 36, two at a time, ~15 min on 2 cores
    python benchmarks/parallel_matrix.py --only tp4      # a subset (substring of the case name)

Prints a Markdown table (docs/results/parallelism_matrix.md holds the last one). The cases are a table in
tests/cases.py; CI runs their corners (tests/infra/test_parallel_matrix.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cases import EMULATION_LIMIT, MATRIX_CASES, MATRIX_WORLD_SIZE, matrix_case_args, runnable_here  # noqa: E402
from tests.launcher import fake_backend_env, launch  # noqa: E402

STEP_LINE = re.compile(r"step:\s*1\s+loss:\s*([0-9.]+)")


def run_case(name: str, dump_folder: str) -> dict:
    """One combination: its step-1 loss, or the last line of its error."""
    if not runnable_here(name):
        return {"name": name, "returncode": None, "loss": None, "seconds": 0.0, "error": EMULATION_LIMIT, "output": ""}
    start = time.perf_counter()
    proc = launch(
        "grt_titan.train", matrix_case_args(name, dump_folder), fake_backend_env(MATRIX_WORLD_SIZE), timeout=900
    )
    output = proc.stdout + proc.stderr
    match = STEP_LINE.search(re.sub(r"\x1b\[[0-9;]*m", "", output))
    lines = [line for line in output.splitlines() if "Error" in line]
    return {
        "name": name,
        "returncode": proc.returncode,
        "loss": float(match.group(1)) if match else None,
        "seconds": time.perf_counter() - start,
        "error": lines[-1].strip() if lines else "",
        "output": output,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    options = parser.parse_args()
    names = [n for n in MATRIX_CASES if options.only in n]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(options.jobs) as pool:
        results = list(pool.map(lambda n: run_case(n, os.path.join(tmp, n)), names))
    print("| TP | FSDP | compile | AC | float8 | step 1 loss | s | result |")
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        tp, compiled, ac, float8 = MATRIX_CASES[result["name"]]
        ok = result["returncode"] == 0 and result["loss"] is not None
        print(
            f"| {tp} | {MATRIX_WORLD_SIZE // tp} | {'on' if compiled else 'off'} | {ac} | {'on' if float8 else 'off'} "
            f"| {result['loss'] if ok else '-'} | {result['seconds']:.0f} | {'ok' if ok else result['error']} |"
        )
    skipped = [r["name"] for r in results if r["returncode"] is None]
    failed = [r["name"] for r in results if r["returncode"] is not None and (r["returncode"] or r["loss"] is None)]
    print(f"{len(results) - len(failed) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
