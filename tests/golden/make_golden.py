"""Regenerate tests/golden/grt_debug_losses.json: the per-step training loss of grt_debug.

    python tests/golden/make_golden.py              # rewrites the JSON (~2 min on 2 cores)
    python tests/golden/make_golden.py --out X.json  # writes elsewhere (to compare by hand)

20 steps of train_configs/grt_debug.toml (fp32) on 2 gloo ranks (FSDP 2), sequence 64,
global batch 4 (2 per rank), `--debug.seed 0`, loss logged every step and read from
TensorBoard (the console prints 4 decimals). Two variants:

- `fsdp2`: the TOML's recipe (noise on, clip 1.0), initialised from the seed on the 2-rank
  mesh. Checks of the same layout (activation checkpointing on/off, ...) compare with it.
- `fsdp2_seed_ckpt_no_noise`: starts from a seed checkpoint that one rank creates from the
  same seed (sharded random init on a CPU mesh is not layout-independent), with noise off
  (drawn per rank, so it differs by layout) and clipping off (its coefficient uses the
  fp32 grad norm, whose rounding differs by layout); other layouts compare with it.
  Nothing binary is checked in: the seed checkpoint is recreated from the seed.

tests/infra/test_golden_losses.py runs these commands (this module is their one home)
and compares; docs/parallelism.md ("Parity") says what and within what tolerance.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for grt_test_helpers
from grt_test_helpers import REPO, SHORT_DEBUG_RUN, torchrun  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "grt_debug_losses.json"
STEPS = 20
SEED = 0
GLOBAL_BATCH = 4
LOSS_TAG = "loss_metrics/global_avg_loss"

COMMON = [*SHORT_DEBUG_RUN, "--training.steps", str(STEPS), "--debug.seed", str(SEED)]
NO_NOISE_NO_CLIP = [
    "--grt.state_noise_std",
    "0",
    "--grt.gate_noise_std",
    "0",
    "--training.max_norm",
    "1e6",
]
# `{dump}` is the run's dump folder, `{seed_checkpoint}` the folder the seed command wrote.
FROM_SEED_CHECKPOINT = [
    "--checkpoint.enable",
    "--checkpoint.initial_load_path",
    "{seed_checkpoint}",
    "--checkpoint.interval",
    "1000",
]
SEED_CHECKPOINT_ARGS = [
    *COMMON,
    "--job.dump_folder",
    "{dump}",
    "--checkpoint.enable",
    "--checkpoint.create_seed_checkpoint",
    "--parallelism.data_parallel_shard_degree",
    "1",
]

VARIANTS = {
    "fsdp2": {"nproc": 2, "seed_checkpoint": False, "args": []},
    "fsdp2_seed_ckpt_no_noise": {"nproc": 2, "seed_checkpoint": True, "args": NO_NOISE_NO_CLIP},
}


def run_args(nproc: int, dump: Path, extra: list[str] = (), seed_checkpoint: Path | None = None) -> list[str]:
    """The arguments of a 20-step run on `nproc` ranks (FSDP nproc, global batch 4)."""
    args = [
        *COMMON,
        *extra,
        "--job.dump_folder",
        str(dump),
        "--parallelism.data_parallel_shard_degree",
        str(nproc),
        "--training.local_batch_size",
        str(GLOBAL_BATCH // nproc),
    ]
    if seed_checkpoint is not None:
        args += [a.replace("{seed_checkpoint}", str(seed_checkpoint)) for a in FROM_SEED_CHECKPOINT]
    return args


def scalars(run_dir: Path, tag: str = LOSS_TAG) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = list((run_dir / "tb").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


def _check(proc, what: str) -> None:
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def make_seed_checkpoint(tmp: Path) -> Path:
    """One rank writes the model initialised from SEED to tmp/checkpoint/step-0."""
    args = [a.replace("{dump}", str(tmp)) for a in SEED_CHECKPOINT_ARGS]
    _check(torchrun(1, args, tmp / "log"), "seed checkpoint")
    return tmp / "checkpoint" / "step-0"


def train(
    tmp: Path,
    name: str,
    nproc: int,
    extra: list[str] = (),
    seed_checkpoint: Path | None = None,
    env: dict | None = None,
) -> list[float]:
    """The per-step losses of a 20-step run (TensorBoard's float32 values)."""
    run_dir = tmp / name
    proc = torchrun(nproc, run_args(nproc, run_dir, extra, seed_checkpoint), tmp / f"{name}-log", env=env)
    _check(proc, name)
    losses = scalars(run_dir)
    if len(losses) != STEPS:
        raise RuntimeError(f"{name}: {len(losses)} logged losses, expected {STEPS}")
    return losses


def command(nproc: int, args: list[str]) -> str:
    return shlex.join(["torchrun", f"--nproc_per_node={nproc}", "-m", "grt_titan.train", *args])


def generate(tmp: Path) -> dict:
    seed = None
    variants = {}
    for name, spec in VARIANTS.items():
        if spec["seed_checkpoint"] and seed is None:
            seed = make_seed_checkpoint(tmp / "seed")
        start = time.monotonic()
        losses = train(tmp, name, spec["nproc"], spec["args"], seed if spec["seed_checkpoint"] else None)
        seconds = time.monotonic() - start
        args = run_args(
            spec["nproc"], Path("{dump}"), spec["args"], Path("{seed_checkpoint}") if spec["seed_checkpoint"] else None
        )
        variants[name] = {
            "nproc": spec["nproc"],
            "overrides": spec["args"],
            "seed_checkpoint": spec["seed_checkpoint"],
            "command": command(spec["nproc"], args),
            "seed_checkpoint_command": command(1, SEED_CHECKPOINT_ARGS) if spec["seed_checkpoint"] else None,
            "run_seconds": round(seconds, 1),
            "losses": losses,
        }
    return {
        "description": f"Per-step training loss ({LOSS_TAG}, TensorBoard float32) of the first {STEPS} "
        "steps of train_configs/grt_debug.toml (fp32) on 2 gloo ranks, CPU. "
        "{dump}: the run's dump folder; {seed_checkpoint}: <seed dump>/checkpoint/step-0.",
        "regenerate": "python tests/golden/make_golden.py",
        "steps": STEPS,
        "seed": SEED,
        "global_batch": GLOBAL_BATCH,
        "env": {"OMP_NUM_THREADS": "1"},
        "versions": {
            "torch": torch.__version__,
            "torchtitan": importlib.metadata.version("torchtitan"),
            "python": platform.python_version(),
            "machine": f"{platform.system()} {platform.machine()}",
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "variants": variants,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=GOLDEN)
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory(prefix="grt_golden_") as tmp:
        golden = generate(Path(tmp))
    out.write_text(json.dumps(golden, indent=2) + "\n")
    for name, variant in golden["variants"].items():
        print(f"{name}: {variant['run_seconds']} s, loss {variant['losses'][0]:.5f} -> {variant['losses'][-1]:.5f}")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()
