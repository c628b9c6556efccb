"""Rank failure under `torchrun --max-restarts=1`: a rank killed with SIGKILL mid-training
restarts the job, which resumes from the last complete checkpoint, finishes, and ends with
exactly the model of an uninterrupted run. A checkpoint killed half-written is never loaded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from torchtitan.components.checkpoint import CheckpointManager

from grt_titan.checkpoint_io import latest_complete_step, latest_step_folder

from grt_test_helpers import REPO, RESTART_ENV, job_env, torchrun_command
from reliability_helpers import (
    COMMON,
    NOISE_OFF,
    STEPS,
    WORKER,
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
def test_sigkilled_rank_restarts_and_matches_the_uninterrupted_run(uninterrupted, tmp_path):
    reference = uninterrupted(False)
    run, pids = tmp_path / "killed", tmp_path / "pids"
    args = [*COMMON, *NOISE_OFF, "--job.dump_folder", str(run)]
    # 1 s per step leaves the kill time to land inside step 3, after checkpoint step-2.
    env = job_env({**RESTART_ENV, "GRT_TEST_PID_DIR": str(pids), "GRT_TEST_STEP_SLEEP": "1"})
    proc = subprocess.Popen(
        torchrun_command(2, args, WORKER, max_restarts=1),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed = {}

    def kill_rank_1_after_checkpoint_2():
        deadline = time.monotonic() + 240
        marker, pid_file = run / "checkpoint" / "step-2" / ".metadata", pids / "rank1-attempt0.pid"
        while time.monotonic() < deadline and proc.poll() is None:
            if marker.is_file() and pid_file.is_file():
                time.sleep(0.5)  # let the save of step 2 return: the kill lands in step 3
                killed["later_checkpoint"] = (run / "checkpoint" / "step-4").exists()
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                killed["pid"] = int(pid_file.read_text())
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_rank_1_after_checkpoint_2, daemon=True)
    watcher.start()
    try:
        out, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
    watcher.join(timeout=5)
    (tmp_path / "killed.log").write_text(out)
    assert "pid" in killed, out[-3000:]
    assert not killed["later_checkpoint"]  # the kill landed between checkpoints 2 and 4
    assert proc.returncode == 0, out[-3000:]
    assert (pids / "rank1-attempt1.pid").is_file()  # torchrun restarted the workers
    assert "Training starts at step 3" in out  # resumed from checkpoint step-2
    assert_matches_uninterrupted(run, reference, tmp_path)


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
