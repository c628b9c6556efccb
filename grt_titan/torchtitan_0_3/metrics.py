"""grt_titan's metrics processor on torchtitan 0.3: the 0.2.2 host's, on 0.3's constructor.

The GRT's part (gate metrics `grt/r`, `grt_gate_mean/step{i}`, ..., the `grt  r: ...` console
line, r-aware FLOPs and MFU, `mfu: n/a (CPU)`) is grt_titan/components/metrics.py's
`GRTMetricsMixin`, the same code as on 0.2.2, so both hosts log the same tags. What differs
is how it is built: 0.3's Trainer calls `config.metrics.build(parallel_dims=..., ...)`
without the model args, which price the sampled depths, so `GRTTrainer` hands the resolved
ones over right after its `__init__` (`attach_model`), before the first step. The 0.2.2
host's builder prints the `Training depth` line; here `attach_model` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import torch.distributed as dist
import tyro
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger

from grt_titan.components.metrics import GRTMetricsMixin, depth_line
from grt_titan.model.args import GRTModelArgs
from grt_titan.runtime.fake_backend import NOTICE as FAKE_BACKEND_NOTICE
from grt_titan.runtime.fake_backend import is_fake_backend
from grt_titan.sections import GRTMetricsConfig


def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


class GRTMetricsProcessor(GRTMetricsMixin, MetricsProcessor):
    """torchtitan 0.3's MetricsProcessor plus the GRT's metrics (GRTMetricsMixin)."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        grt_metrics: Annotated[GRTMetricsConfig, tyro.conf.Suppress] = field(default_factory=GRTMetricsConfig)
        """The config's `[grt_metrics]` section (`--grt_metrics.*`, as on 0.2.2), handed over by
        the trainer: `enable` switches the gate metrics (False installs no hook)."""

    def __init__(self, config: Config, *, parallel_dims, **kwargs) -> None:
        # The process group is up (0.3's Trainer builds this after it): it tells a dry run.
        fake_backend = is_fake_backend()
        if fake_backend:
            logger.info(FAKE_BACKEND_NOTICE)
        # The model args and seq_len come with attach_model, before the first log.
        self.init_grt(None, config.grt_metrics, 0, fake_backend)
        super().__init__(config, parallel_dims=parallel_dims, **kwargs)
        self.hide_mfu_if_meaningless()

    def attach_model(self, args: GRTModelArgs, seq_len: int) -> None:
        """The resolved model args (`[grt]` applied) and the training sequence length, which
        price the sampled depths in `log`; rank 0 prints the 0.2.2 host's `Training depth`
        line."""
        self.model_args = args
        self.seq_len = seq_len
        if args.is_recurrent and _rank0():
            logger.info(depth_line(args, seq_len))
