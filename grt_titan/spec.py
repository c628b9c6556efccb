"""The `grt` TrainSpec of torchtitan 0.2.2: its components plus the GRT's model, plans and metrics.

Importing this module registers the spec (torchtitan 0.2.2 imports it through `custom_import =
"grt_titan"`, grt_titan/__init__.py).

What the GRT needs beyond torchtitan's own components is wired here too, where the spec is
built: the flavors are `JobModelArgs`, whose `update_from_config` (torchtitan's Trainer calls
it) also takes the job's forwards per step and runs the start-up checks; and the spec names
the distillation teacher's builder, which `GRTTrainer` calls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from torch import nn
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.protocols.train_spec import TrainSpec, get_train_spec, register_train_spec

from grt_titan.components.checkpoint import ShardedGRTStateDictAdapter
from grt_titan.components.loss import build_grt_loss
from grt_titan.components.metrics import build_grt_metrics_processor
from grt_titan.components.optimizer import build_grt_optimizers
from grt_titan.components.validate import build_grt_validator
from grt_titan.config_checks import Flavors, check_job_config, forwards_per_step
from grt_titan.data.loader import build_dataloader
from grt_titan.infra.parallelize import parallelize_grt
from grt_titan.model import GRTModel, GRTModelArgs, grt_flavors
from grt_titan.teacher import build_teacher
from grt_titan.tokenizer import build_tokenizer

SPEC_NAME = "grt"


class JobModelArgs(GRTModelArgs):
    """GRTModelArgs as torchtitan 0.2.2's Trainer gets them: `update_from_config` also takes
    the job's training forwards per optimizer step and ends in the whole-job start-up checks.
    The trainer calls it after the process group, tokenizer and dataloader exist and before
    the model is built, the one moment to report every problem of a job at once; the args
    themselves (a leaf of the layer order) import no checks."""

    @classmethod
    def of(cls, args: GRTModelArgs) -> JobModelArgs:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args)})

    def update_from_config(self, job_config, **kwargs) -> None:
        # The depth curriculum counts optimizer steps, the depth sampler forwards.
        self.forwards_per_step = forwards_per_step(job_config)
        super().update_from_config(job_config, **kwargs)
        check_job_config(job_config, self)


class JobFlavors(Flavors):
    """The spec's `model_args`: each flavor (or flavor file) as a fresh JobModelArgs, since
    torchtitan's Trainer updates the args it looks up in place."""

    def __getitem__(self, flavor: str) -> JobModelArgs:
        return JobModelArgs.of(super().__getitem__(flavor))


@dataclass
class GRTTrainSpec(TrainSpec):
    """torchtitan's TrainSpec plus the `[distill]` teacher's builder, (job_config,
    parallel_dims) -> frozen sharded module, which `GRTTrainer` calls (grt_titan/teacher.py
    reads hf/ and shards with infra/, which the trainer in components/ may not import)."""

    build_teacher_fn: Callable[..., nn.Module] | None = None


def build_grt_train_spec() -> GRTTrainSpec:
    return GRTTrainSpec(
        model_cls=GRTModel,
        model_args=JobFlavors(grt_flavors),
        parallelize_fn=parallelize_grt,
        # A shared core cannot be split across pipeline stages; pp > 1 fails at start-up.
        pipelining_fn=None,
        build_optimizers_fn=build_grt_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_grt_loss,
        build_validator_fn=build_grt_validator,
        build_metrics_processor_fn=build_grt_metrics_processor,
        state_dict_adapter=ShardedGRTStateDictAdapter,
        build_teacher_fn=build_teacher,
    )


def register() -> None:
    """Register `grt` once; importing grt_titan again (or reloading) is harmless."""
    try:
        get_train_spec(SPEC_NAME)
    except ValueError:
        register_train_spec(SPEC_NAME, build_grt_train_spec())


register()
