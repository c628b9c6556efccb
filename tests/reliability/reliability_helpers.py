"""Helpers of the reliability tests: small CPU/gloo runs, TensorBoard scalars, checkpoints."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from grt_test_helpers import SHORT_DEBUG_RUN, torchrun

WORKER = "tests.reliability.reliability_worker"
STEPS = 6

# grt_debug, small and fully deterministic: fp32, a fixed seed (every fresh run starts from
# the same weights), deterministic kernels, a loss/grad-norm/lr/r scalar at every step.
COMMON = [
    *SHORT_DEBUG_RUN,
    "--training.steps",
    str(STEPS),
    "--training.local_batch_size",
    "2",
    "--lr_scheduler.warmup_steps",
    "2",
    "--checkpoint.enable",
    "--checkpoint.interval",
    "2",
    "--debug.seed",
    "7",
    "--debug.deterministic",
]
NOISE_OFF = ["--grt.state_noise_std", "0", "--grt.gate_noise_std", "0"]


def train(
    nproc: int, dump: Path, *extra: str, env: dict | None = None, timeout: int = 300, max_restarts: int | None = None
) -> subprocess.CompletedProcess:
    """One torchrun job of the worker; its output is kept next to the dump folder."""
    proc = torchrun(
        nproc,
        [*COMMON, "--job.dump_folder", str(dump), *extra],
        dump.parent,
        timeout=timeout,
        module=WORKER,
        env=env,
        max_restarts=max_restarts,
        log_name=f"{dump.name}.log",
    )
    dump.mkdir(parents=True, exist_ok=True)
    return proc


def output(proc) -> str:
    return proc.stdout + proc.stderr


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every TensorBoard scalar of a run folder, by tag and step, over all its event files
    (a stopped and a resumed run write one file each into the same tb/ folder)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted((run_dir / "tb").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):
                out.setdefault(tag, {})[e.step] = e.value
    return out


def checkpoint_state(folder: Path, tmp: Path) -> dict:
    """A DCP checkpoint folder as one flat state dict (all shards gathered)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{folder.parent.parent.name}-{folder.name}.pt"
    dcp_to_torch_save(str(folder), str(out))
    return torch.load(out, weights_only=False)


def model_tensors(state: dict) -> dict[str, torch.Tensor]:
    """The model entries of a checkpoint (torchtitan stores them flat, by FQN)."""
    skip = ("optimizer", "lr_scheduler", "dataloader", "train_state")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and not k.startswith(skip)}


def records(folder: Path) -> dict[str, list[tuple[int, int, int]]]:
    """The worker's GRT_TEST_RECORD_DIR: (step, global data position, sequence number) of
    every training sample read, by file (`rank{R}-attempt{A}`)."""
    return {
        p.stem: [tuple(map(int, line.split())) for line in p.read_text().splitlines()]
        for p in sorted(folder.glob("*.txt"))
    }


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
