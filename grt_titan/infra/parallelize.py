"""Every parallel plan of the GRT: TP, activation checkpointing, compile, FSDP2/HSDP, DDP;
and the distillation teacher's (`parallelize_teacher`: the student's TP and FSDP meshes).

Order as in torchtitan's llama3: TP -> AC -> compile -> FSDP (or DDP).

Importable under torchtitan 0.2.2 and 0.3 alike (what it takes at module level exists in
both): the plans themselves are torch's; `parallelize_grt` is 0.2.2's parallelize_fn, and
the helpers that only 0.2.2 has (its AC, compile and async-TP functions) are imported where
that path uses them. grt_titan/torchtitan_0_3/model.py applies the same TP and FSDP plans on 0.3.

The recurrence is the GRT-specific part. Its step (W_proj + core blocks + gate) runs r
times per forward, so:
- FSDP shards the whole `model.recurrence` (core, W_proj, gate and the loop) as ONE unit:
  one all-gather in forward (plus one in backward if `core_reshard_after_forward`) and
  one reduce-scatter per forward-backward, whatever r is. Per-block units would pay up
  to 2r all-gathers per block per step.
- compile: the step is compiled once (fullgraph) and reused for every step and every
  sampled r; the loop stays eager, so r never enters a graph (no recompiles).
- AC: `block` checkpoints every block call (r calls of a core block = r regions);
  `step` checkpoints each whole recurrence step, keeping only the state between steps.
  The step takes its noise as inputs, so recomputation is exact.
- TP: blocks use torchtitan's llama plan (qwen3 blocks its qwen3 plan, q_norm / k_norm
  included); W_proj, the gate MLP and its norms are
  per-leaf SequenceParallel (weights replicated over TP, tokens sharded), which makes the
  concatenation [h ; h_pre] a local op on sequence shards.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, get_args

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.distributed import ParallelDims
from torchtitan.tools.logging import logger

from grt_titan.infra.torch_workarounds import (
    checkpoint_only_where_gradients_flow,
    clone_embedding_output,
    disable_autocast_weight_cache,
    disable_autograd_cache_for_uneven_shards,
    install_rng_state_order_fix,
)
from grt_titan.infra.trainable import configured_entries, freeze_untrained
from grt_titan.model import GRTModel
from grt_titan.sections import FLOAT8_CONVERTER, RecurrenceCheckpoint, fault_tolerance_enabled


def grt_stacks(model: GRTModel) -> list[nn.Module]:
    """The BlockStacks of the model, in execution order (prelude, core, coda)."""
    stacks = [model.prelude]
    if model.recurrence is not None:
        stacks.append(model.recurrence.step.core)
    stacks.append(model.coda)
    return stacks


def noise_rank(job_config) -> int:
    """This rank's index among all training ranks. Under `[fault_tolerance]` every replica
    group numbers its ranks from 0, so the group's offset keeps groups' noise independent."""
    if not fault_tolerance_enabled(job_config):
        return dist.get_rank()
    return job_config.fault_tolerance.replica_id * dist.get_world_size() + dist.get_rank()


def freeze_untrained_parameters(model: GRTModel, job_config) -> None:
    """`[training] trainable` (grt_titan/infra/trainable.py)."""
    entries = configured_entries(job_config)
    if entries is None:
        return
    trained, total = freeze_untrained(model, entries)
    logger.info(
        f"[training] trainable = {entries}: {trained:,} of {total:,} parameters trained "
        f"({trained / total:.1%}); the rest frozen"
    )


def parallelize_grt(model: GRTModel, parallel_dims: ParallelDims, job_config) -> GRTModel:
    """The spec's parallelize_fn."""
    grt_config = getattr(job_config, "grt", None)
    recurrence_checkpoint = getattr(grt_config, "recurrence_checkpoint", "block")
    core_reshard = getattr(grt_config, "core_reshard_after_forward", False)
    # Rules checked with the key named at start-up (parallel_checks.py, config_checks' field types).
    assert job_config.training.seq_len % parallel_dims.seq_len_divisor == 0, "checked at start-up"
    assert not parallel_dims.cp_enabled, "checked at start-up"
    assert recurrence_checkpoint in get_args(RecurrenceCheckpoint), "checked at start-up"
    if model.recurrence is not None and dist.is_initialized():
        # Noise of training forward t from (depth_seed, t, rank): exact resume, independent ranks.
        model.recurrence.noise_rank = noise_rank(job_config)
    if model.exit_gate is not None:
        log_per_step_logits(model.model_args, job_config, parallel_dims.fsdp_enabled)

    if parallel_dims.tp_enabled:
        tp_mesh = parallel_dims.get_mesh("tp")
        apply_tp(
            model,
            tp_mesh,
            loss_parallel=not job_config.parallelism.disable_loss_parallel,
            enable_float8_tensorwise_tp=float8_tensorwise_tp(job_config),
        )
        from torchtitan.distributed.tensor_parallel import maybe_enable_async_tp  # torchtitan 0.2.2

        maybe_enable_async_tp(job_config, tp_mesh)
    # After TP (its SequenceParallel and replicated parameters are new Parameters that require
    # grad), before the wrappers that rename (AC) or register (FSDP2, DDP) parameters.
    freeze_untrained_parameters(model, job_config)

    compile_enabled = job_config.compile.enable and "model" in job_config.compile.components
    ac_enabled = job_config.activation_checkpoint.mode != "none"
    if parallel_dims.tp_enabled:
        contain_tp_compile_defects(model, job_config.compile, ac_enabled)
    if ac_enabled:
        apply_recurrence_ac(model, job_config.activation_checkpoint, recurrence_checkpoint, compile_enabled)
        if compile_enabled and not all(p.requires_grad for p in model.parameters()):
            wrapped = checkpoint_only_where_gradients_flow(model)
            logger.info(
                f"Frozen parameters under compile: {wrapped} checkpointed regions run unchecked "
                "where no gradient reaches them (torch_workarounds.py 5)"
            )
    if (
        uses_op_sac(job_config.activation_checkpoint)
        and model.recurrence is not None
        and not parallel_dims.fsdp_enabled
    ):
        if disable_autocast_weight_cache():  # torchtitan runs bf16 through torch.autocast here
            logger.info("Op SAC of a weight-tied core under autocast: autocast's weight-cast cache is off")
    if compile_enabled:
        apply_recurrence_compile(model, job_config.compile)

    if parallel_dims.fsdp_enabled:
        shard_data_parallel(
            model,
            parallel_dims,
            job_config,
            pp_enabled=parallel_dims.pp_enabled,
            reshard_after_forward_policy=job_config.parallelism.fsdp_reshard_after_forward,
            core_reshard_after_forward=core_reshard,
        )
        logger.info(f"Applied {'HSDP' if parallel_dims.dp_replicate_enabled else 'FSDP'} to the GRT")
        if model.model_args.per_step_readout and model.coda.layers:
            logger.info(
                "Ouro (objective = exit_distribution) reads every recurrence step out through the "
                "coda, so FSDP gathers each coda block once per step, not once per forward; the core "
                "is still gathered once (docs/parallelism.md)"
            )
    elif parallel_dims.dp_replicate_enabled:
        assert not parallel_dims.tp_enabled, "DDP with TP: checked at start-up"
        apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), compile_enabled)
    return model


