"""grt_titan's validator on torchtitan 0.3: the 0.2.2 host's depth-wise validation on 0.3's Validator.

The pass, its reduction, the metrics and the console lines are
grt_titan/components/validate.py's `DepthwiseValidation`, the same code as on 0.2.2, so both
hosts log the same tags (`validation_metrics/loss_r{r}`, `validation_metrics/flops_per_token_r{r}`,
the image `validation_metrics/depth_curve`) and the same `validate step N  loss by depth r: ...`
line, which `grt-titan analyze`, `table` and TensorBoard read alike. What differs is how it is
built: 0.3's validator is the `validator` field of `Trainer.Config`, built by 0.3's Trainer, and
`[grt_metrics] validation_depths` (a section of the trainer's config, `--grt_metrics.*` as on
0.2.2) is handed over by `GRTTrainer` (trainer.py, `wire_sections`).

With the depths off (or a dense flavor) it scores the eval depth alone through the same pass,
so `validation_metrics/loss` is reduced as 0.2.2 reduces it: the mean over batches of each
batch's loss per valid token. (0.3's own Validator divides the summed loss by every batch's
tokens, which differs where batches hold different numbers of completion tokens: masked
prompt/completion data.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import tyro
from torch import nn
from torchtitan.components.validate import Validator
from torchtitan.observability import structured_logger as sl

from grt_titan.components.validate import DepthwiseValidation
from grt_titan.model.recurrence import find_recurrence


class GRTValidator(DepthwiseValidation, Validator):
    """0.3's Validator scoring by depth (`DepthwiseValidation`) on grt_titan's validation loader."""

    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        validation_depths: Annotated[bool, tyro.conf.Suppress] = True
        """`[grt_metrics] validation_depths`, handed over by the trainer: score every depth
        r in {0..R, R+2} at each validation (docs/observability.md)."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.depthwise = config.validation_depths
        # One loader for the run, as on 0.2.2 (0.3's Validator builds one per pass): grt_titan's
        # restarts at the split's first sequence at every pass.
        self.validation_dataloader = self.dl_config.build(
            dp_world_size=self.dp_world_size,
            dp_rank=self.dp_rank,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            local_batch_size=self.local_batch_size,
        )

    @property
    def validation_steps(self) -> int:
        return self.config.steps

    @property
    def validation_seq_len(self) -> int:
        return self.seq_len

    def model_inputs(
        self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor, model_parts: list[nn.Module]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        return self.post_dataloading_process(input_dict, labels, model_parts)

    def summed_loss(self, pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss, _ = self.loss_fn(pred, labels)  # 0.3's loss_fn returns (loss, metrics)
        return loss

    @sl.log_trace_span("eval")
    def validate(self, model_parts: list[nn.Module], step: int) -> None:
        sl.add_step_tag("eval")
        recurrence = find_recurrence(model_parts)
        eval_depth = recurrence.eval_recurrences if recurrence is not None else None
        self.validate_depthwise(model_parts, step, eval_depth, self.depthwise and recurrence is not None)
