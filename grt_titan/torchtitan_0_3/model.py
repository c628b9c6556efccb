"""The GRT as a torchtitan 0.3 model: a `BaseModel` whose Config holds the flavor and the
resolved args, its parallelize function and its `ModelSpec`.

The module tree is grt_titan's own GRTModel, unchanged, so parameter names, checkpoints and
exports are those of the 0.2.2 host. 0.3's `verify_module_protocol` asks every submodule to be
a torchtitan `Module`; the GRT's blocks are plain nn.Modules (a core that no host owns), so
the check is skipped, as that method's docstring allows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.components.quantization.utils import module_filter_fn
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed.compile import apply_compile
from torchtitan.protocols import BaseModel
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import has_cuda_capability

from grt_titan.infra.parallelize import (
    apply_tp,
    checkpoint_recurrence_step,
    checkpointed_stacks,
    compile_recurrence_step,
    contain_tp_compile_defects,
    freeze_untrained_parameters,
    is_tensorwise,
    noise_rank,
    shard_data_parallel,
)
from grt_titan.infra.torch_workarounds import checkpoint_only_where_gradients_flow
from grt_titan.model import GRTModel, GRTModelArgs
from grt_titan.model.part import JobSettings
from grt_titan.run_reader import flavor_args
from grt_titan.sections import GRTSection
from grt_titan.torchtitan_0_3.view import MODEL_NAME, job_view

# torchtitan's flag in `[quantize.linear.float8] filter_fqns`: torchao picks the linears worth converting.
FLOAT8_AUTO_FILTER = "auto_filter_small_kn"


class GRTHostModel(GRTModel, BaseModel):
    """GRTModel built from a 0.3 Config (`config.build()` on the meta device)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseModel.Config):
        flavor: str = "debug"
        args: GRTModelArgs | None = None
        """The flavor's args after `[grt]` overrides: set by `update_from_config`."""
        loss_parallel: bool = True
        """Under TP, the LM head keeps its logits vocabulary-sharded and GRTLoss scores them
        there (as 0.3 does its own models'); False (`[parallelism] disable_loss_parallel`,
        as on 0.2.2) gathers them first."""
        float8: Float8Converter.Config | None = None
        """`[quantize.linear.float8]`, set by Float8Converter: parallelize_grt swaps the linears."""

        def update_from_config(self, *, config, **kwargs) -> None:
            """Apply `[grt]` and `training.seq_len` as the 0.2.2 host does (the same
            `GRTModelArgs.update_from_config`, on the config's 0.2.2-shaped view), then the
            active parts' start-up rules (what a method cannot run with, e.g. TP)."""
            view = job_view(config)
            args = flavor_args(self.flavor, source="[model] flavor")
            args.update_from_config(view)
            args.forwards_per_step = view.forwards_per_step
            job = job_settings(config)
            problems = [problem for part in args.active_parts for problem in part.job_problems(job, args)]
            if problems:
                raise ValueError("\n".join(problems))
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
        self.loss_parallel = config.loss_parallel
        self.float8 = config.float8

    def verify_module_protocol(self) -> None:
        """Skipped: the GRT's modules are host-neutral nn.Modules (module docstring)."""

    def init_weights(self, buffer_device: torch.device | None = None, **kwargs) -> None:
        GRTModel.init_weights(self, buffer_device=buffer_device)


def job_settings(config) -> JobSettings:
    """What the parts' start-up rules read of a 0.3 config (0.3 validates at training's
    sequence length)."""
    seq_len, validation = config.training.seq_len, config.validator.enable
    return JobSettings(
        tensor_parallel_degree=config.parallelism.tensor_parallel_degree,
        compiled=config.compile.enable and "model" in config.compile.components,
        validation=validation,
        seq_lens={"training": seq_len, **({"validation": seq_len} if validation else {})},
    )


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
    float8 -> TP -> AC -> compile -> FSDP2/HSDP. `grt` is bound by the trainer (`[grt]
    recurrence_checkpoint`, `core_reshard_after_forward`)."""
    assert not parallel_dims.cp_enabled, "refused at start-up (refusals.py)"
    job = SimpleNamespace(training=training)  # what the 0.2.2 host's helpers read of a job
    if model.recurrence is not None and dist.is_initialized():
        model.recurrence.noise_rank = noise_rank(job)  # noise of forward t from (depth_seed, t, rank)
    if model.float8 is not None:  # 0.2.2's trainer converts before its parallelize_fn
        convert_to_float8(model, model.float8, float8_all_gather(model.float8, parallel_dims))
    if parallel_dims.tp_enabled:
        float8_styles = model.float8 is not None and is_tensorwise(model.float8)
        apply_tp(model, parallel_dims.get_mesh("tp"), model.loss_parallel, float8_styles)
    # `[training] trainable` (our TrainingConfig's field): after TP, before AC and FSDP.
    freeze_untrained_parameters(model, job)
    compile_enabled = compile_config.enable and "model" in compile_config.components
    if parallel_dims.tp_enabled:
        contain_tp_compile_defects(model, compile_config, ac_enabled=ac_config is not None)
    if ac_config is not None:
        apply_ac(model, ac_config, grt.recurrence_checkpoint, dump_folder, compile_enabled)
    if compile_enabled:
        for stack in (model.prelude, model.coda):
            if len(stack.layers):
                apply_compile(stack, compile_config=compile_config, parallel_dims=parallel_dims)
        compile_recurrence_step(model, compile_config.backend, in_place=True)
    # As 0.3 shards its own models: replicas alone (no dp_shard) are HSDP over a shard dimension
    # of one, which all-reduces the gradients across the replicas (0.2.2 applies DDP there).
    if parallel_dims.fsdp_enabled or parallel_dims.dp_replicate_enabled:
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


class Float8Converter(QuantizationConverter):
    """`[model] converters = ["quantize.linear.float8"]` with 0.2.2's `[quantize.linear.float8]`
    keys and meaning: torchao's Float8Linear in place of the GRT's linears. 0.3's own
    Float8LinearConverter rewrites `Linear.Config`s, which the GRT (built from its args) has
    none of, and drops 0.2.2's default tensorwise recipe; so `convert` marks the model config
    and parallelize_grt swaps the linears, where the FSDP mesh that float8 all-gather needs is
    known."""

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        recipe_name: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] | None = None
        """torchao's recipe; unset: tensorwise with the two FSDP options below."""
        filter_fqns: list[str] = field(default_factory=list)
        """Linears left in high precision (substrings of their names); `auto_filter_small_kn`
        lets torchao choose. Linears with a dimension not a multiple of 16 always stay."""
        emulate: bool = False
        """Emulated float8 matmuls, for machines without SM89 (eager only)."""
        enable_fsdp_float8_all_gather: bool = False
        """Tensorwise: FSDP all-gathers the weights in float8."""
        precompute_float8_dynamic_scale_for_fsdp: bool = False
        """Tensorwise with float8 all-gather: all weights' scales in one all-reduce per step."""

    def __init__(self, config: Config):
        if not (has_cuda_capability(8, 9) or (config.emulate and not config.model_compile_enabled)):
            raise ValueError(
                "[model] converters = ['quantize.linear.float8'] needs an SM89+ GPU; on other hardware "
                "[quantize.linear.float8] emulate = true, without [compile] (float8 emulation is eager only)"
            )
        if config.recipe_name is not None and config.enable_fsdp_float8_all_gather:
            raise ValueError(
                f"[quantize.linear.float8] recipe_name = {config.recipe_name!r} with enable_fsdp_float8_all_gather: "
                "float8 all-gather is the tensorwise recipe's; allowed: one of them"
            )
        self.config = config

    def convert(self, model_config: GRTHostModel.Config) -> GRTHostModel.Config:
        model_config.float8 = self.config
        return model_config