def parallelize_teacher(
    model: GRTModel, parallel_dims: ParallelDims, job_config, load: Callable[[GRTModel], None]
) -> GRTModel:
    """A distillation teacher (grt_titan/teacher.py) sharded like the student: the student's
    TP plan (its logits vocabulary-sharded exactly when the student's are; float8's TP styles
    when the student's converters made its linears float8) and FSDP over the student's
    data-parallel mesh, every unit resharded after its forward. No AC and no compile: the
    teacher runs under no_grad and keeps no activations. Under DDP (or one rank) it is
    replicated, as the student.

    `load(model)` materialises the meta model and reads its weights (a full state dict).
    FSDP alone shards before loading, so a rank holds only its shard. FSDP x TP shards after
    loading the TP-sharded weights: a full state dict cannot be loaded into FSDP's strided
    shards over TP shards (torch 2.13's distribute_tensor stops with an AssertionError in
    `_StridedShard._shard_tensor`; tests/test_teacher.py shows it), while FSDP shards TP's
    materialised shards exactly. The load then holds 1 / TP of the teacher per rank."""
    if parallel_dims.tp_enabled:
        apply_tp(
            model,
            parallel_dims.get_mesh("tp"),
            loss_parallel=not job_config.parallelism.disable_loss_parallel,
            enable_float8_tensorwise_tp=float8_tensorwise_tp(job_config),
        )
    shard = partial(
        shard_data_parallel,
        model,
        parallel_dims,
        job_config,
        pp_enabled=False,
        reshard_after_forward_policy="always",
        core_reshard_after_forward=True,
    )
    shard_after_loading = parallel_dims.fsdp_enabled and parallel_dims.tp_enabled
    if parallel_dims.fsdp_enabled and not shard_after_loading:
        shard()
    load(model)
    if shard_after_loading:
        shard()
    return model


