"""Transformer blocks of the three styles, behind one call signature.

`gpt2`: the paper's nanoGPT block (pre-LayerNorm, biased linears, GELU MLP 4d); positions
are added to the embeddings by the model, so the block ignores `freqs_cis`.
`llama`: our copy of torchtitan 0.2.2's llama3 TransformerBlock (RMSNorm, SwiGLU, RoPE, GQA;
grt_titan/model/blocks/llama.py).
`qwen3`: our copy of torchtitan 0.2.2's qwen3 TransformerBlock (llama's plus q/k RMSNorm per
head and an explicit head width; grt_titan/model/blocks/qwen3.py); its RoPE table is qwen3's
cos/sin cache, not llama's complex `freqs_cis` (the model precomputes the table of its style:
`rope_table`).
All keep torchtitan 0.2.2's parameter names (`attention.wq`, `feed_forward.w1`,
`attention_norm`, ...), whatever torchtitan hosts them, so its TP plans, float8 filters and AC
lists apply unchanged and every checkpoint and export loads.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..methods.rrt import BlockAdapter, lora_delta
from .init import trunc_normal_
from .llama import LlamaBlock, LlamaBlockArgs, LlamaFeedForward, RoPEScalingArgs, precompute_freqs_cis
from .qwen3 import Qwen3Block, Qwen3BlockArgs, precompute_rope_cache
from .rows import Rows, attend_at_rows, take_rows
from .sdpa import ScaledDotProductAttentionWrapper

if TYPE_CHECKING:  # the args import the method modules, which import these blocks
    from ..args import GRTModelArgs


class GPT2Attention(nn.Module):
    """Causal multi-head self-attention with biased q/k/v/o projections."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.dim)
        self.wk = nn.Linear(args.dim, args.dim)
        self.wv = nn.Linear(args.dim, args.dim)
        self.wo = nn.Linear(args.dim, args.dim)
        self.inner_attention = ScaledDotProductAttentionWrapper()

    def forward(self, x: torch.Tensor, adapter: BlockAdapter | None = None, rows: Rows | None = None) -> torch.Tensor:
        """`rows`: the output at those positions alone, [N, dim] (blocks/rows.py)."""
        if rows is None:
            out = self.attend(x, adapter)
        else:
            out = self.attend_at(x, adapter, rows)
        if adapter is None:
            return self.wo(out)
        return self.wo(out) + lora_delta(out, adapter.attention_out, adapter.scale)

    def attend(self, x: torch.Tensor, adapter: BlockAdapter | None) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q, k, v = (proj(x) for proj in (self.wq, self.wk, self.wv))
        if adapter is not None:  # RRT: the step's LoRA on the fused q/k/v projection
            dq, dk, dv = lora_delta(x, adapter.qkv, adapter.scale).chunk(3, dim=-1)
            q, k, v = q + dq, k + dk, v + dv
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q, k, v = (t.view(bs, seqlen, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        return self.inner_attention(q, k, v).transpose(1, 2).contiguous().view(bs, seqlen, -1)

    def attend_at(self, x: torch.Tensor, adapter: BlockAdapter | None, rows: Rows) -> torch.Tensor:
        """The queries at `rows` alone, the keys and values everywhere: [N, dim] before `wo`."""
        bs, seqlen, _ = x.shape
        at = take_rows(x, rows)
        q, k, v = self.wq(at), self.wk(x), self.wv(x)
        if adapter is not None:
            q = q + lora_delta(at, adapter.qkv, adapter.scale).chunk(3, dim=-1)[0]
            _, dk, dv = lora_delta(x, adapter.qkv, adapter.scale).chunk(3, dim=-1)
            k, v = k + dk, v + dv
        k, v = (t.view(bs, seqlen, -1, self.head_dim).transpose(1, 2) for t in (k, v))
        return attend_at_rows(self.inner_attention, q.unflatten(-1, (-1, self.head_dim)), k, v, rows)


class GPT2FeedForward(nn.Module):
    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden_dim)  # 4d unless `ffn_dim` says otherwise
        self.w2 = nn.Linear(args.ffn_hidden_dim, args.dim)

    def forward(self, x: torch.Tensor, adapter: BlockAdapter | None = None) -> torch.Tensor:
        if adapter is None:
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))
        hidden = F.gelu(self.w1(x) + lora_delta(x, adapter.mlp_in, adapter.scale), approximate="tanh")
        return self.w2(hidden) + lora_delta(hidden, adapter.mlp_out, adapter.scale)


class GPT2Block(nn.Module):
    """Pre-LayerNorm GPT-2 block: x + attn(LN(x)), then + mlp(LN(.))."""

    def __init__(self, args: GRTModelArgs, residual_init_std: float):
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.attention = GPT2Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = GPT2FeedForward(args)
        self.residual_init_std = residual_init_std

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor | None = None,
        attention_masks=None,
        positions: torch.Tensor | None = None,
        adapter: BlockAdapter | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        """`rows`: some of the [B * S] positions; the output holds those rows alone ([N, dim]),
        the attention's queries and the feed-forward run on them only (a readout scored at a
        few positions; blocks/rows.py)."""
        if rows is not None:
            attention = self.attention(self.attention_norm(x), adapter, rows)
        elif adapter is not None:
            attention = self.attention(self.attention_norm(x), adapter)
        else:  # one input: torchtitan's TP plan prepares exactly one
            attention = self.attention(self.attention_norm(x))
        h = take_rows(x, rows) + attention
        if adapter is None:
            return h + self.feed_forward(self.ffn_norm(h))
        return h + self.feed_forward(self.ffn_norm(h), adapter)

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        for linear in (self.attention.wq, self.attention.wk, self.attention.wv, self.feed_forward.w1):
            trunc_normal_(linear.weight, std=0.02)
        # GPT-2: residual projections scaled by 1/sqrt(2 * depth).
        for linear in (self.attention.wo, self.feed_forward.w2):
            trunc_normal_(linear.weight, std=self.residual_init_std)
        for linear in (
            self.attention.wq,
            self.attention.wk,
            self.attention.wv,
            self.attention.wo,
            self.feed_forward.w1,
            self.feed_forward.w2,
        ):
            nn.init.zeros_(linear.bias)


