"""torchtitan's Validator, reading the validation split of grt_titan's token shards.

Evaluation runs in eval mode, so the model uses its eval depth (default R) and no noise.
"""

from __future__ import annotations

from torchtitan.components.validate import BaseValidator, Validator
from torchtitan.tools.logging import logger

from grt_titan.data.loader import build_validation_dataloader


class GRTValidator(Validator):
    def __init__(
        self,
        job_config,
        dp_world_size: int,
        dp_rank: int,
        tokenizer,
        parallel_dims,
        loss_fn,
        validation_context,
        maybe_enable_amp,
        metrics_processor,
        pp_schedule=None,
        pp_has_first_stage=None,
        pp_has_last_stage=None,
    ):
        # Validator.__init__ would build torchtitan's HF-datasets loader; set the same
        # fields around our own loader instead.
        BaseValidator.__init__(self, job_config)
        self.tokenizer = tokenizer
        self.parallel_dims = parallel_dims
        self.loss_fn = loss_fn
        self.validation_dataloader = build_validation_dataloader(
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            tokenizer=tokenizer,
            job_config=job_config,
            infinite=job_config.validation.steps != -1,
        )
        self.validation_context = validation_context
        self.maybe_enable_amp = maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.pp_schedule = pp_schedule
        self.pp_has_first_stage = pp_has_first_stage
        self.pp_has_last_stage = pp_has_last_stage
        if job_config.validation.steps == -1:
            logger.warning("validation.steps = -1 may hang if ranks hold unequal sample counts")


def build_grt_validator(job_config, dp_world_size, dp_rank, tokenizer, parallel_dims, loss_fn,
                        validation_context, maybe_enable_amp, metrics_processor=None,
                        pp_schedule=None, pp_has_first_stage=None, pp_has_last_stage=None) -> GRTValidator:
    return GRTValidator(
        job_config, dp_world_size, dp_rank, tokenizer, parallel_dims, loss_fn,
        validation_context, maybe_enable_amp, metrics_processor,
        pp_schedule, pp_has_first_stage, pp_has_last_stage,
    )
