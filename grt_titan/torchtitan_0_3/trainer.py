"""`GRTTrainer`: torchtitan 0.3's Trainer with grt_titan's config sections and run record.

Its Config adds the host-neutral sections of grt_titan/sections.py (`--grt.*`, `--data.*`,
`--training.trainable`, `--loss_spike.*`), the checksummed checkpointer (checkpoint.py,
`--checkpoint.checksums`), the optimizers with the non-finite step guard (optimizer.py,
`--optimizer.on_nonfinite`) and where the run came from; `__init__` refuses what this host does
not run yet (refusals.py), runs 0.2.2's start-up checks (checks.py), hands the data
loaders the sections they read and the metrics processor (metrics.py) the resolved model
args, and writes the run record (`grt_run.json`) that `grt-titan export-hf`, `analyze` and
`table` read on either host.

With `[loss_spike] enable`, each step's loss is checked after its last microbatch's backward,
before clipping and the optimizer step, as on 0.2.2 (grt_titan/components/loss_spike.py, the
same monitor, log and saved history): at a spike the job exits for a rewind, and its restart
skips the windows recorded at earlier spikes.

Of 0.3's loop it changes one thing: with `[optimizer] on_nonfinite = "skip"`, a step the guard
skipped trains on where 0.3 would stop at its non-finite logged loss (`train_step`).
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
from grt_titan.config_checks import forwards_per_step
from grt_titan.data.config import DataConfig
from grt_titan.run_record import build_run_record, write_run_record
from grt_titan.sections import GRTMetricsConfig, GRTSection, LossSpikeConfig
from grt_titan.torchtitan_0_3.checkpoint import GRTCheckpointManager
from grt_titan.torchtitan_0_3.checks import check_config, check_view
from grt_titan.torchtitan_0_3.optimizer import GRTOptimizersContainer
from grt_titan.torchtitan_0_3.refusals import HostRefusal, refusals
from grt_titan.torchtitan_0_3.validate import GRTValidator
from grt_titan.torchtitan_0_3.view import job_view

# How 0.3's train_step stops at a non-finite logged loss (a RuntimeError).
NONFINITE_LOSS = "Loss is not finite"


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
        grt_metrics: GRTMetricsConfig = field(default_factory=GRTMetricsConfig)
        """The `[grt_metrics]` section: gate metrics on log steps and the depth-wise validation
        curve (`validation_depths`), as on 0.2.2."""
        training: GRTTrainingConfig = field(default_factory=GRTTrainingConfig)
        checkpoint: GRTCheckpointManager.Config = field(default_factory=GRTCheckpointManager.Config)
        """0.3's `[checkpoint]` plus grt_titan's `checksums` (checkpoint.py)."""
        validator: GRTValidator.Config = field(default_factory=GRTValidator.Config)
        """0.3's `[validator]`, scoring every depth with `[grt_metrics] validation_depths` (validate.py)."""
        loss_spike: LossSpikeConfig = field(default_factory=LossSpikeConfig)
        """The `[loss_spike]` section: rewind to the last checkpoint at a loss spike."""
        optimizer: GRTOptimizersContainer.Config = field(default_factory=GRTOptimizersContainer.Config)
        """0.3's `[optimizer]` plus grt_titan's non-finite step guard (`on_nonfinite`, optimizer.py)."""
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
        check_config(config)  # 0.2.2's start-up checks (checks.py), before anything is built
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

    def train_step(self, data_iterator) -> None:
        """0.3's. A step that the non-finite guard skipped (`[optimizer] on_nonfinite = "skip"`,
        optimizer.py) trains on where 0.3's own check of a logged loss would stop the run: its
        loss is NaN or inf, and nothing changed; the loss is not logged."""
        try:
            super().train_step(data_iterator)
        except RuntimeError as error:
            guard = getattr(self.optimizers, "nonfinite_guard", None)
            if guard is None or not guard.skipped_last or not str(error).startswith(NONFINITE_LOSS):
                raise
            logger.warning(f"step {self.step}: the loss is NaN or inf; not logged (a skipped step)")

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
    training = config.training
    # Over the data-parallel degree, as on 0.2.2 (under TP not every rank is a data-parallel one).
    config.forwards_per_step = forwards_per_step(check_view(config))
    for loader in (config.dataloader, config.validator.dataloader):
        loader.data = config.data
    config.metrics.grt_metrics = config.grt_metrics
    config.validator.validation_depths = config.grt_metrics.validation_depths
    config.dataloader.global_batch_size = training.global_batch_size
    config.dataloader.step_targets = config.grt.step_supervision is True
    spec = config.model_spec
    if not isinstance(spec.parallelize_fn, partial):
        spec.parallelize_fn = partial(spec.parallelize_fn, grt=config.grt)
