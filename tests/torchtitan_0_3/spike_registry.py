"""A torchtitan 0.3 config module for the loss-spike test: grt_titan's grt_debug preset, trained
by a GRTTrainer whose logged loss of step GRT_TEST_SPIKE_STEP is x 50 on the first attempt (a
planted spike, as tests/reliability/reliability_worker.py plants one on 0.2.2).

    torchrun ... -m torchtitan.train --module tests.torchtitan_0_3.spike_registry --config grt_debug
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch

from grt_titan.config_registry import preset
from grt_titan.torchtitan_0_3.trainer import GRTTrainer


def spike_step() -> int | None:
    """GRT_TEST_SPIKE_STEP on torchrun's first attempt (read in the rank, not at import)."""
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    return int(os.environ.get("GRT_TEST_SPIKE_STEP", "0")) if first_attempt else None


class SpikeTrainer(GRTTrainer):
    @dataclass(kw_only=True, slots=True)
    class Config(GRTTrainer.Config):
        pass

    def _forward_backward_body(self, *args) -> torch.Tensor:
        loss = super()._forward_backward_body(*args)
        return loss * 50 if self.step == spike_step() else loss


def grt_debug() -> SpikeTrainer.Config:
    config = preset("grt_debug")
    return SpikeTrainer.Config(**{f.name: getattr(config, f.name) for f in fields(config)})