def float8_tensorwise_tp(job_config) -> bool:
    """The float8 converter with its tensorwise recipe: TP uses torchao's float8 styles."""
    return FLOAT8_CONVERTER in job_config.model.converters and is_tensorwise(job_config.quantize.linear.float8)


def is_tensorwise(float8_config) -> bool:
    """Either host's `[quantize.linear.float8]`: the tensorwise recipe (unset is tensorwise), the
    one whose linears take torchao's float8 TP styles."""
    return float8_config.recipe_name in (None, "tensorwise")


def shard_data_parallel(model: GRTModel, parallel_dims: ParallelDims, job_config, **policy) -> None:
    """FSDP2 (HSDP with dp_replicate) over the job's data-parallel mesh in its mixed precision;
    `policy`: apply_fsdp's pipeline and resharding arguments."""
    names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
    apply_fsdp(
        model,
        parallel_dims.get_mesh(names),
        param_dtype=TORCH_DTYPE_MAP[job_config.training.mixed_precision_param],
        reduce_dtype=TORCH_DTYPE_MAP[job_config.training.mixed_precision_reduce],
        cpu_offload=job_config.training.enable_cpu_offload,
        **policy,
    )


def log_per_step_logits(args, job_config, fsdp_enabled: bool) -> None:
    """Ouro keeps every step's logits for its loss: R x the usual logits memory."""
    t, steps = job_config.training, args.num_recurrences
    elements = steps * t.local_batch_size * t.seq_len * args.padded_vocab_size
    dtype = TORCH_DTYPE_MAP[t.mixed_precision_param if fsdp_enabled else t.dtype]
    logger.warning(
        f"objective = 'exit_distribution' (Ouro): a training forward keeps the logits of all {steps} "
        f"steps, {steps} x the usual: {steps} x {t.local_batch_size} x {t.seq_len} x {args.padded_vocab_size} "
        f"= {elements * dtype.itemsize / 2**30:.2f} GiB in {str(dtype).removeprefix('torch.')} per "
        "microbatch, plus the loss's float32 log-softmax of as many values; lower [training] "
        "local_batch_size (gradient accumulation keeps the global batch) if it does not fit"
    )


# ---- tensor parallel -------------------------------------------------------------------


def _block_tp_plan(block_style: str, colwise, rowwise, prepare_input) -> dict:
    """torchtitan's llama block plan; the gpt2 block has no w3 and a 1-input attention; the
    qwen3 block takes torchtitan's qwen3 plan (`_qwen3_block_tp_plan`)."""
    if block_style == "qwen3":
        return _qwen3_block_tp_plan(colwise, rowwise, prepare_input)
    llama = block_style == "llama"
    # llama attention takes (x, freqs_cis, attention_masks, positions); gpt2 attention takes x.
    attention_inputs = 4 if llama else 1
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": prepare_input(
            input_layouts=(Shard(1),) + (None,) * (attention_inputs - 1),
            desired_input_layouts=(Replicate(),) + (None,) * (attention_inputs - 1),
        ),
        "attention.wq": colwise(),
        "attention.wk": colwise(),
        "attention.wv": colwise(),
        "attention.wo": rowwise(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": colwise(),
        "feed_forward.w2": rowwise(output_layouts=Shard(1)),
    }
    if llama:  # SwiGLU's gate projection
        plan["feed_forward.w3"] = colwise()
    return plan


