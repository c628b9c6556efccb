"""The non-finite step guard's cases, one body for both hosts' optimizers containers
(tests/components/test_optimizer.py: 0.2.2's builder; tests/torchtitan_0_3/test_nonfinite_guard.py:
0.3's container). `optimizers_for(model, on_nonfinite)` builds the host's container."""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch
from torch import nn

from grt_titan.components.nonfinite import NonFiniteGuard, NonFiniteStepError

from grt_test_helpers import same_values

OptimizersFor = Callable[[nn.Module, str | None], object]


def two_linears() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def backward(model: nn.Module, poison: float | None = None) -> None:
    model.zero_grad()
    model(torch.ones(3, 4)).square().sum().backward()
    if poison is not None:
        model[1].bias.grad[0] = poison


def snapshot(model, optimizers):
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in optimizers.state_dict().items()}
    return params, state


def stop_raises_before_any_update(optimizers_for: OptimizersFor, poison: float) -> None:
    model = two_linears()
    optimizers = optimizers_for(model, None)
    backward(model)
    optimizers.step()  # step 1 is finite
    backward(model, poison)
    before = snapshot(model, optimizers)
    with pytest.raises(NonFiniteStepError, match=r"^step 2: the gradient norm is NaN or inf"):
        optimizers.step()
    after = snapshot(model, optimizers)
    assert same_values(before[0], after[0]) and same_values(before[1], after[1])


def skip_leaves_parameters_and_optimizer_state_unchanged(optimizers_for: OptimizersFor) -> None:
    model = two_linears()
    optimizers = optimizers_for(model, "skip")
    guard = next(h for h in optimizers._optimizer_step_pre_hooks.values() if isinstance(h, NonFiniteGuard))
    backward(model)
    optimizers.step()
    before = snapshot(model, optimizers)
    backward(model, math.nan)
    optimizers.step()  # step 2: skipped
    after = snapshot(model, optimizers)
    assert same_values(before[0], after[0]) and same_values(before[1], after[1])
    assert guard.skipped == 1
    backward(model)
    optimizers.step()  # step 3 trains again; AdamW counts the 2 steps it took
    assert not same_values(after[0], snapshot(model, optimizers)[0])
    assert optimizers.optimizers[0].state[model[0].weight]["step"].item() == 2
