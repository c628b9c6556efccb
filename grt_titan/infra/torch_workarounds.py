"""Contained workarounds for torch defects that tensor parallel + compile + AC meets.

Each one names the torch versions it was seen on, why it exists and when it can go, and
is installed by `parallelize_grt` only for the combination that needs it (never at import).
tests/infra/test_torch_workarounds.py reproduces each defect without the workaround.

1. RNG states saved behind opaque objects (torch 2.13, CPU).
   With DTensor parameters, AOTAutograd saves the parameters' `DeviceMesh` for backward as
   an opaque object; its forward outputs must be laid out as
   [outputs | saved tensors | opaque objects | symints]. When activation checkpointing
   recomputes an op tagged `nondeterministic_seeded` (CPU SDPA, dropout),
   `torch._functorch.partitioners.functionalize_rng_ops` appends the saved RNG state just
   before the symints, i.e. after the mesh, and adds the matching backward placeholder after
   the opaque placeholders too. The runtime then takes the mesh for a saved tensor and
   stops with "expected all tensors_saved_with_vc_check to be Tensors". The CUDA path keeps
   RNG states as graph inputs (graph-safe functionalization) and is not affected.
   The workaround moves those RNG states in front of the opaque objects, in the forward's
   outputs and in the backward's placeholders: the order the runtime already uses
   (symints, saved tensors, opaque objects, tangents). Related upstream: pytorch#171186
   (saving opaque objects for backward), pytorch#169867 (DeviceMesh as an opaque object).
   Remove once `functionalize_rng_ops` inserts RNG states before the opaque objects.
   torch 2.11 saves no opaque objects for backward (no `is_opaque_node`), so it has no such
   defect and the workaround is not installed there (`saves_opaque_objects`).

2. AOTAutograd cache entries shared by ranks with different local shapes (torch 2.13).
   The cache keys a DTensor input by `DTensorSpec._stable_hash`: mesh, placements and the
   *global* shape, not the local one (pytorch#188390). When a dimension shards unevenly
   (GPT-2's 50257-row vocabulary over TP 2: 25129 and 25128 rows), a warm cache hands one
   rank the graph compiled for the other, which stops with
   "assert_size_stride ... 25128 == 25129". With no uneven shard every rank's local shapes
   agree and the cache is correct, so the workaround turns the AOTAutograd cache off only
   when a TP-sharded parameter is uneven (inductor's FX graph cache, keyed on local shapes,
   stays on). `[grt] vocab_multiple_of = 128` avoids the uneven shard altogether.
   Remove once the DTensor cache key includes the local shape.

3. A compiled block fed the `to_local()` output of a TP embedding (torch 2.13).
   With llama blocks the first block's input is the embedding's sequence-sharded output as
   returned by `to_local()`; the compiled block's backward then hands that view's gradient
   to the embedding's redistribute backward as a plain tensor ("'Tensor' object has no
   attribute '_local_tensor'"). GPT-2 blocks are not affected: adding the learned positions
   makes a fresh tensor. The workaround clones the embedding output (one [B, S/tp, d] copy
   per forward). Remove once compiled regions accept `to_local()` outputs as inputs.

4. Autocast's weight-cast cache under selective op AC with a weight-tied core (torch 2.13,
   any device). Without FSDP (one device, DDP) torchtitan runs bf16 through `torch.autocast`,
   whose cache casts each weight once per autocast region. The core's blocks run r times per
   forward, each call its own checkpointed region: call 1 casts the weights (`_to_copy`),
   calls 2..r hit the cache and cast nothing, but their recomputation in backward runs after
   the cache is cleared and casts, and selective AC's replay, which counts every op, stops
   with "aten._to_copy.default invocation index N encountered during backward but not found
   in storage" at step 1 (pytorch#193338, open). The workaround turns the cache off for the
   process (`torch.set_autocast_cache_enabled(False)`, read by every autocast built after it):
   each call casts its own weights, in forward and in recomputation alike; one bf16 copy of
   the core's weights per call (r casts instead of 1, small beside its matmuls). Installed
   by `parallelize_grt` before torchtitan builds its autocast, for a recurrent model with op
   SAC and without FSDP. Remove once SAC tolerates autocast's cache (pytorch#193338).

5. A compiled, checkpointed block that no gradient reaches (torch 2.13, `[training]
   trainable`). A frozen prelude block fed frozen embeddings has no input or parameter that
   requires grad, so AOTAutograd compiles it as an inference graph; the activation-checkpoint
   tags in it send that graph through the "forward-loss-backward" rematerialization pass,
   which refuses any recomputable op tagged `nondeterministic_seeded` (the CPU SDPA kernel,
   even at dropout 0) although the graph has no backward: "Activation checkpoint
   rematerialization in `forward-loss-backward` graph does not support RNG ops". A region
   nothing differentiates has nothing to recompute, so the workaround makes each of the
   model's checkpoint wrappers call its module directly when no input or parameter requires
   grad (or grad is off), and checkpoint as before otherwise. Installed by `parallelize_grt`
   when a parameter is frozen, so every other run keeps torchtitan's wrappers unchanged.
   torch 2.11 compiles such a block (no defect there; the workaround changes nothing it
   computes). Remove once the pass leaves graphs without a backward region alone.
"""

from __future__ import annotations

