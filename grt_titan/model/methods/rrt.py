"""Per-step LoRA adapters on the shared core: Relaxed Recursive Transformers (RRT).

Bae et al. 2024 (arXiv 2410.20672) relax the tying of a recursive transformer with one
low-rank adapter per (core block, recursion step) on the block's linears ("layer-wise
LoRA"); the shared weights stay one tensor. On the paper's GPT-2 blocks the adapted linears
are GPT-2's four: the fused q/k/v projection (c_attn, d -> 3d), the attention output
(c_proj), the MLP input (c_fc, d -> 4d) and output (mlp c_proj, 4d -> d), so a step adds
r (4d + 2d + 5d + 5d) = 16 d r parameters per block.

The adapters of step t are selected with a tensor index and passed to the blocks as an
explicit argument, so one compiled graph serves every step and activation checkpointing
recomputes a block with the adapter it used. From scratch, B = 0 (PEFT's default): each
adapter starts as a no-op; A is Kaiming-uniform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from ..part import Bad, JobSettings, Part, tensor_parallel_problems
from ..settings import setting

if TYPE_CHECKING:  # the args have this module's settings among their bases
    from ..args import GRTModelArgs


@dataclass
class RRTSettings:
    """RRT's `[grt]` settings, its adapters' size: a base class of `GRTModelArgs`
    (grt_titan/model/args.py)."""

    lora_rank: int = setting(64, "Rank of each per-step LoRA adapter (default 64).", hf=True)
    lora_scale: float = setting(2.0, "Output scale alpha / rank of the LoRA adapters (default 2).", hf=True)


class BlockAdapter(NamedTuple):
    """LoRA factors of one GPT-2 block at one step: delta(x) = scale * (x A^T) B^T per linear."""

    qkv: tuple[torch.Tensor, torch.Tensor]  # A [r, d], B [3d, r]
    attention_out: tuple[torch.Tensor, torch.Tensor]  # A [r, d], B [d, r]
    mlp_in: tuple[torch.Tensor, torch.Tensor]  # A [r, d], B [4d, r]
    mlp_out: tuple[torch.Tensor, torch.Tensor]  # A [r, 4d], B [d, r]
    scale: float


def lora_delta(x: torch.Tensor, factors: tuple[torch.Tensor, torch.Tensor], scale: float) -> torch.Tensor:
    a, b = factors
    return (x @ a.t().to(x.dtype)) @ (b.t().to(x.dtype) * scale)


def _linear_shapes(dim: int) -> dict[str, tuple[int, int]]:
    """(in, out) of each adapted GPT-2 linear."""
    return {"qkv": (dim, 3 * dim), "attention_out": (dim, dim), "mlp_in": (dim, 4 * dim), "mlp_out": (4 * dim, dim)}


class StepAdapters(nn.Module):
    """A [R, n, r, in] and B [R, n, out, r] per adapted linear: step-major, so the factors of
    step t are one slice."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        steps, blocks, rank = args.num_recurrences, args.n_core_layers, args.lora_rank
        self.scale = args.lora_scale
        self.num_blocks = blocks
        self.a = nn.ParameterDict()
        self.b = nn.ParameterDict()
        for name, (fan_in, fan_out) in _linear_shapes(args.dim).items():
            self.a[name] = nn.Parameter(torch.empty(steps, blocks, rank, fan_in))
            self.b[name] = nn.Parameter(torch.empty(steps, blocks, fan_out, rank))

    def at_step(self, step_index: torch.Tensor) -> list[BlockAdapter]:
        """The adapters of every core block at step `step_index` (a 0-dim int64 tensor)."""
        # index_select, not p[step_index]: a tensor-valued index is a gather to torch.compile,
        # where indexing by a 0-dim tensor would read its value (a data-dependent shape).
        index = step_index.reshape(1)
        a = {name: p.index_select(0, index).squeeze(0) for name, p in self.a.items()}
        b = {name: p.index_select(0, index).squeeze(0) for name, p in self.b.items()}
        return [
            BlockAdapter(*((a[name][i], b[name][i]) for name in _linear_shapes(1)), scale=self.scale)
            for i in range(self.num_blocks)
        ]

    def init_weights(self) -> None:
        for a in self.a.values():
            fan_in = a.shape[-1]
            bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) on [r, in], as PEFT / nn.Linear
            nn.init.uniform_(a, -bound, bound)
        for b in self.b.values():
            nn.init.zeros_(b)


class LoraAdapters(Part):
    """step_adapter = "lora" (RRT): the `StepAdapters` above, a fixed depth R, GPT-2 blocks."""

    key, choice, module_name = "step_adapter", "lora", "adapters"
    per_step, per_step_what = True, "adapter"

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.lora_rank < 1:
            raise bad("lora_rank", args.lora_rank, "must be >= 1")
        if args.step_adapter != self.choice:
            return
        if args.depth_sampling != "fixed":
            raise bad(
                "step_adapter", "lora", "needs depth_sampling = 'fixed' (one adapter per step of a fixed depth R)"
            )
        if args.block_style != "gpt2":
            raise bad("step_adapter", "lora", "is implemented for block_style = 'gpt2' (the paper's blocks)")

    def job_problems(self, job: JobSettings, args: GRTModelArgs) -> list[str]:
        return tensor_parallel_problems(
            job,
            "[grt] step_adapter = 'lora' (RRT) does not support [parallelism] tensor_parallel_degree = {tp}: "
            "its per-step adapters have no tensor-parallel plan; allowed: tensor_parallel_degree = 1 (FSDP/HSDP)",
        )

    def build(self, args: GRTModelArgs) -> StepAdapters:
        return StepAdapters(args)

    def step_adapters(self, step: nn.Module, step_index: torch.Tensor | None):
        return step.adapters.at_step(step_index)

    def describe(self, args: GRTModelArgs) -> str:
        return (
            f"per-step LoRA adapters on the core's linears (rank {args.lora_rank}, RRT): one set per step, "
            "so a call runs at most R steps"
        )

    def step_params(self, args: GRTModelArgs) -> int:
        """r (in + out) per adapted linear: r (4d + 2d + 5d + 5d) = 16 d r per core block (unmerged:
        two thin matmuls per linear)."""
        per_block = sum(fan_in + fan_out for fan_in, fan_out in _linear_shapes(args.dim).values())
        return args.n_core_layers * per_block * args.lora_rank


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    LoraAdapters(),  # step_adapter = "lora"
)
SETTINGS = RRTSettings
