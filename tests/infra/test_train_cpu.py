"""End to end through torchtitan's Trainer on CPU/gloo, 2 ranks.

The ranks are forked with torchrun's environment (tests/forked_torchrun.py); the user's own
command, through torchrun's agent, runs in tests/docs (README.md's CPU run)."""

import json

import pytest
from grt_test_helpers import step_losses


@pytest.mark.slow
def test_depth_is_identical_on_every_rank(run_torchrun, tmp_path):
    out = tmp_path / "draws.json"
    proc = run_torchrun(2, [str(out)], tmp_path, timeout=300, module="tests.infra.depth_sync_worker")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = json.loads(out.read_text())
    assert rank0 == rank1 and len(set(rank0)) == 8


@pytest.mark.slow
def test_grt_debug_trains_on_two_cpu_ranks(run_torchrun, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = run_torchrun(
        2,
        [
            "--job.config_file", "train_configs/grt_debug.toml",
            "--job.dump_folder", str(tmp_path / "run"),
            "--training.steps", "30",
            "--validation.freq", "30",
        ],
        tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "Applied FSDP to the GRT" in output
    losses = step_losses(output)
    assert sorted(losses) == [1, 5, 10, 15, 20, 25, 30]
    # From ln(50257) = 10.8 at init to the unigram plateau (~6.6) in 30 steps.
    assert losses[1] > 10.5 and losses[30] < losses[1] - 3.0

    events = list((tmp_path / "run" / "tb").rglob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    for tag in ("loss_metrics/global_avg_loss", "tflops", "throughput(tps)", "grt/r_mean", "validation_metrics/loss"):
        assert tag in scalars
    assert "mfu(%)" not in scalars  # no peak FLOP rate on CPU (docs/training.md)
    r_means = [e.value for e in acc.Scalars("grt/r_mean")]
    assert all(1 <= r <= 4 for r in r_means) and len(set(r_means)) > 1


def test_torchruns_nccl_default_is_left_to_torchtitan(monkeypatch):
    """torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 is unset (torchtitan sets 3 without its
    overwrite warning); a value the user chose stays."""
    import os

    from grt_titan.train import quiet_torchrun_defaults

    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    quiet_torchrun_defaults()
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    quiet_torchrun_defaults()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