def _qwen3_block_tp_plan(colwise, rowwise, prepare_input) -> dict:
    """torchtitan 0.2.2's qwen3 dense block plan (models/qwen3/infra/parallelize.py,
    `apply_non_moe_tp`, without context parallelism): q/k/v stay DTensors sharded over heads
    so the per-head q_norm / k_norm run as SequenceParallel on the head dimension (dim 2), and
    the RoPE cos/sin cache enters the attention replicated. One addition: q, k, v enter SDPA
    as this rank's heads (local tensors, as in the llama plan), since DTensor has no sharding
    rule for CPU's SDPA kernel (gloo runs); the output re-enters wo as its Shard(-1) input."""
    heads = (Shard(1),) * 3  # q, k, v [B, heads, S, head_dim], sharded over heads
    return {
        "attention_norm": SequenceParallel(),
        # A plain PrepareModuleInput, not float8's: torchao's would cast every input it has a
        # layout for to float8, the RoPE cache too, and RoPE's multiply has no float8 kernel
        # (torchtitan 0.2.2's qwen3 plan has that defect). Under float8 the linears cast their
        # own inputs (tests/infra/test_float8.py, qwen3 blocks under TP).
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), Replicate(), None, None),
            desired_input_layouts=(Replicate(), Replicate(), None, None),
        ),
        "attention.wq": colwise(use_local_output=False),
        "attention.wk": colwise(use_local_output=False),
        "attention.wv": colwise(use_local_output=False),
        "attention.q_norm": SequenceParallel(sequence_dim=2),
        "attention.k_norm": SequenceParallel(sequence_dim=2),
        "attention.inner_attention": PrepareModuleInput(
            input_layouts=heads, desired_input_layouts=heads, use_local_output=True
        ),
        "attention.wo": rowwise(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": colwise(),
        "feed_forward.w2": rowwise(output_layouts=Shard(1)),
        "feed_forward.w3": colwise(),
    }


