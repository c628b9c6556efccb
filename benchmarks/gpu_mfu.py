"""MFU of GRT small/medium vs their dense twins on one GPU: compile + AC, bf16 and float8.

One command, about 6-8 minutes on one H100/H200:

    python benchmarks/gpu_mfu.py

Each row is a short torchtitan run (`python -m torchtitan.train`, the production entry
point) of a paper config with compile and selective-op AC on, at the paper's sequence
length; the MFU and tokens/s of the last logged step (after compile warm-up) are read from
torchtitan's own log line. MFU counts FLOPs at the depths actually sampled (the grt
metrics processor), so GRT and dense rows are comparable. `--cpu-smoke` runs the same
pipeline on grt_debug/dense_debug on CPU in a minute, to check the script itself.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP = re.compile(r"step:\s*(\d+).*?tps:\s*([\d,]+).*?tflops:\s*([\d.,]+).*?mfu:\s*([\d.]+)%")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PAIRS = [("grt_small", "dense_small"), ("grt_medium", "dense_medium")]


def run(config: str, float8: bool, opts) -> dict:
    args = [
        "--job.config_file", f"train_configs/{config}.toml",
        "--job.dump_folder", f"/tmp/grt_mfu/{config}_{'fp8' if float8 else 'bf16'}",
        "--training.steps", str(opts.steps),
        "--training.local_batch_size", str(opts.batch),
        "--training.global_batch_size", "-1",
        "--metrics.log_freq", str(opts.steps // 2),
        "--metrics.no-enable-tensorboard",
        "--validation.no-enable",
        "--checkpoint.no-enable",
        "--lr_scheduler.warmup_steps", "2",
    ]
    if opts.cpu_smoke:
        args += ["--compile.no-enable", "--training.seq_len", "128", "--training.mixed_precision_param", "float32"]
    if float8:
        args += ["--model.converters", "quantize.linear.float8"]
        if opts.cpu_smoke:
            args += ["--quantize.linear.float8.emulate"]
        else:
            args += ["--quantize.linear.float8.enable_fsdp_float8_all_gather",
                     "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"]
    module = "grt_titan.train" if opts.cpu_smoke else "torchtitan.train"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--local-ranks-filter=0",
           "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = ANSI.sub("", proc.stdout + proc.stderr)
    steps = STEP.findall(output)
    if proc.returncode != 0 or not steps:
        raise RuntimeError(f"{config} float8={float8} failed:\n{output[-3000:]}")
    _, tps, tflops, mfu = steps[-1]
    return {"tps": float(tps.replace(",", "")), "tflops": float(tflops.replace(",", "")), "mfu": float(mfu)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16, help="local batch size (sequences of 1024)")
    parser.add_argument("--cpu-smoke", action="store_true")
    opts = parser.parse_args()
    pairs = [("grt_debug", "dense_debug")] if opts.cpu_smoke else PAIRS
    if opts.cpu_smoke:
        opts.steps, opts.batch = 4, 2
    print("| size | precision | GRT MFU % | dense MFU % | GRT / dense MFU | GRT tok/s | dense tok/s |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for grt, dense in pairs:
        for float8 in (False, True):
            g, d = run(grt, float8, opts), run(dense, float8, opts)
            results[(grt, float8)] = (g, d)
            print(f"| {grt} | {'float8' if float8 else 'bf16'} | {g['mfu']:.2f} | {d['mfu']:.2f} "
                  f"| {g['mfu'] / max(d['mfu'], 1e-9):.3f} | {g['tps']:,.0f} | {d['tps']:,.0f} |", flush=True)
    print("\n| size | float8 / bf16 tok/s, GRT | float8 / bf16 tok/s, dense |")
    print("|---|---|---|")
    for grt, dense in pairs:
        (g16, d16), (g8, d8) = results[(grt, False)], results[(grt, True)]
        print(f"| {grt} | {g8['tps'] / g16['tps']:.3f} | {d8['tps'] / d16['tps']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
