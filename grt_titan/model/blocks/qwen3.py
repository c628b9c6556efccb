"""The qwen3 block: llama's (RMSNorm, SwiGLU, grouped-query attention) plus an RMSNorm of each
head's q and k, an explicit head width and MLP width, and RoPE on halves (a cos/sin cache).

A copy of torchtitan 0.2.2's dense qwen3 block (torchtitan/models/qwen3/model/model.py:
`precompute_rope_cache`, `rotate_half`, `reshape_for_broadcast`, `apply_rotary_emb`,
`Attention`, `FeedForward`, `TransformerBlock`), so that the GRT's parameter names
(`attention.q_norm`, `attention.wq`, `feed_forward.w1`, ...), its init and its numerics do not
change with the host torchtitan (0.3 renamed the parameters). Left out, as the GRT never uses
them: MoE, flex and varlen attention, attention masks, RoPE position ids, and blocks without
q/k norm. Added: the block's optional `rows` (blocks/rows.py: the attention's queries, the
feed-forward and the output at those positions alone, with `rotate`), which leaves every other
call as torchtitan's. The args are the fields of torchtitan's `Qwen3ModelArgs` that the block reads,
same names and defaults. tests/model/test_block_copies.py checks outputs, gradients, init and
the cache against the original.

Copyright (c) Meta Platforms, Inc. and affiliates. All rights reserved.
BSD-3-Clause, torchtitan's licence: grt_titan/model/LICENSE.torchtitan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .init import trunc_normal_
from .llama import check_causal_sdpa
from .rows import Rows, attend_at_rows, take_rows
from .sdpa import ScaledDotProductAttentionWrapper


@dataclass
class Qwen3BlockArgs:
    """What a qwen3 block reads (torchtitan's `Qwen3ModelArgs` names)."""

    dim: int = 1024
    n_layers: int = 28
    n_heads: int = 16
    n_kv_heads: int = 8
    head_dim: int = 128
    hidden_dim: int = 3072
    norm_eps: float = 1e-6
    # True: each block's init std uses its layer id; False: the total number of blocks.
    depth_init: bool = True


# Adapted by torchtitan from torchtune/models/qwen2/_positional_embeddings.py.
def precompute_rope_cache(dim: int, max_seq_len: int, base: float = 1_000_000.0) -> torch.Tensor:
    """The float32 cache [max_seq_len, 2 dim]: cos of the angles t f_j (each f_j twice, halves
    layout), then their sin; f_j = base^(-2j / dim)."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    # Create position indexes `[0, 1, ..., max_seq_len - 1]`
    t = torch.arange(max_seq_len, dtype=freqs.dtype, device=freqs.device)

    # Outer product of theta and position index; output tensor has
    # a shape of [max_seq_len, dim // 2]
    idx_theta = torch.outer(t, freqs).float()

    # cos and sin are cached rather than the angles: correct under bf16 training.
    # Size: [max_seq_len, (dim * 2)]
    freqs = torch.cat([idx_theta, idx_theta], dim=-1)
    rope_cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    return rope_cache


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def reshape_for_broadcast(rope_cache: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The first seqlen rows of `rope_cache` [max_seqlen, 2 head_dim], shaped to broadcast
    against `x` [bs, seqlen, heads, head_dim]."""
    ndim = x.ndim
    assert ndim > 1
    _, seqlen, _, head_dim = x.shape
    rope_cache = rope_cache[0:seqlen]
    # The shape of rope_cache is (seqlen, head_dim * 2) because we concate cos and sin
    assert rope_cache.shape == (seqlen, head_dim * 2)
    shape = [-1, seqlen, 1, head_dim * 2]
    return rope_cache.view(*shape)


def apply_rotary_emb(
    xq: torch.Tensor,
    xk: torch.Tensor,
    rope_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [bs, seqlen, heads, head_dim] and k [bs, seqlen, kv_heads, head_dim], halves
    layout, in the inputs' dtype."""
    head_dim = xq.shape[-1]

    rope_cache = reshape_for_broadcast(rope_cache, xq)

    # [bsz, seq_len, 1, head_dim]
    cos = rope_cache[..., :head_dim].to(dtype=xq.dtype, device=xq.device)
    sin = rope_cache[..., head_dim:].to(dtype=xq.dtype, device=xq.device)

    xq_out = (xq * cos) + (rotate_half(xq) * sin)
    xk_out = (xk * cos) + (rotate_half(xk) * sin)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def rotate(x: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor:
    """Ours: `apply_rotary_emb`'s RoPE on one tensor [..., heads, head_dim], `rope_cache` already
    shaped to broadcast against it, cos and sin side by side (the queries at some rows)."""
    head_dim = x.shape[-1]
    cos = rope_cache[..., :head_dim].to(dtype=x.dtype, device=x.device)
    sin = rope_cache[..., head_dim:].to(dtype=x.dtype, device=x.device)
    return ((x * cos) + (rotate_half(x) * sin)).type_as(x)


class Qwen3Attention(nn.Module):
    """Multi-head attention with per-head q/k RMSNorm before RoPE, an explicit head width, and
    the scale head_dim^-0.5. The four arguments of `forward` are what the TP plans prepare."""

    def __init__(self, model_args: Qwen3BlockArgs):
        super().__init__()
        self.n_heads = model_args.n_heads
        self.n_kv_heads = model_args.n_heads if model_args.n_kv_heads is None else model_args.n_kv_heads
        self.head_dim = model_args.head_dim
        self.scaling = self.head_dim**-0.5
        self.enable_gqa = self.n_heads > self.n_kv_heads

        # Registered before the linears: torchtitan's order, the state dict's key order.
        self.q_norm = nn.RMSNorm(self.head_dim, eps=model_args.norm_eps, elementwise_affine=True)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=model_args.norm_eps, elementwise_affine=True)

        self.wq = nn.Linear(model_args.dim, model_args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(model_args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(model_args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(model_args.n_heads * self.head_dim, model_args.dim, bias=False)
        self.inner_attention = ScaledDotProductAttentionWrapper()

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            trunc_normal_(linear.weight, mean=0.0, std=0.02)
        trunc_normal_(self.wo.weight, mean=0.0, std=init_std)
        self.q_norm.reset_parameters()
        self.k_norm.reset_parameters()

    def forward(
        self,
        x: torch.Tensor,
        rope_cache: torch.Tensor,
        attention_masks: object | None,
        positions: torch.Tensor | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        check_causal_sdpa(attention_masks, positions)
        if rows is not None:  # ours, not torchtitan's
            return self.wo(self.attend_at(x, rope_cache, rows))
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        # -1 heads, not n_heads / n_kv_heads: under tensor parallelism each rank holds a slice.
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)

        xq = self.q_norm(xq)
        xk = self.k_norm(xk)

        xq, xk = apply_rotary_emb(xq, xk, rope_cache)

        xq = xq.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
        xk = xk.transpose(1, 2)  # (bs, n_kv_heads, seqlen, head_dim)
        xv = xv.transpose(1, 2)  # (bs, n_kv_heads, seqlen, head_dim)

        output = self.inner_attention(xq, xk, xv, scale=self.scaling, enable_gqa=self.enable_gqa)
        output = output.transpose(1, 2).contiguous()  # (bs, seqlen, n_local_heads, head_dim)
        output = output.view(bs, seqlen, -1)
        return self.wo(output)

    def attend_at(self, x: torch.Tensor, rope_cache: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Ours: the attention's output before `wo` at `rows` alone, [N, heads * head_dim]: the
        queries there, the keys and values everywhere (blocks/rows.py)."""
        bs, seqlen, _ = x.shape
        xq = self.q_norm(self.wq(take_rows(x, rows)).unflatten(-1, (-1, self.head_dim)))
        xk = self.k_norm(self.wk(x).view(bs, seqlen, -1, self.head_dim))
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq = rotate(xq, rope_cache[rows.flat % seqlen][:, None])
        xk = rotate(xk, rope_cache[:seqlen][None, :, None])
        kv = (xk.transpose(1, 2), xv.transpose(1, 2))
        return attend_at_rows(self.inner_attention, xq, *kv, rows, scale=self.scaling, enable_gqa=self.enable_gqa)


class Qwen3FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), of exactly `hidden_dim` hidden units."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float) -> None:
        trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            trunc_normal_(linear.weight, mean=0.0, std=init_std)


class Qwen3Block(nn.Module):
    """Pre-norm block: x + attention(RMSNorm(x)), then + feed_forward(RMSNorm(.))."""

    def __init__(self, layer_id: int, model_args: Qwen3BlockArgs):
        super().__init__()
        self.attention = Qwen3Attention(model_args)
        self.feed_forward = Qwen3FeedForward(dim=model_args.dim, hidden_dim=model_args.hidden_dim)
        self.attention_norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.ffn_norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)

        if model_args.depth_init:
            self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
        else:
            self.weight_init_std = 0.02 / (2 * model_args.n_layers) ** 0.5

    def forward(
        self,
        x: torch.Tensor,
        rope_cache: torch.Tensor,
        attention_masks: object | None,
        positions: torch.Tensor | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        # `rows` (ours, not torchtitan's): only those flat positions returned (blocks/rows.py).
        attention_at = {} if rows is None else {"rows": rows}
        x = take_rows(x, rows) + self.attention(
            self.attention_norm(x), rope_cache, attention_masks, positions, **attention_at
        )
        x = x + self.feed_forward(self.ffn_norm(x))
        return x

    def init_weights(self) -> None:
        """torchtitan's takes a `buffer_device` for MoE layers; these blocks are dense."""
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)
