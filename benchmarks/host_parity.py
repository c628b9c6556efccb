"""grt_debug's golden run on torchtitan 0.3 against torchtitan 0.2.2's golden losses.

Run in a venv with torchtitan 0.3 (README, "Supported versions"):

    python benchmarks/host_parity.py

It trains the golden `fsdp2` command of tests/golden/make_golden.py (20 steps, 2 gloo ranks,
seed 0) as `-m torchtitan.train --module grt_titan --config grt_debug`, reads its per-step loss
from TensorBoard and prints, per step, the golden (0.2.2) loss, the 0.3 loss and their relative
difference. docs/results/host_parity.md holds a run's table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = [
    *("--module", "grt_titan", "--config", "grt_debug", "--training.seq_len", "64"),
    *("--training.local_batch_size", "2", "--training.steps", "20", "--metrics.log_freq", "1"),
    *("--validator.no-enable", "--debug.seed", "0", "--parallelism.data_parallel_shard_degree", "2"),
]


def make_golden():
    spec = importlib.util.spec_from_file_location("make_golden", REPO / "tests" / "golden" / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(dump: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--local-ranks-filter=0"]
    command += ["-m", "torchtitan.train", *ARGS, "--dump_folder", str(dump)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the torchtitan 0.3 run failed:\n{(done.stdout + done.stderr)[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    golden = make_golden()
    stored = json.loads(golden.GOLDEN.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        train(Path(tmp) / "run")
        losses = golden.scalars(Path(tmp) / "run")
    reference = stored["variants"]["fsdp2"]["losses"]
    print(f"| step | torchtitan 0.2.2 (torch {stored['versions']['torch']}) | torchtitan 0.3 | relative difference |")
    print("|---|---|---|---|")
    for step, (ref, got) in enumerate(zip(reference, losses, strict=True), start=1):
        print(f"| {step} | {ref:.6f} | {got:.6f} | {abs(got - ref) / abs(ref):.2e} |")
    worst = max(abs(got - ref) / abs(ref) for ref, got in zip(reference, losses))
    print(f"\nworst relative difference over {len(losses)} steps: {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