def float8_all_gather(float8: Float8Converter.Config, parallel_dims) -> bool:
    """Float8 all-gather, as 0.2.2 grants it: tensorwise, asked for, and FSDP sharding."""
    return float8.recipe_name is None and float8.enable_fsdp_float8_all_gather and parallel_dims.dp_shard_enabled


def convert_to_float8(model: nn.Module, float8: Float8Converter.Config, all_gather: bool) -> None:
    """0.2.2's float8 conversion (torchtitan 0.2.2's Float8LinearConverter) on this host's
    settings: a recipe's torchao config, or tensorwise with its FSDP options."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if float8.recipe_name is None:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather, emulate=float8.emulate)
    else:
        config = Float8LinearConfig.from_recipe_name(float8.recipe_name)
        if float8.recipe_name == "rowwise":  # pytorch#150859, as torchtitan sets it
            torch._inductor.config.emulate_precision_casts = True
    convert_to_float8_training(model, config=config, module_filter_fn=float8_filter(float8))
    logger.info(
        f"Swapped to Float8Linear layers ({float8.recipe_name or 'tensorwise'}) with "
        f"enable_fsdp_float8_all_gather={config.enable_fsdp_float8_all_gather}"
    )


def float8_filter(float8: Float8Converter.Config):
    """Which linears convert: torchtitan's rule (both dims multiples of 16, not in
    `filter_fqns`; it reads `in_features` / `out_features`, which nn.Linear has), or torchao's
    automatic one."""
    fqns = [fqn for fqn in float8.filter_fqns if fqn != FLOAT8_AUTO_FILTER]
    if FLOAT8_AUTO_FILTER in float8.filter_fqns:
        from torchao.float8 import _auto_filter_for_recipe

        return _auto_filter_for_recipe(float8.recipe_name or "tensorwise", filter_fqns=fqns)
    return partial(module_filter_fn, filter_fqns=fqns)


def precompute_float8_scales(optimizers, model_parts: list[nn.Module], parallel_dims) -> None:
    """`precompute_float8_dynamic_scale_for_fsdp`: after each optimizer step, one all-reduce
    computes every float8 weight's scale for the next all-gather (0.2.2's post-optimizer hook)."""
    float8 = getattr(model_parts[0], "float8", None)
    if float8 is None or not (
        float8.precompute_float8_dynamic_scale_for_fsdp and float8_all_gather(float8, parallel_dims)
    ):
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    def precompute(*args, **kwargs) -> None:
        for model in model_parts:
            precompute_float8_dynamic_scale_for_fsdp(model)

    optimizers.register_step_post_hook(precompute)
    logger.info("Float8: each optimizer step precomputes the weights' scales for FSDP's float8 all-gather")


def model_spec(flavor: str, converters: Sequence[Float8Converter.Config] = (), loss_parallel: bool = True) -> ModelSpec:
    """The `grt` ModelSpec of one flavor, its model config through `converters` (as 0.3's
    model registries apply theirs). A shared core cannot be split across pipeline stages (no
    pipelining_fn); the HF state-dict adapter is not wired on this host yet. `parallelize_fn`
    takes the `[grt]` section too: the trainer binds it (trainer.py)."""
    model = GRTHostModel.Config(flavor=flavor, loss_parallel=loss_parallel)
    for converter in converters:
        model = converter.build().convert(model)
    return ModelSpec(
        name=MODEL_NAME,
        flavor=flavor,
        model=model,
        parallelize_fn=parallelize_grt,
        pipelining_fn=None,
        post_optimizer_build_fn=precompute_float8_scales,
        state_dict_adapter=None,
    )
