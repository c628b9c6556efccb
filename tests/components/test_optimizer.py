"""grt_titan/components/optimizer.py: torchtitan's optimizers with the non-finite guard. A
non-finite gradient norm stops the step naming it, or skips it; either way no parameter
and no optimizer state changes. Through the trainer on 2 ranks:
tests/reliability/test_nonfinite.py."""

from __future__ import annotations

import math

import pytest
from torch import nn

from grt_titan.components.optimizer import NonFiniteGuard, NonFiniteStepError, build_grt_optimizers

from grt_test_helpers import one_rank_dims, parse_config
from tests.nonfinite_cases import (
    backward,
    skip_leaves_parameters_and_optimizer_state_unchanged,
    stop_raises_before_any_update,
    two_linears,
)


def optimizers_for(model: nn.Module, *overrides):
    return build_grt_optimizers([model], parse_config(*overrides).optimizer, one_rank_dims())


def host_optimizers(model: nn.Module, on_nonfinite: str | None):
    """`optimizers_for` as tests/nonfinite_cases.py calls it."""
    return optimizers_for(model, *(() if on_nonfinite is None else ("--optimizer.on_nonfinite", on_nonfinite)))


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_stop_raises_before_any_update(poison):
    stop_raises_before_any_update(host_optimizers, poison)


def test_skip_leaves_parameters_and_optimizer_state_unchanged():
    skip_leaves_parameters_and_optimizer_state_unchanged(host_optimizers)


def test_step_is_named_after_a_restored_optimizer_state():
    model = two_linears()
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


@pytest.fixture
def fake_process_group():
    """torch's "fake" process group, as `--comm.mode fake_backend` starts it (rank 0 of 32)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", rank=0, world_size=32)
    yield
    dist.destroy_process_group()


def test_fake_backend_dry_run_never_stops_for_a_nonfinite_gradient(fake_process_group):
    """No collective moves data there, so a NaN gradient means nothing: no guard, no stop."""
    model = two_linears()
    optimizers = optimizers_for(model)
    assert not [h for h in optimizers._optimizer_step_pre_hooks.values() if isinstance(h, NonFiniteGuard)]
    backward(model, math.nan)
    optimizers.step()


def test_without_the_fake_backend_the_same_step_stops():
    model = two_linears()
    optimizers = optimizers_for(model)
    backward(model, math.nan)
    with pytest.raises(NonFiniteStepError, match=r"^step 1: "):
        optimizers.step()


@pytest.mark.parametrize("mode, fake", [("fake_backend", True), ("default", False), ("local_tensor", False)])
def test_the_job_config_names_a_fake_backend_run(mode, fake):
    from grt_titan.runtime.fake_backend import is_fake_backend

    assert is_fake_backend(parse_config("--comm.mode", mode)) is fake
    assert is_fake_backend() is False  # no process group in this process
