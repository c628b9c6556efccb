"""The GRT as a torchtitan 0.3 model: a `BaseModel` whose Config holds the flavor and the
resolved args, its parallelize function and its `ModelSpec`.

The module tree is grt_titan's own GRTModel, unchanged, so parameter names, checkpoints and
exports are those of the 0.2.2 host. 0.3's `verify_module_protocol` asks every submodule to be
a torchtitan `Module`; the GRT's blocks are plain nn.Modules (a core that no host owns), so
the check is skipped, as that method's docstring allows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed.compile import apply_compile
from torchtitan.protocols import BaseModel
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.tools.logging import logger

from grt_titan.infra.parallelize import (
    checkpoint_recurrence_step,
    checkpointed_stacks,
    compile_recurrence_step,
    freeze_untrained_parameters,
    noise_rank,
    shard_data_parallel,
)
from grt_titan.infra.torch_workarounds import checkpoint_only_where_gradients_flow
from grt_titan.model import GRTModel, GRTModelArgs
from grt_titan.run_reader import flavor_args
from grt_titan.sections import GRTSection
from grt_titan.torchtitan_0_3.view import MODEL_NAME, job_view


class GRTHostModel(GRTModel, BaseModel):
    """GRTModel built from a 0.3 Config (`config.build()` on the meta device)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseModel.Config):
        flavor: str = "debug"
        args: GRTModelArgs | None = None
        """The flavor's args after `[grt]` overrides: set by `update_from_config`."""

        def update_from_config(self, *, config, **kwargs) -> None:
            """Apply `[grt]` and `training.seq_len` as the 0.2.2 host does (the same
            `GRTModelArgs.update_from_config`, on the config's 0.2.2-shaped view)."""
            view = job_view(config)
            args = flavor_args(self.flavor, source="[model] flavor")
            args.update_from_config(view)
            args.forwards_per_step = view.forwards_per_step
            self.args = args

        def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
            return self.args.get_nparams_and_flops(model, seq_len)

        def to_dict(self) -> dict:
            args = None if self.args is None else dataclasses.asdict(self.args)
            return {"flavor": self.flavor, "args": args}

    def __init__(self, config: Config):
        if config.args is None:
            raise RuntimeError("GRTHostModel.Config.args is unset: torchtitan's Trainer calls update_from_config first")
        GRTModel.__init__(self, config.args)

    def verify_module_protocol(self) -> None:
        """Skipped: the GRT's modules are host-neutral nn.Modules (module docstring)."""

    def init_weights(self, buffer_device: torch.device | None = None, **kwargs) -> None:
        GRTModel.init_weights(self, buffer_device=buffer_device)


def parallelize_grt(
    model: GRTHostModel,
    *,
    parallel_dims,
    training,
    parallelism,
    compile_config,
    ac_config,
    dump_folder: str,
    grt: GRTSection,
) -> GRTHostModel:
    """0.3's parallelize_fn, in the 0.2.2 host's order and with its plans (grt_titan/infra/):
    AC -> compile -> FSDP2/HSDP. `grt` is bound by the trainer (`[grt] recurrence_checkpoint`,
    `core_reshard_after_forward`). TP is refused at start-up on this host (recipe.py)."""
    assert not parallel_dims.tp_enabled and not parallel_dims.cp_enabled, "refused at start-up (recipe.py)"
    job = SimpleNamespace(training=training)  # what the 0.2.2 host's helpers read of a job
    if model.recurrence is not None and dist.is_initialized():
        model.recurrence.noise_rank = noise_rank(job)  # noise of forward t from (depth_seed, t, rank)
    # `[training] trainable` (our TrainingConfig's field): before FSDP registers the parameters.
    freeze_untrained_parameters(model, job)
    compile_enabled = compile_config.enable and "model" in compile_config.components
    if ac_config is not None:
        apply_ac(model, ac_config, grt.recurrence_checkpoint, dump_folder, compile_enabled)
    if compile_enabled:
        for stack in (model.prelude, model.coda):
            if len(stack.layers):
                apply_compile(stack, compile_config=compile_config, parallel_dims=parallel_dims)
        compile_recurrence_step(model, compile_config.backend, in_place=True)
    if parallel_dims.fsdp_enabled:
        shard_data_parallel(
            model,
            parallel_dims,
            job,
            pp_enabled=False,
            reshard_after_forward_policy=parallelism.fsdp_reshard_after_forward,
            core_reshard_after_forward=bool(grt.core_reshard_after_forward),
        )
        logger.info(f"Applied {'HSDP' if parallel_dims.dp_replicate_enabled else 'FSDP'} to the GRT")
    return model


def apply_ac(
    model: GRTHostModel, ac_config, recurrence_checkpoint: str, dump_folder: str, compile_enabled: bool
) -> None:
    """0.3's AC policy on every block (its `apply` walks a module's `layers`, as our
    BlockStacks hold them); with `[grt] recurrence_checkpoint = "step"`, each recurrence step
    is one region instead of its core blocks."""
    policy = ac_config.build(dump_folder=dump_folder)
    for stack in checkpointed_stacks(model, recurrence_checkpoint):
        policy.apply(stack)
    if model.recurrence is not None and recurrence_checkpoint == "step":
        checkpoint_recurrence_step(model, ac_config)
    if compile_enabled and not all(p.requires_grad for p in model.parameters()):
        wrapped = checkpoint_only_where_gradients_flow(model)
        logger.info(
            f"Frozen parameters under compile: {wrapped} checkpointed regions run unchecked where no gradient reaches them"
        )


class EveryNthBlockAC(FullAC):
    """0.2.2's layer-frequency selective AC (`selective_ac_option = "N"`, its default "2"),
    which 0.3 dropped: every Nth block, counted across the model's stacks as 0.2.2 counts
    them, is checkpointed whole."""

    @dataclass(kw_only=True, slots=True)
    class Config(FullAC.Config):
        every: int = 2

    def __init__(self, config: Config, dump_folder: str = ""):
        super().__init__(config, dump_folder)
        self.seen = 0

    def _wrap_block(self, module: nn.Module, *, base_fqn: str | None = None) -> nn.Module:
        self.seen += 1
        if self.config.every and self.seen % self.config.every:
            return module
        return FullAC._wrap_block(self, module, base_fqn=base_fqn)


def model_spec(flavor: str) -> ModelSpec:
    """The `grt` ModelSpec of one flavor. A shared core cannot be split across pipeline
    stages (no pipelining_fn); the HF state-dict adapter is not wired on this host yet.
    `parallelize_fn` takes the `[grt]` section too: the trainer binds it (trainer.py)."""
    return ModelSpec(
        name=MODEL_NAME,
        flavor=flavor,
        model=GRTHostModel.Config(flavor=flavor),
        parallelize_fn=parallelize_grt,
        pipelining_fn=None,
        post_optimizer_build_fn=None,
        state_dict_adapter=None,
    )