def apply_tp(
    model: GRTModel,
    tp_mesh: DeviceMesh,
    loss_parallel: bool,
    enable_float8_tensorwise_tp: bool,
) -> None:
    """Sequence-parallel residual stream [B, S/tp, d] between blocks, as in torchtitan."""
    root_plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    if model.pos_embeddings is not None:
        # positions [S] -> this rank's [S/tp, d] slice, added to the [B, S/tp, d] tokens.
        root_plan["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    parallelize_module(model, tp_mesh, root_plan)
    # parallelize_module gave tok_embeddings and output separate DTensors; both are
    # vocab-sharded (Shard(0)), so the tied head can share one again. It must be one
    # parameter before FSDP groups it.
    model.tie_weights()

    if enable_float8_tensorwise_tp:
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        colwise, rowwise, prepare_input = Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    else:
        colwise, rowwise, prepare_input = ColwiseParallel, RowwiseParallel, PrepareModuleInput
    block_style = model.model_args.block_style
    for stack in grt_stacks(model):
        for block in stack.layers.values():
            parallelize_module(block, tp_mesh, _block_tp_plan(block_style, colwise, rowwise, prepare_input))
    if model.recurrence is not None:
        step = model.recurrence.step
        # Per leaf: SequenceParallel on a module with nested parameters cannot register them.
        parallelize_module(
            step,
            tp_mesh,
            {
                name: SequenceParallel(use_local_output=True)
                for name in ("proj", "gate.state_norm", "gate.anchor_norm", "gate.w_in", "gate.w_out")
                if hasattr(step, name.split(".")[0])  # a part a method leaves out has no module
            },
        )
    if model.recurrence is not None and hasattr(model.recurrence, "anchor"):
        apply_scse_tp(model.recurrence, tp_mesh)
    if model.exit_gate is not None:
        # Ouro's exit gate reads the sequence-sharded output of `norm`: replicated weights on
        # sequence shards, as the norm; its logits stay a DTensor (the loss gathers them).
        parallelize_module(model.exit_gate, tp_mesh, SequenceParallel())
    logger.info(f"Applied {'Float8 tensorwise ' if enable_float8_tensorwise_tp else ''}Tensor Parallelism to the GRT")


def contain_tp_compile_defects(model: GRTModel, compile_config, ac_enabled: bool) -> None:
    """The torch defects that TP meets under compile (and AC), each contained as
    torch_workarounds.py describes; either host's `[compile]` (`enable`, `components`)."""
    if compile_config.enable and "model" in compile_config.components:
        if model.pos_embeddings is None:
            clone_embedding_output(model.tok_embeddings)
        if ac_enabled and install_rng_state_order_fix():
            logger.info("TP + compile + AC: saved RNG states ordered before DeviceMesh objects")
    if compile_config.enable:
        uneven = disable_autograd_cache_for_uneven_shards(model)
        if uneven:
            logger.warning(
                f"TP shards {', '.join(uneven)} unevenly: the AOTAutograd compile cache is off for "
                "this run (a torch 2.13 defect); [grt] vocab_multiple_of = 128 avoids it"
            )


def apply_scse_tp(recurrence: nn.Module, tp_mesh: DeviceMesh) -> None:
    """SCSE under TP: A and B act per token (replicated weights on sequence shards, as W_proj);
    the deviation step takes h, Delta and the core's proposal as sequence-sharded DTensors, so
    its zero-deviation mask's sum over the sequence is the whole sequence's (an all-reduce of
    one scalar per sequence), and hands back the local shard like every other step part."""
    parallelize_module(
        recurrence,
        tp_mesh,
        {name: SequenceParallel(use_local_output=True) for name in ("anchor.anchor_proj", "anchor.init_delta_proj")},
    )
    sharded = (Shard(1), Shard(1), Shard(1))
    parallelize_module(
        recurrence.step.deviation,
        tp_mesh,
        PrepareModuleInputOutput(
            input_layouts=sharded,
            desired_input_layouts=sharded,
            use_local_input=False,
            output_layouts=Shard(1),
            desired_output_layouts=Shard(1),
            use_local_output=True,
        ),
    )


# ---- activation checkpointing and compile ----------------------------------------------


def uses_op_sac(ac_config) -> bool:
    return ac_config.mode == "selective" and ac_config.selective_ac_option == "op"


def apply_recurrence_ac(model: GRTModel, ac_config, recurrence_checkpoint: str, compile_enabled: bool) -> None:
    """torchtitan's AC per block; with `step`, the recurrence step is one region instead."""
    from torchtitan.distributed.activation_checkpoint import apply_ac  # torchtitan 0.2.2
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    for stack in checkpointed_stacks(model, recurrence_checkpoint):
        apply_ac(stack, ac_config, model_compile_enabled=compile_enabled, op_sac_save_list=_op_sac_save_list)
    if model.recurrence is not None and recurrence_checkpoint == "step":
        checkpoint_recurrence_step(model, ac_config, early_stop=ac_config.early_stop)


def checkpointed_stacks(model: GRTModel, recurrence_checkpoint: str) -> list[nn.Module]:
    """The BlockStacks whose blocks each hold one AC region: with `step`, not the core's."""
    stacks = [model.prelude, model.coda]
    if model.recurrence is not None and recurrence_checkpoint == "block":
        stacks.insert(1, model.recurrence.step.core)
    return [stack for stack in stacks if len(stack.layers)]


def checkpoint_recurrence_step(model: GRTModel, ac_config, early_stop: bool = False) -> None:
    """torch's full-AC wrapper around the whole recurrence step (both hosts' AC configs carry
    these three fields). The step has no RNG inside (its noise is an input), so the
    recomputation is exact either way."""
    model.recurrence.step = checkpoint_wrapper(
        model.recurrence.step,
        preserve_rng_state=ac_config.preserve_rng_state,
        determinism_check=ac_config.determinism_check,
        early_stop=early_stop,
        debug=ac_config.debug,
    )
    logger.info("Checkpointing each recurrence step (W_proj + core + gate) as one region")


def apply_recurrence_compile(model: GRTModel, compile_config) -> None:
    """Prelude/coda blocks compiled per block; the recurrence step compiled once, fullgraph."""
    from torchtitan.models.llama3.infra.parallelize import apply_compile  # torchtitan 0.2.2

    for stack in (model.prelude, model.coda):
        if len(stack.layers):
            apply_compile(stack, compile_config)
    compile_recurrence_step(model, compile_config.backend)


def compile_recurrence_step(model: GRTModel, backend: str, in_place: bool = False) -> None:
    """The step compiled once and reused for every step and every sampled r: the loop stays
    eager, so r never enters a graph (no recompiles). `in_place` (`nn.Module.compile`, as
    torchtitan 0.3 compiles its blocks) keeps the parameters' names, which 0.3's optimizer
    state is keyed by; 0.2.2's state dicts strip the wrapper's `_orig_mod` themselves."""
    if model.recurrence is None:
        return
    if in_place:
        model.recurrence.step.compile(backend=backend, fullgraph=True)
    else:
        model.recurrence.step = torch.compile(model.recurrence.step, backend=backend, fullgraph=True)
    logger.info("Compiled the recurrence step once (fullgraph); reused for every r")


# ---- data parallel ---------------------------------------------------------------------


def apply_fsdp(
    model: GRTModel,
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    pp_enabled: bool,
    cpu_offload: bool = False,
    reshard_after_forward_policy: str = "default",
    core_reshard_after_forward: bool = False,
) -> None:
    """Prelude/coda blocks per block, the recurrence as one unit, the rest in the root.

    The root keeps the embeddings, positions, final norm and (tied) LM head: a tied weight
    must live in exactly one FSDP group.
    """
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    config: dict = {"mesh": dp_mesh, "mp_policy": mp_policy}
    if cpu_offload:
        config["offload_policy"] = CPUOffloadPolicy()
    # torchtitan's Literal field: its value is checked at start-up (config_checks.field_problems).
    reshard = {"always": True, "never": False, "default": not pp_enabled}[reshard_after_forward_policy]
    for block in model.prelude.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    if model.recurrence is not None:
        fully_shard(model.recurrence, **config, reshard_after_forward=core_reshard_after_forward)
    for block in model.coda.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    fully_shard(model, **config)
    sum_gradients_across_ranks(model, force_sum=dp_mesh.device_type == "cpu")


def sum_gradients_across_ranks(model: nn.Module, force_sum: bool) -> None:
    """FSDP sums gradients instead of averaging them: the loss is already divided by the global
    token count (torchtitan's `disable_fsdp_gradient_division`, in both hosts). `force_sum`:
    gloo has neither AVG nor PREMUL_SUM reduce-scatter, so reduce with SUM only."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if force_sum:
                module.set_force_sum_reduction_for_comms(True)


def _allreduce_sum_hook(process_group, bucket):
    """DDP comm hook that sums gradients instead of averaging them."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def apply_ddp(model: GRTModel, dp_mesh: DeviceMesh, compile_enabled: bool) -> None:
    """DDP that sums gradients and tolerates unused parameters.

    Sum: torchtitan already divides the loss by the global token count (as FSDP's divide
    factor 1.0 assumes); DDP's default averaging would shrink gradients by the DP degree.
    Unused parameters: with a constant gate the gate MLP gets no gradient, and stock DDP
    fails on the next step.
    """
    if compile_enabled:
        torch._dynamo.config.optimize_ddp = "ddp_optimizer"
    replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100, find_unused_parameters=True)
    model.register_comm_hook(dp_mesh.get_group(), _allreduce_sum_hook)
    logger.info("Applied DDP to the GRT")
