"""torchtitan's optimizers, built for the GRT (see docs/reliability.md)."""

from __future__ import annotations

from torchtitan.components.optimizer import build_optimizers


def build_grt_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager=None):
    """The spec's build_optimizers_fn: torchtitan's optimizers container."""
    return build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
