"""Metrics processor whose FLOPs follow the depths actually sampled.

torchtitan fixes `num_flops_per_token` at start-up; for the GRT it depends on r. Before
each log this processor sets it to eq. 1 at the mean depth sampled since the last log
(so MFU and TFLOPS are right), and logs `grt/r_mean` and `grt/r_last`.
"""

from __future__ import annotations

from torchtitan.components.metrics import MetricsProcessor

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.recurrence import DepthSampler


class GRTMetricsProcessor(MetricsProcessor):
    def __init__(self, job_config, parallel_dims, model_args: GRTModelArgs, tag: str | None = None):
        super().__init__(job_config, parallel_dims, tag)
        self.model_args = model_args
        self._sampler: DepthSampler | None = None

    def depth_sampler(self) -> DepthSampler | None:
        if self._sampler is None and self.model_parts:
            self._sampler = next(
                (m for part in self.model_parts for m in part.modules() if isinstance(m, DepthSampler)),
                None,
            )
        return self._sampler

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        extra_metrics = dict(extra_metrics or {})
        sampler = self.depth_sampler()
        if sampler is not None and sampler.history:
            r_mean = sum(sampler.history) / len(sampler.history)
            extra_metrics["grt/r_mean"] = r_mean
            extra_metrics["grt/r_last"] = sampler.history[-1]
            sampler.history.clear()
            self.num_flops_per_token = int(
                self.model_args.train_flops_per_token(self.job_config.training.seq_len, r_mean)
            )
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)


def build_grt_metrics_processor(job_config, parallel_dims, model_args=None, tag=None) -> GRTMetricsProcessor:
    return GRTMetricsProcessor(job_config, parallel_dims, model_args, tag)
