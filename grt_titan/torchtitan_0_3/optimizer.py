"""`GRTOptimizersContainer`: torchtitan 0.3's OptimizersContainer with grt_titan's non-finite
step guard (`[optimizer] on_nonfinite`), the same hook as on 0.2.2 (components/nonfinite.py).

0.3 checks a non-finite loss itself only on logged steps and after the optimizer step, so a
NaN reaches the weights, and the checkpoints of the steps between logs. The guard runs on
every step, before the optimizer: `stop` raises there, `skip` drops the step on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torchtitan.components.optimizer import OptimizersContainer

from grt_titan.components.nonfinite import NonFiniteGuard, NonFinitePolicy, install_nonfinite_guard


@dataclass
class OptimizerKeys:
    """0.2.2's `[optimizer]` keys and defaults: recipe.optimizer_config fills 0.3's catch-all param
    group from them, and checks.py reads them back (0.3 keeps them in a dict that no type reaches)."""

    name: str = "AdamW"
    lr: float = 8e-4
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1


class GRTOptimizersContainer(OptimizersContainer):
    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        on_nonfinite: NonFinitePolicy = "stop"
        """A step whose gradient norm is NaN or inf: `stop` raises before the optimizer step,
        naming the step; `skip` leaves parameters and optimizer state unchanged on every rank
        and trains on (grt_titan/sections.py, GRTOptimizerConfig, 0.2.2's field)."""

    def __init__(self, config: Config, *, model_parts: list[nn.Module]) -> None:
        super().__init__(config, model_parts=model_parts)
        self.nonfinite_guard: NonFiniteGuard | None = install_nonfinite_guard(self, config.on_nonfinite)
