"""`GRTTrainer`: torchtitan 0.3's Trainer with grt_titan's config sections and run record.

It changes no step of 0.3's loop. Its Config adds the host-neutral sections of
grt_titan/sections.py (`--grt.*`, `--data.*`, `--training.trainable`, `--loss_spike.*`), the
checksummed checkpointer (checkpoint.py, `--checkpoint.checksums`) and where the run came
from; `__init__` refuses what this host does not run yet (refusals.py), hands the data
loaders the sections they read and the metrics processor (metrics.py) the resolved model
args, and writes the run record (`grt_run.json`) that `grt-titan export-hf`, `analyze` and
`table` read on either host.

With `[loss_spike] enable`, each step's loss is checked after its last microbatch's backward,
before clipping and the optimizer step, as on 0.2.2 (grt_titan/components/loss_spike.py, the
same monitor, log and saved history): at a spike the job exits for a rewind, and its restart
skips the windows recorded at earlier spikes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any

import torch
import torch.distributed as dist
import tyro
from torchtitan.config import TrainingConfig
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from grt_titan.components.loss_spike import LossHistoryState, build_loss_spike_monitor, config_problems
from grt_titan.data.config import DataConfig
from grt_titan.run_record import build_run_record, write_run_record
from grt_titan.sections import GRTMetricsConfig, GRTSection, LossSpikeConfig
from grt_titan.torchtitan_0_3.checkpoint import GRTCheckpointManager
from grt_titan.torchtitan_0_3.refusals import HostRefusal, refusals
from grt_titan.torchtitan_0_3.view import job_view


@dataclass(kw_only=True, slots=True)
class GRTTrainingConfig(TrainingConfig):
    """0.3's `[training]` plus grt_titan's `trainable` (grt_titan/sections.py, GRTTrainingConfig)."""

    trainable: list[str] = field(default_factory=lambda: ["*"])
    """Parameters the optimizer trains: fnmatch patterns or the shorthands `recurrent`,
    `parts`, `adapter` (docs/training.md). Default: every parameter."""


class GRTTrainer(LossHistoryState, Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        grt: GRTSection = field(default_factory=GRTSection)
        """The `[grt]` section: model overrides (unset keeps the flavor's value)."""
        data: DataConfig = field(default_factory=DataConfig)
        """The `[data]` section: grt_titan's token-shard data path."""
        grt_metrics: GRTMetricsConfig = field(default_factory=lambda: GRTMetricsConfig(validation_depths=False))
        """The `[grt_metrics]` section: gate metrics on log steps. The depth-wise validation
        curve (`validation_depths`) is 0.2.2's only: off here, refused when asked for."""
        training: GRTTrainingConfig = field(default_factory=GRTTrainingConfig)
        checkpoint: GRTCheckpointManager.Config = field(default_factory=GRTCheckpointManager.Config)
        """0.3's `[checkpoint]` plus grt_titan's `checksums` (checkpoint.py)."""
        loss_spike: LossSpikeConfig = field(default_factory=LossSpikeConfig)
        """The `[loss_spike]` section: rewind to the last checkpoint at a loss spike."""
        description: str = ""
        """`[job] description` of the TOML."""
        config_file: Annotated[str, tyro.conf.Suppress] = ""
        forwards_per_step: Annotated[int, tyro.conf.Suppress] = 1

    def __init__(self, config: Config):
        problems = refusals(config)
        if problems:
            raise HostRefusal(problems[0] if len(problems) == 1 else "\n".join(problems))
        problems = config_problems(config.loss_spike, config.checkpoint.enable)
        if problems:
            raise ValueError("\n".join(problems))
        wire_sections(config)
        super().__init__(config)
        # 0.3's Trainer builds the metrics processor without the model args, which price the
        # sampled depths (r-aware FLOPs): hand the resolved ones over before the first step.
        self.metrics_processor.attach_model(self.model_config.args, config.training.seq_len)
        spike_folder = os.path.join(config.dump_folder, config.checkpoint.folder)
        self.loss_spike = build_loss_spike_monitor(self, config, spike_folder)
        self.write_run_record()

    def forward_backward_step(self, **kwargs: Any) -> torch.Tensor:
        """0.3's, with each microbatch's loss handed to the loss-spike monitor, which checks
        the step after its last one (before clipping and the optimizer step)."""
        loss = super().forward_backward_step(**kwargs)
        if self.loss_spike is not None:
            self.loss_spike.after_microbatch(loss)
        return loss

    def write_run_record(self) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        view = job_view(self.config)
        batch_degree = self.parallel_dims.dp_replicate * self.parallel_dims.dp_shard
        world = dist.get_world_size() if dist.is_initialized() else 1
        record = build_run_record(view, self.model_config.args, world_size=world, batch_degree=batch_degree)
        path = write_run_record(self.config.dump_folder, record)
        logger.info(f"Run record: {path}")


def wire_sections(config: GRTTrainer.Config) -> None:
    """What the data loaders, the depth sampler and the parallel plans read of the whole
    config, handed to them before torchtitan builds them (each sees only its own fields)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))  # every rank is a data-parallel rank here
    training = config.training
    global_batch = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * world
    config.forwards_per_step = max(1, global_batch // (training.local_batch_size * world))
    for loader in (config.dataloader, config.validator.dataloader):
        loader.data = config.data
    config.metrics.grt_metrics = config.grt_metrics
    config.dataloader.global_batch_size = training.global_batch_size
    config.dataloader.step_targets = config.grt.step_supervision is True
    spec = config.model_spec
    if not isinstance(spec.parallelize_fn, partial):
        spec.parallelize_fn = partial(spec.parallelize_fn, grt=config.grt)