import functools
import operator

import torch
from torch import fx
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._pytree import tree_leaves

_RNG_STATE_PLACEHOLDER = "rng_state_output_"


def saves_opaque_objects() -> bool:
    """Whether this torch saves opaque objects (a DTensor's mesh) for backward: 2.13 does, 2.11 not."""
    from torch._functorch._aot_autograd import graph_compile

    return hasattr(graph_compile, "is_opaque_node")


def _is_opaque(node: object) -> bool:
    from torch._functorch._aot_autograd.graph_compile import is_opaque_node

    return is_opaque_node(node)


def _is_saved_rng_state(node: object) -> bool:
    """`getitem(run_and_save_rng_state(...), 0)`: the state the eager fallback saves."""
    return (
        isinstance(node, fx.Node)
        and node.target is operator.getitem
        and node.args[1] == 0
        and isinstance(node.args[0], fx.Node)
        and node.args[0].target is torch._prims.rng_prims.run_and_save_rng_state
    )


def move_rng_states_before_opaque(fw_module: fx.GraphModule, bw_module: fx.GraphModule) -> bool:
    """Reorder the saved RNG states of `functionalize_rng_ops` ahead of opaque objects.

    Returns whether anything moved. A graph with no opaque saved object is left as it is.
    """
    (output_node,) = fw_module.graph.find_nodes(op="output")
    outputs = list(output_node.args[0])
    first_opaque = next((i for i, node in enumerate(outputs) if _is_opaque(node)), None)
    states = [node for node in outputs[first_opaque or 0 :] if _is_saved_rng_state(node)]
    if first_opaque is None or not states:
        return False
    rest = [node for node in outputs if not any(node is state for state in states)]
    output_node.args = (tuple(rest[:first_opaque] + states + rest[first_opaque:]),)

    placeholders = list(bw_module.graph.find_nodes(op="placeholder"))
    first_opaque_input = next((node for node in placeholders if _is_opaque(node)), None)
    assert first_opaque_input is not None, "forward saves an opaque object the backward does not take"
    for node in placeholders:
        if node.name.startswith(_RNG_STATE_PLACEHOLDER):
            first_opaque_input.prepend(node)
    fw_module.recompile()
    bw_module.recompile()
    return True


def _rng_states_before_opaque(original):
    @functools.wraps(original)
    def functionalize_rng_ops(joint_module, fw_module, bw_module, num_sym_nodes):
        fw_module, bw_module = original(joint_module, fw_module, bw_module, num_sym_nodes)
        move_rng_states_before_opaque(fw_module, bw_module)
        return fw_module, bw_module

    functionalize_rng_ops.grt_titan_workaround = True
    return functionalize_rng_ops


def install_rng_state_order_fix() -> bool:
    """Wrap the partitioner's `functionalize_rng_ops` (idempotent). Returns True if installed now.

    A torch that saves no opaque objects has nothing to reorder: nothing is installed.
    """
    from torch._functorch import partitioners

    if not saves_opaque_objects():
        return False
    if getattr(partitioners.functionalize_rng_ops, "grt_titan_workaround", False):
        return False
    partitioners.functionalize_rng_ops = _rng_states_before_opaque(partitioners.functionalize_rng_ops)
    return True


def uneven_tp_shards(model: torch.nn.Module) -> list[str]:
    """Names of DTensor parameters with a dimension that does not split evenly over its mesh."""
    from torch.distributed.tensor import DTensor, Shard

    uneven = []
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        for mesh_dim, placement in enumerate(param.placements):
            if isinstance(placement, Shard) and param.shape[placement.dim] % param.device_mesh.size(mesh_dim):
                uneven.append(name)
                break
    return uneven


def disable_autograd_cache_for_uneven_shards(model: torch.nn.Module) -> list[str]:
    """Turn the AOTAutograd cache off if a TP shard is uneven (workaround 2); returns their names."""
    uneven = uneven_tp_shards(model)
    if uneven:
        torch._functorch.config.enable_autograd_cache = False
    return uneven


def _clone_output(module, args, output):
    return output.clone()


def clone_embedding_output(embedding: torch.nn.Module) -> None:
    """Make the embedding's output a fresh tensor before compiled blocks see it (workaround 3)."""
    embedding.register_forward_hook(_clone_output)


def disable_autocast_weight_cache() -> bool:
    """Turn autocast's weight-cast cache off for this process (workaround 4); True if it was on."""
    was_on = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    return was_on


class _CheckpointWhereGradientsFlow(CheckpointWrapper):
    """Workaround 5: checkpoint only a call that a backward will reach."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and _needs_backward(self, args, kwargs):
            return super().forward(*args, **kwargs)
        return self._checkpoint_wrapped_module(*args, **kwargs)


def _needs_backward(module: torch.nn.Module, args, kwargs) -> bool:
    inputs = (t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
    return any(t.requires_grad for t in inputs) or any(p.requires_grad for p in module.parameters())


def checkpoint_only_where_gradients_flow(model: torch.nn.Module) -> int:
    """Workaround 5 on every checkpoint wrapper in `model`; how many there were."""
    wrappers = [m for m in model.modules() if type(m) is CheckpointWrapper]
    for wrapper in wrappers:
        wrapper.__class__ = _CheckpointWhereGradientsFlow
    return len(wrappers)
