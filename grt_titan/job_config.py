"""torchtitan 0.2.2's JobConfig with grt_titan's sections (grt_titan/sections.py) merged in.

No `from __future__ import annotations` here: torchtitan resolves these types at parse time.

Selected with `[job] custom_config_module = "grt_titan.job_config"` (torchtitan 0.2.2's
`experimental.custom_args_module` route rejects new sections).
"""

import inspect
import sys
from dataclasses import dataclass, field, fields, is_dataclass

from torchtitan.components.ft.config import FaultTolerance as FTSemiSyncConfig
from torchtitan.config import ConfigManager

from grt_titan.data.config import DataConfig
from grt_titan.sections import (
    DistillConfig,
    GRTCheckpointConfig,
    GRTMetricsConfig,
    GRTModelDefaults,
    GRTOptimizerConfig,
    GRTSection,
    GRTTrainingConfig,
    LossSpikeConfig,
)


@dataclass
class FaultToleranceConfig(FTSemiSyncConfig):
    """torchtitan's `[fault_tolerance]` (with torchft's DiLoCo keys, torchtitan's
    components/ft/config) and where the lighthouse is (docs/fault_tolerance.md)."""

    lighthouse: str = ""
    """The torchft lighthouse, `http://host:29510`; empty: torchft's TORCHFT_LIGHTHOUSE variable."""

    lighthouse_timeout_seconds: float = 60.0
    """How long a replica group waits at start-up for the lighthouse to answer before it stops."""

    quorum_retries: int = 20
    """Quorum requests a group retries while the lighthouse is unreachable (a lighthouse
    restart) before it stops; torchft's own default, 0, stops every group at the first miss.
    TORCHFT_QUORUM_RETRIES, when set, wins."""


@dataclass
class JobConfig:
    model: GRTModelDefaults = field(default_factory=GRTModelDefaults)
    grt: GRTSection = field(default_factory=GRTSection)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: GRTOptimizerConfig = field(default_factory=GRTOptimizerConfig)
    training: GRTTrainingConfig = field(default_factory=GRTTrainingConfig)
    checkpoint: GRTCheckpointConfig = field(default_factory=GRTCheckpointConfig)
    loss_spike: LossSpikeConfig = field(default_factory=LossSpikeConfig)
    grt_metrics: GRTMetricsConfig = field(default_factory=GRTMetricsConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)


# The module the merged config classes are filed under: the one name that inspect, tyro and
# docstring_parser all take as "no source to read" (GRTConfigManager's docstring says why).
MERGED_MODULE = "builtins"


class GRTConfigManager(ConfigManager):
    """torchtitan's ConfigManager without its per-field source lookups: used by
    `grt_titan.train`, the teacher, checkpoints.job_files.parse_job_config and the tests.

    torchtitan merges `[job] custom_config_module`'s JobConfig into its own with
    `make_dataclass`, once per parse; the new classes (MergedJobConfig, MergedTraining, ...)
    belong to no module's source (Python 3.11 files them under `types`, later ones under the
    module that called `make_dataclass`). tyro looks up each of their fields' comments with
    `inspect.getsource`, which parses that module's whole file to find the class, fails, and
    is asked again for the next field: tyro keeps no failure and empties its caches after every
    parse. That is about half of each parse's CPU (docs/training.md, "Start-up"), paid by every
    rank of every job. Filed under `builtins`, the merged classes are skipped at once (no field
    comments from them, as before), so `--help` reads the same. It can go when torchtitan's
    merged classes carry a source or tyro remembers a class without one:
    tests/test_job_config.py fails when torchtitan's own parse stops looking them up."""

    def _maybe_add_custom_config(self, args: list[str], toml_values: dict | None):
        config_cls = super()._maybe_add_custom_config(args, toml_values)
        _mark_sourceless(config_cls)
        return config_cls


class RecordedConfigManager(GRTConfigManager):
    """GRTConfigManager reading a 0.2.2 run record's resolved `job_config` where it would read
    the TOML (`_maybe_load_toml`, the one method replaced): the values the run started with,
    its command-line overrides included (grt_titan.checkpoints.job_files.parse_job_config)."""

    def __init__(self, values: dict):
        super().__init__()
        self._values = values

    def _maybe_load_toml(self, args: list[str]) -> dict:
        return self._values


def _mark_sourceless(config_cls: type) -> None:
    """Files the merged classes of `config_cls` (itself included) in MERGED_MODULE. A dataclass
    without a docstring gets one naming its fields' types, which tyro recognises and leaves out
    of `--help`; renamed modules change those names, so such docstrings are written again."""
    merged = _merged_classes(config_cls)
    generated = [cls for cls in merged if cls.__doc__ == _dataclass_docstring(cls)]
    for cls in merged:
        cls.__module__ = MERGED_MODULE
    for cls in generated:
        cls.__doc__ = _dataclass_docstring(cls)


def _merged_classes(cls: type) -> list[type]:
    """`cls` and the section classes under it that their modules do not hold by name (made at
    run time)."""
    held = sys.modules.get(cls.__module__)
    for name in cls.__qualname__.split("."):
        held = getattr(held, name, None)
    if held is cls:
        return []
    sections = [f.type for f in fields(cls) if isinstance(f.type, type) and is_dataclass(f.type)]
    return [cls, *(merged for section in sections for merged in _merged_classes(section))]


def _dataclass_docstring(cls: type) -> str:
    """The docstring `dataclasses` gives a class that has none."""
    return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