def llama_block_args(args: GRTModelArgs) -> LlamaBlockArgs:
    """The llama block's args (torchtitan 0.2.2's llama3 field names; grt_titan/hf/stock_key_maps.py
    reads them too)."""
    return LlamaBlockArgs(
        dim=args.dim,
        n_layers=args.unrolled_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        multiple_of=args.multiple_of,
        ffn_dim_multiplier=args.ffn_dim_multiplier,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        max_seq_len=args.max_seq_len,
        # Depth-scaled init by the unrolled depth, not the position in a stack that is reused.
        depth_init=False,
        **({} if args.rope_scaling is None else {"rope_scaling_args": rope_scaling_args(args.rope_scaling)}),
    )


def rope_scaling_args(values: list[float]) -> RoPEScalingArgs:
    """llama3's RoPE scaling of `GRTModelArgs.rope_scaling` (factor 1: none)."""
    factor, low, high, original = values
    return RoPEScalingArgs(
        scaling_factor=float(factor),
        low_freq_factor=float(low),
        high_freq_factor=float(high),
        original_max_position_embeddings=int(original),
    )


def qwen3_block_args(args: GRTModelArgs) -> Qwen3BlockArgs:
    """The qwen3 block's args (torchtitan 0.2.2's qwen3 field names)."""
    return Qwen3BlockArgs(
        dim=args.dim,
        n_layers=args.unrolled_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads or args.n_heads,
        head_dim=args.head_dim,
        hidden_dim=args.ffn_hidden_dim,
        norm_eps=args.norm_eps,
        # Depth-scaled init by the unrolled depth, not the position in a stack that is reused.
        depth_init=False,
    )


def rope_table(args: GRTModelArgs) -> torch.Tensor | None:
    """The RoPE table the blocks of `args.block_style` read: llama's complex `freqs_cis`
    [max_seq_len, head_dim / 2] (with its llama3 scaling), qwen3's cos/sin cache
    [max_seq_len, 2 head_dim]; None for gpt2 (learned positions)."""
    if args.block_style == "llama":
        a = llama_block_args(args)
        return precompute_freqs_cis(args.head_dim, a.max_seq_len, a.rope_theta, a.rope_scaling_args)
    if args.block_style == "qwen3":
        return precompute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta)
    return None


def _llama_ffn_hidden(ffn_dim: int) -> int:
    """The `hidden_dim` argument for which the llama FeedForward (multiple_of 1, no multiplier)
    builds exactly `ffn_dim` hidden units: int(2 h / 3) = ffn_dim."""
    return -(-3 * ffn_dim // 2)


def build_block(args: GRTModelArgs, layer_id: int) -> nn.Module:
    """One block of the configured style; init std scaled by the unrolled depth p + nR + c."""
    if args.block_style == "llama":
        block = LlamaBlock(layer_id, llama_block_args(args))
        if args.ffn_dim is not None:  # an explicit MLP width (a retrofitted source's)
            # Swapped in after the default MLP is built, as always: a CPU build draws the same numbers.
            block.feed_forward = LlamaFeedForward(args.dim, _llama_ffn_hidden(args.ffn_dim), 1, None)
        return block
    if args.block_style == "qwen3":
        return Qwen3Block(layer_id, qwen3_block_args(args))
    return GPT2Block(args, residual_init_std=0.02 / math.sqrt(2 * args.unrolled_layers))


class BlockStack(nn.Module):
    """A run of blocks, held in `layers` as torchtitan's helpers (AC, compile) expect."""

    def __init__(self, args: GRTModelArgs, num_layers: int, first_layer_id: int = 0):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): build_block(args, first_layer_id + i) for i in range(num_layers)})

    def forward(
        self,
        h: torch.Tensor,
        freqs_cis: torch.Tensor | None,
        adapters: list[BlockAdapter] | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        """`adapters`: one per block, the per-step LoRA of RRT (gpt2 blocks only). `rows`: some of
        h's [B * S] positions, the only rows returned ([N, dim]): every block's keys and values
        cover every position, the last block's queries and feed-forward those rows alone."""
        blocks = list(self.layers.values())
        if not blocks:
            return take_rows(h, rows)
        last = {} if rows is None else {"rows": rows}  # the blocks' own signature when not asked
        if adapters is None:
            for block in blocks[:-1]:
                h = block(h, freqs_cis, None)
            return blocks[-1](h, freqs_cis, None, **last)
        for block, adapter in zip(blocks[:-1], adapters[:-1], strict=True):
            h = block(h, freqs_cis, None, None, adapter)
        return blocks[-1](h, freqs_cis, None, None, adapters[-1], **last)

    def init_weights(self) -> None:
        for block in self.layers.values():
            block.init_weights()
