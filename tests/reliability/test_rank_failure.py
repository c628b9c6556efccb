"""Rank failure under `torchrun --max-restarts=1`: a rank killed with SIGKILL while the job runs
(inside its save of step 4, the other rank waiting in the save's collectives) restarts the job,
which never loads the half-written checkpoint, resumes from the last complete one, finishes, and
ends with exactly the model and per-step values of an uninterrupted run.

(A second run killed rank 1 inside a training step, the other rank in FSDP's collectives, until
the suite's time was cut, tests/README.md: torchrun's agent restarts a job whose worker died
whatever the survivor waits in, and the resume is this run's.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from torchtitan.components.checkpoint import CheckpointManager

from grt_titan.checkpoints.folders import latest_complete_step, latest_step_folder

from reliability_helpers import (
    NOISE_OFF,
    STEPS,
    assert_same_tensors,
    checkpoint_state,
    model_tensors,
    output,
    scalars,
    train,
)

EXACT_TAGS = ("loss_metrics/global_avg_loss", "grad_norm", "lr", "grt/r_last")


def assert_matches_uninterrupted(run, reference, tmp_path):
    final = f"step-{STEPS}"
    assert_same_tensors(
        model_tensors(checkpoint_state(reference / "checkpoint" / final, tmp_path)),
        model_tensors(checkpoint_state(run / "checkpoint" / final, tmp_path)),
    )
    expected, got = scalars(reference), scalars(run)  # the restarted attempt's values win
    for tag in EXACT_TAGS:
        assert got[tag] == expected[tag], tag


def test_latest_checkpoint_is_the_newest_with_metadata(tmp_path):
    """torchtitan picks the newest step-N folder that has DCP's `.metadata`, which DCP's
    coordinator writes last (to a temporary name, then renamed) after every rank's shard."""
    for step, files in (
        (2, ["__0_0.distcp", "__1_0.distcp", ".metadata"]),
        (4, ["__0_0.distcp", "__1_0.distcp"]),  # killed before .metadata
        (6, []),
    ):  # killed before any shard
        folder = tmp_path / f"step-{step}"
        folder.mkdir()
        for name in files:
            (folder / name).write_bytes(b"x")
    assert CheckpointManager._find_load_step(SimpleNamespace(folder=str(tmp_path))) == 2
    # grt_titan's one definition (the verified load, the resume check, export-hf, analyze) agrees.
    assert latest_complete_step(tmp_path) == 2 and latest_step_folder(tmp_path) == tmp_path / "step-2"


@pytest.mark.slow
def test_checkpoint_killed_half_written_is_never_loaded(uninterrupted, tmp_path):
    reference = uninterrupted(False)
    run, pids = tmp_path / "half_written", tmp_path / "pids"
    env = {"GRT_TEST_PID_DIR": str(pids), "GRT_TEST_KILL_IN_SAVE_STEP": "4", "GRT_TEST_KILL_RANK": "1"}
    proc = train(2, run, *NOISE_OFF, env=env, max_restarts=1, timeout=420)
    out = output(proc)
    assert proc.returncode == 0, out[-3000:]
    report = json.loads((pids / "kill_in_save.json").read_text())
    assert report["folder"].endswith("step-4")
    assert "__1_0.distcp" in report["files"] and ".metadata" not in report["files"]
    assert (pids / "rank1-attempt1.pid").is_file()
    # The restart skipped the half-written step-4 and loaded step-2.
    assert f"Loading the checkpoint from {run / 'checkpoint' / 'step-2'}" in out
    assert "Training starts at step 3" in out
    assert_matches_uninterrupted(run, reference, tmp_path)
