"""The non-finite step guard, one hook for both hosts' optimizers (docs/reliability.md).

Both torchtitan releases train a step as: forward/backward -> `clip_grad_norm_` (total norm
over all ranks) -> `optimizers.step()` -> `lr_schedulers.step()` -> checkpoint save. A
non-finite loss makes the gradients non-finite, and clipping by a non-finite total norm
spreads it: a NaN norm multiplies every gradient by NaN; an inf norm multiplies every
gradient by 0, leaving NaN only where a gradient was inf (on the rank that holds it).
Stepping would write NaN weights, and the next checkpoint would save them.

The guard is a step pre-hook on torchtitan's optimizers container (0.2.2's, installed by
components/optimizer.py; 0.3's, by torchtitan_0_3/optimizer.py), so it runs after clipping
and before any parameter or optimizer state changes. Each rank measures its local gradient
shards and one scalar all-reduce (MAX) makes the verdict global: every rank stops, or every
rank skips, together. Cost per step: one pass over the local gradients (like the clip's
norm), one scalar all-reduce and one host sync.

`[optimizer] on_nonfinite`:
- `stop` (default): raise `NonFiniteStepError` naming the step. Nothing is updated and the
  exception leaves the train loop before the checkpoint save of that step.
- `skip`: drop every gradient (`grad = None`), so the optimizer neither moves a parameter
  nor touches its state (AdamW's moments and step count, weight decay); warn naming the
  step. The learning-rate schedule still advances.

Under torchtitan's fake backend (`--comm.mode fake_backend`, a dry run) no collective moves
data, so gradients can be NaN/inf without anything being wrong: the guard is not installed
there and a dry run never stops for a non-finite value (grt_titan/runtime/fake_backend.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torchtitan.tools.logging import logger

from grt_titan.runtime.fake_backend import is_fake_backend

NonFinitePolicy = Literal["stop", "skip"]


class NonFiniteStepError(FloatingPointError):
    """A training step produced a NaN/inf gradient norm under `on_nonfinite = "stop"`."""


class NonFiniteGuard:
    """Optimizer step pre-hook: stop or skip a step whose gradients are not all finite.

    `optimizers` is either host's OptimizersContainer (an Optimizer holding its per-part
    optimizers in `.optimizers`). Steps are named as torchtitan numbers them (1-based). The
    count starts from the optimizer state: the step count of the (restored) AdamW state plus
    the steps this process has taken or skipped. Steps skipped before a checkpoint are not in
    that state, so after resuming a run that skipped steps, the number is lower by those skips.
    """

    def __init__(self, optimizers: Optimizer, policy: NonFinitePolicy):
        assert policy in get_args(NonFinitePolicy), "[optimizer] on_nonfinite is checked at start-up"
        self.optimizers = optimizers
        self.policy = policy
        self.calls = 0  # optimizer steps (taken or skipped) in this process
        self.skipped = 0
        self.skipped_last = False  # whether the latest step was skipped
        self._restored_steps: int | None = None

    def _params(self) -> Iterator[tuple[Optimizer, list[torch.Tensor]]]:
        for optimizer in self.optimizers.optimizers:
            for group in optimizer.param_groups:
                yield optimizer, group["params"]

    def _local_grads(self) -> list[torch.Tensor]:
        grads = []
        for _, params in self._params():
            for p in params:
                if p.grad is not None:
                    g = p.grad
                    grads.append(g.to_local() if isinstance(g, DTensor) else g)
        return grads

    def nonfinite(self) -> bool:
        """True on every rank if any rank holds a NaN/inf gradient (or their norm overflows)."""
        grads = [g for g in self._local_grads() if g.numel()]
        if grads:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            flag = (~torch.isfinite(norm)).to(torch.float32)
        else:
            device = next(p.device for _, ps in self._params() for p in ps)
            flag = torch.zeros((), dtype=torch.float32, device=device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _steps_before_this_process(self) -> int:
        """Optimizer steps recorded in the (possibly restored) optimizer state."""
        for optimizer, params in self._params():
            for p in params:
                state = optimizer.state.get(p)
                if state and "step" in state:
                    step = state["step"]
                    return int(step.item() if isinstance(step, torch.Tensor) else step)
        return 0

    def __call__(self, optimizer: Optimizer, args: tuple, kwargs: dict[str, Any]) -> None:
        if self._restored_steps is None:
            self._restored_steps = self._steps_before_this_process()
        self.calls += 1
        self.skipped_last = False
        step = self._restored_steps + self.calls
        if not self.nonfinite():
            return None
        if self.policy == "stop":
            raise NonFiniteStepError(
                f"step {step}: the gradient norm is NaN or inf (a non-finite loss or "
                "gradient). Stopped before the optimizer step: no parameter changed and no "
                f"checkpoint is written for step {step}. Lower the learning rate or resume "
                'from an earlier checkpoint; [optimizer] on_nonfinite = "skip" skips such '
                "steps instead."
            )
        self._skip(step)
        return None

    def _skip(self, step: int) -> None:
        for _, params in self._params():
            for p in params:
                p.grad = None
        self.skipped += 1
        self.skipped_last = True
        logger.warning(
            f"step {step}: the gradient norm is NaN or inf; skipped the optimizer step "
            '([optimizer] on_nonfinite = "skip"): no parameter or optimizer state changed, '
            f"the learning-rate schedule advanced. {self.skipped} step(s) skipped so far."
        )


def install_nonfinite_guard(optimizers: Optimizer, policy: NonFinitePolicy) -> NonFiniteGuard | None:
    """Register the guard on a built optimizers container (none on the fake backend, whose
    gradients are not real; its start-up line says so)."""
    if is_fake_backend():
        return None
    guard = NonFiniteGuard(optimizers, policy)
    optimizers.register_step_pre_hook(guard)
    return guard
