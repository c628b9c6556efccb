"""A non-finite loss or gradient norm stops the run naming the step, or skips the step;
a NaN never reaches the weights or a checkpoint: 2 CPU ranks (FSDP) through the trainer.
The optimizer's guard alone: tests/components/test_optimizer.py."""

from __future__ import annotations

import math

import pytest
import torch

from grt_test_helpers import same_values
from reliability_helpers import NOISE_OFF, checkpoint_state, model_tensors, output, scalars, train


@pytest.mark.slow
def test_nan_loss_stops_the_run_and_never_reaches_a_checkpoint(tmp_path):
    # A learning rate of 1e30 makes step 1's update explode: step 2's loss and gradients are NaN.
    run = tmp_path / "stop"
    proc = train(
        2, run, *NOISE_OFF, "--optimizer.lr", "1e30", "--checkpoint.interval", "1", "--training.steps", "4", timeout=240
    )
    out = output(proc)
    assert proc.returncode != 0, out[-3000:]
    assert "NonFiniteStepError: step 2: the gradient norm is NaN or inf" in out, out[-3000:]
    folders = sorted(p.name for p in (run / "checkpoint").iterdir())
    assert folders == ["step-1"]  # step 2 stopped before its update and its save
    weights = model_tensors(checkpoint_state(run / "checkpoint" / "step-1", tmp_path))
    assert all(torch.isfinite(v.float()).all() for v in weights.values())
    losses = scalars(run)["loss_metrics/global_avg_loss"]
    assert list(losses) == [1] and math.isfinite(losses[1])


@pytest.mark.slow
def test_skip_on_one_rank_is_skipped_on_every_rank(tmp_path):
    # Rank 1 alone sees a NaN (the inf-norm case); both ranks must skip step 3 together.
    run = tmp_path / "skip"
    env = {"GRT_TEST_POISON_STEP": "3", "GRT_TEST_POISON_RANK": "1"}
    proc = train(
        2,
        run,
        *NOISE_OFF,
        "--optimizer.on_nonfinite",
        "skip",
        "--checkpoint.interval",
        "1",
        "--training.steps",
        "5",
        env=env,
        timeout=240,
    )
    out = output(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "step 3: the gradient norm is NaN or inf; skipped the optimizer step" in out
    assert "skipped the optimizer step" not in out.replace("step 3: the gradient norm is NaN or inf; skipped", "")
    states = {k: checkpoint_state(run / "checkpoint" / f"step-{k}", tmp_path) for k in (2, 3, 4)}
    params = {
        k: {n: v for n, v in model_tensors(s).items() if n != "recurrence.depth_sampler.draws"}
        for k, s in states.items()
    }
    assert same_values(params[2], params[3])  # no parameter moved at step 3, on either rank's shard
    # nor any optimizer state (moments, step counts); param_groups hold the lr, which advances
    moments = {k: {n: v for n, v in s["optimizer"].items() if n.startswith("state.")} for k, s in states.items()}
    assert len(moments[2]) > 0 and same_values(moments[2], moments[3])
    assert not same_values(moments[3], moments[4])
    assert not same_values(params[3], params[4])  # step 4 trains again
    losses = scalars(run)["loss_metrics/global_avg_loss"]
    assert sorted(losses) == [1, 2, 3, 4, 5] and all(math.isfinite(v) for v in losses.values())
