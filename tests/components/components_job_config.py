"""grt_titan.job_config's JobConfig plus the `[grt_metrics]` section, as job_config.py
should declare it (`grt_metrics: GRTMetricsConfig = field(default_factory=GRTMetricsConfig)`)."""

from dataclasses import dataclass, field

from grt_titan.components.metrics import GRTMetricsConfig
from grt_titan.job_config import JobConfig as GRTJobConfig


@dataclass
class JobConfig(GRTJobConfig):
    grt_metrics: GRTMetricsConfig = field(default_factory=GRTMetricsConfig)
