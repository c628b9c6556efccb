"""A non-finite loss or gradient norm stops the run naming the step, or skips the step;
a NaN never reaches the weights or a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchtitan.config import ConfigManager
from torchtitan.distributed import ParallelDims

from grt_titan.components.optimizer import NonFiniteGuard, NonFiniteStepError, build_grt_optimizers
from reliability_helpers import NOISE_OFF, REPO, checkpoint_state, model_tensors, output, scalars, train


def optimizers_for(model: nn.Module, *overrides):
    config = ConfigManager().parse_args(
        ["--job.config_file", str(REPO / "train_configs/grt_debug.toml"), *overrides])
    dims = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    return build_grt_optimizers([model], config.optimizer, dims)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def backward(model: nn.Module, poison: float | None = None) -> None:
    model.zero_grad()
    model(torch.ones(3, 4)).square().sum().backward()
    if poison is not None:
        model[1].bias.grad[0] = poison


def snapshot(model, optimizers):
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v
             for k, v in optimizers.state_dict().items()}
    return params, state


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_stop_raises_before_any_update(poison):
    model = tiny_model()
    optimizers = optimizers_for(model)
    backward(model)
    optimizers.step()  # step 1 is finite
    backward(model, poison)
    before = snapshot(model, optimizers)
    with pytest.raises(NonFiniteStepError, match=r"^step 2: the gradient norm is NaN or inf"):
        optimizers.step()
    after = snapshot(model, optimizers)
    assert same(before[0], after[0]) and same(before[1], after[1])


def test_skip_leaves_parameters_and_optimizer_state_unchanged():
    model = tiny_model()
    optimizers = optimizers_for(model, "--optimizer.on_nonfinite", "skip")
    guard = next(h for h in optimizers._optimizer_step_pre_hooks.values() if isinstance(h, NonFiniteGuard))
    backward(model)
    optimizers.step()
    before = snapshot(model, optimizers)
    backward(model, math.nan)
    optimizers.step()  # step 2: skipped
    after = snapshot(model, optimizers)
    assert same(before[0], after[0]) and same(before[1], after[1])
    assert guard.skipped == 1
    backward(model)
    optimizers.step()  # step 3 trains again; AdamW counts the 2 steps it took
    assert not same(after[0], snapshot(model, optimizers)[0])
    assert optimizers.optimizers[0].state[model[0].weight]["step"].item() == 2


def test_step_is_named_after_a_restored_optimizer_state():
    model = tiny_model()
    first = optimizers_for(model)
    for _ in range(5):
        backward(model)
        first.step()
    model.zero_grad(set_to_none=True)  # as in a fresh process: no gradient at load time
    resumed = optimizers_for(model)
    resumed.load_state_dict(first.state_dict())
    backward(model, math.nan)
    with pytest.raises(NonFiniteStepError, match=r"^step 6:"):
        resumed.step()


# ---- end to end: 2 CPU ranks (FSDP) ---------------------------------------------------------


@pytest.mark.slow
def test_nan_loss_stops_the_run_and_never_reaches_a_checkpoint(tmp_path):
    # A learning rate of 1e30 makes step 1's update explode: step 2's loss and gradients are NaN.
    run = tmp_path / "stop"
    proc = train(2, run, *NOISE_OFF, "--optimizer.lr", "1e30", "--checkpoint.interval", "1",
                 "--training.steps", "4", timeout=240)
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
    proc = train(2, run, *NOISE_OFF, "--optimizer.on_nonfinite", "skip", "--checkpoint.interval", "1",
                 "--training.steps", "5", env=env, timeout=240)
    out = output(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "step 3: the gradient norm is NaN or inf; skipped the optimizer step" in out
    assert "skipped the optimizer step" not in out.replace("step 3: the gradient norm is NaN or inf; skipped", "")
    states = {k: checkpoint_state(run / "checkpoint" / f"step-{k}", tmp_path) for k in (2, 3, 4)}
    params = {k: {n: v for n, v in model_tensors(s).items() if n != "recurrence.depth.draws"}
              for k, s in states.items()}
    assert same(params[2], params[3])  # no parameter moved at step 3, on either rank's shard
    # nor any optimizer state (moments, step counts); param_groups hold the lr, which advances
    moments = {k: {n: v for n, v in s["optimizer"].items() if n.startswith("state.")} for k, s in states.items()}
    assert len(moments[2]) > 0 and same(moments[2], moments[3])
    assert not same(moments[3], moments[4])
    assert not same(params[3], params[4])  # step 4 trains again
    losses = scalars(run)["loss_metrics/global_avg_loss"]
    assert sorted(losses) == [1, 2, 3, 4, 5] and all(math.isfinite(v) for v in losses.values())
