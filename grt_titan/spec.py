"""The `grt` TrainSpec of torchtitan 0.2.2: its components plus the GRT's model, plans and metrics.

Importing this module registers the spec (torchtitan 0.2.2 imports it through `custom_import =
"grt_titan"`, grt_titan/__init__.py).
"""

from __future__ import annotations

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
from grt_titan.tokenizer import build_tokenizer

SPEC_NAME = "grt"


def build_grt_train_spec() -> TrainSpec:
    return TrainSpec(
        model_cls=GRTModel,
        model_args=Flavors(grt_flavors),
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
    )


def register() -> None:
    """Register `grt` once; importing grt_titan again (or reloading) is harmless."""
    GRTModelArgs.job_config_check = check_job_config
    GRTModelArgs.job_forwards_per_step = forwards_per_step
    try:
        get_train_spec(SPEC_NAME)
    except ValueError:
        register_train_spec(SPEC_NAME, build_grt_train_spec())


register()
