"""Every parallel combination a user of the large presets will try, one training step each.

FSDP x TP {1, 2, 4} x compile {off, on} x AC {none, selective op, full} x float8 {off, on}
on 8 ranks of torchtitan's fake backend (one process plays rank 0 and runs the real
trainer, plans, compile and a full step; collectives return without communicating), at
d = 128 (grt_debug, 4 heads), sequence 64. TP t leaves FSDP 8 / t. float8 is torchao's
emulated tensorwise recipe (this CPU has no float8 matmul) with float8 FSDP all-gather and,
under TP, float8 TP.

    python benchmarks/parallel_matrix.py                 # all 36, two at a time, ~15 min on 2 cores
    python benchmarks/parallel_matrix.py --only tp4      # a subset (substring of the case name)

Prints a Markdown table (docs/parallelism.md holds the last one). The CI keeps the corners
(tests/infra/test_parallel_matrix.py), which call `run_case` from here.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 8
STEP_LINE = re.compile(r"step:\s*1\s+loss:\s*([0-9.]+)")

AC_ARGS = {
    "none": ["--activation_checkpoint.mode", "none"],
    "selective": ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"],
    "full": ["--activation_checkpoint.mode", "full"],
}
FLOAT8_ARGS = [
    "--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate",
    "--quantize.linear.float8.enable_fsdp_float8_all_gather",
    "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
]
CASES = {
    f"tp{tp}-{'compile' if compiled else 'eager'}-ac_{ac}-{'float8' if float8 else 'bf16'}": (tp, compiled, ac, float8)
    for tp, compiled, ac, float8 in itertools.product((1, 2, 4), (False, True), AC_ARGS, (False, True))
}


def run_fake_backend(world_size: int, args: list[str], timeout: int = 900, runner=None) -> subprocess.CompletedProcess:
    """`python -m grt_titan.train ARGS` as rank 0 of `world_size` on torchtitan's fake backend.
    `runner(module, args, env, timeout)` replaces the subprocess (the tests' launch server)."""
    env = {**os.environ, "NGPU": str(world_size), "LOCAL_RANK": "0", "RANK": "0",
           "WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = ["--comm.mode", "fake_backend", *args]
    if runner is not None:
        return runner("grt_titan.train", args, env, timeout)
    return subprocess.run([sys.executable, "-m", "grt_titan.train", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def case_args(name: str, dump_folder: str) -> list[str]:
    tp, compiled, ac, float8 = CASES[name]
    args = [
        "--job.config_file", "train_configs/grt_debug.toml", "--job.dump_folder", dump_folder,
        "--training.steps", "1", "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--training.mixed_precision_param", "bfloat16",
        "--parallelism.data_parallel_shard_degree", str(WORLD_SIZE // tp),
        "--parallelism.tensor_parallel_degree", str(tp),
        "--validation.no-enable", "--metrics.no-enable-tensorboard", "--metrics.log_freq", "1",
        *AC_ARGS[ac],
    ]
    if compiled:
        args += ["--compile.enable", "--compile.components", "model,loss"]
    if float8:
        args += FLOAT8_ARGS
    return args


# torchtitan 0.2.2 runs float8 under compile only on SM89+ GPUs: its emulation (all a CPU
# can do) is eager-only, and it refuses the combination at start-up.
EMULATION_LIMIT = "GPU only: torchtitan's float8 emulation is eager-only"


def runnable_here(name: str) -> bool:
    import torch

    _, compiled, _, float8 = CASES[name]
    return not (compiled and float8) or torch.cuda.is_available()


def run_case(name: str, dump_folder: str, runner=None) -> dict:
    """One combination: its step-1 loss, or the last line of its error."""
    if not runnable_here(name):
        return {"name": name, "returncode": None, "loss": None, "seconds": 0.0, "error": EMULATION_LIMIT,
                "output": ""}
    start = time.perf_counter()
    proc = run_fake_backend(WORLD_SIZE, case_args(name, dump_folder), runner=runner)
    output = proc.stdout + proc.stderr
    match = STEP_LINE.search(re.sub(r"\x1b\[[0-9;]*m", "", output))
    lines = [line for line in output.splitlines() if "Error" in line]
    return {
        "name": name, "returncode": proc.returncode, "loss": float(match.group(1)) if match else None,
        "seconds": time.perf_counter() - start, "error": lines[-1].strip() if lines else "",
        "output": output,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    options = parser.parse_args()
    names = [n for n in CASES if options.only in n]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(options.jobs) as pool:
        results = list(pool.map(lambda n: run_case(n, os.path.join(tmp, n)), names))
    print("| TP | FSDP | compile | AC | float8 | step 1 loss | s | result |")
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        tp, compiled, ac, float8 = CASES[result["name"]]
        ok = result["returncode"] == 0 and result["loss"] is not None
        print(f"| {tp} | {WORLD_SIZE // tp} | {'on' if compiled else 'off'} | {ac} | {'on' if float8 else 'off'} "
              f"| {result['loss'] if ok else '-'} | {result['seconds']:.0f} | {'ok' if ok else result['error']} |")
    skipped = [r["name"] for r in results if r["returncode"] is None]
    failed = [r["name"] for r in results if r["returncode"] is not None and (r["returncode"] or r["loss"] is None)]
    print(f"{len(results) - len(failed) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
