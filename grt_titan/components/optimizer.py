"""torchtitan 0.2.2's optimizers for the GRT, guarded against non-finite steps: the spec's
`build_optimizers_fn` (the guard itself, shared with torchtitan 0.3: components/nonfinite.py;
docs/reliability.md)."""

from __future__ import annotations

from torchtitan.components.optimizer import OptimizersContainer, build_optimizers
from torchtitan.tools.logging import logger

from grt_titan.components.nonfinite import NonFiniteGuard, NonFiniteStepError, install_nonfinite_guard

__all__ = ["NonFiniteGuard", "NonFiniteStepError", "build_grt_optimizers"]


def build_grt_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager=None) -> OptimizersContainer:
    """torchtitan's container plus the non-finite guard of `[optimizer] on_nonfinite` (grt_titan's
    field, merged into 0.2.2's `[optimizer]`: this builder receives only that section)."""
    optimizers = build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
    policy = getattr(optimizer_config, "on_nonfinite", "stop")
    if optimizer_config.early_step_in_backward:
        # Each parameter steps inside backward, before any norm exists: nothing to guard.
        logger.warning(
            "[optimizer] early_step_in_backward: the non-finite step guard "
            f"(on_nonfinite = {policy!r}) cannot run and is off"
        )
        return optimizers
    install_nonfinite_guard(optimizers, policy)
    return optimizers
