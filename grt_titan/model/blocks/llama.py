"""The llama block: RMSNorm, SwiGLU MLP, RoPE (with llama3's frequency scaling), grouped-query
attention.

A copy of torchtitan 0.2.2's llama3 block (torchtitan/models/llama3/model/model.py:
`precompute_freqs_cis`, `reshape_for_broadcast`, `apply_rotary_emb`, `Attention`,
`FeedForward`, `TransformerBlock`; and torchtitan/models/llama3/model/args.py's `RoPEScalingArgs`),
so that the GRT's parameter names (`attention.wq`, `feed_forward.w1`, `attention_norm`, ...),
its init and its numerics do not change with the host torchtitan (0.3 renamed the parameters).
Left out, as the GRT never uses them: flex and varlen attention, attention masks and RoPE
position ids (sdpa, causal, positions 0..S-1 only). Added: the block's optional `rows`
(blocks/rows.py: the attention's queries, the feed-forward and the output at those positions
alone, with `rotate`), which leaves every other call as torchtitan's. The args are the fields of
torchtitan's `TransformerModelArgs` that the block and its RoPE table read, same names and
defaults.
tests/model/test_block_copies.py checks outputs, gradients, init and tables against the original.

Copyright (c) Meta Platforms, Inc. and affiliates. All rights reserved.
BSD-3-Clause, torchtitan's licence: grt_titan/model/LICENSE.torchtitan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .init import trunc_normal_
from .rows import Rows, attend_at_rows, take_rows
from .sdpa import ScaledDotProductAttentionWrapper


@dataclass
class RoPEScalingArgs:
    """llama3's RoPE scaling: low frequencies divided by `scaling_factor`, high ones kept,
    a linear blend between (wavelengths measured against `original_max_position_embeddings`)."""

    scaling_factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class LlamaBlockArgs:
    """What a llama block and its RoPE table read (torchtitan's `TransformerModelArgs` names)."""

    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    multiple_of: int = 256  # make SwiGLU hidden layer size multiple of large power of 2
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000
    rope_scaling_args: RoPEScalingArgs = field(default_factory=RoPEScalingArgs)
    max_seq_len: int = 131072
    # True: each block's init std uses its layer id; False: the total number of blocks.
    depth_init: bool = True


def precompute_freqs_cis(
    dim: int,
    end: int,
    theta: float = 10000.0,
    scaling_args: RoPEScalingArgs = RoPEScalingArgs(),
) -> torch.Tensor:
    """The complex64 table [end, dim / 2] of e^(i t f_j): positions t times llama3-scaled
    frequencies f_j = theta^(-2j / dim)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))

    # apply rope scaling
    scaling_factor = scaling_args.scaling_factor
    low_freq_factor = scaling_args.low_freq_factor
    high_freq_factor = scaling_args.high_freq_factor
    original_max_position_embeddings = scaling_args.original_max_position_embeddings
    wavelen = 2 * math.pi / freqs
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    # wavelen < high_freq_wavelen: do nothing
    # wavelen > low_freq_wavelen: divide by scaling factor
    freqs = torch.where(wavelen > low_freq_wavelen, freqs / scaling_factor, freqs)
    # wavelen in between: linear interpolation of the scaled freqs and the original freqs
    smooth_factor = (original_max_position_embeddings / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed_freqs = (1 - smooth_factor) * freqs / scaling_factor + smooth_factor * freqs
    is_medium_freqs = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    freqs = torch.where(is_medium_freqs, smoothed_freqs, freqs)

    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    return freqs_cis


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The first seqlen rows of `freqs_cis` [max_seqlen, dim / 2], shaped to broadcast
    against `x` [bs, seqlen, heads, dim / 2]."""
    ndim = x.ndim
    assert ndim > 1
    seqlen = x.shape[1]
    freqs_cis = freqs_cis[0:seqlen]
    assert freqs_cis.shape == (seqlen, x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(
    xq: torch.Tensor,
    xk: torch.Tensor,
    freqs_cis: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q and k [bs, seqlen, heads, head_dim]: interleaved pairs as complex numbers,
    times `freqs_cis`, in float32, cast back to the inputs' dtype."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def rotate(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Ours: `apply_rotary_emb`'s RoPE on one tensor [..., heads, head_dim], `freqs_cis` already
    shaped to broadcast against its [..., heads, head_dim / 2] (the queries at some rows)."""
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(-2).type_as(x)


def check_causal_sdpa(attention_masks: object | None, positions: torch.Tensor | None) -> None:
    """The copies implement causal sdpa over positions 0..S-1 only (what the GRT runs)."""
    if attention_masks is not None or positions is not None:
        raise ValueError("these blocks run causal sdpa attention only: no attention masks, no positions")


class LlamaAttention(nn.Module):
    """Multi-head attention with RoPE; n_kv_heads < n_heads is grouped-query attention (sdpa's
    enable_gqa). The four arguments of `forward` are what the TP plans prepare."""

    def __init__(self, model_args: LlamaBlockArgs):
        super().__init__()
        self.n_heads = model_args.n_heads
        self.n_kv_heads = model_args.n_heads if model_args.n_kv_heads is None else model_args.n_kv_heads
        self.head_dim = model_args.dim // model_args.n_heads
        self.enable_gqa = self.n_heads > self.n_kv_heads

        self.wq = nn.Linear(model_args.dim, model_args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(model_args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(model_args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(model_args.n_heads * self.head_dim, model_args.dim, bias=False)
        self.inner_attention = ScaledDotProductAttentionWrapper()

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            trunc_normal_(linear.weight, mean=0.0, std=0.02)
        trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor,
        attention_masks: object | None,
        positions: torch.Tensor | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        check_causal_sdpa(attention_masks, positions)
        if rows is not None:  # ours, not torchtitan's
            return self.wo(self.attend_at(x, freqs_cis, rows))
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        # -1 heads, not n_heads / n_kv_heads: under tensor parallelism each rank holds a slice.
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)

        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        xk = xk.transpose(1, 2)  # (bs, n_kv_heads, seqlen, head_dim)
        xv = xv.transpose(1, 2)  # (bs, n_kv_heads, seqlen, head_dim)

        output = self.inner_attention(xq, xk, xv, enable_gqa=self.enable_gqa).transpose(1, 2).contiguous()
        output = output.view(bs, seqlen, -1)
        return self.wo(output)

    def attend_at(self, x: torch.Tensor, freqs_cis: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Ours: the attention's output before `wo` at `rows` alone, [N, heads * head_dim]: the
        queries there, the keys and values everywhere (blocks/rows.py)."""
        bs, seqlen, _ = x.shape
        xq = self.wq(take_rows(x, rows)).unflatten(-1, (-1, self.head_dim))
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq = rotate(xq, freqs_cis[rows.flat % seqlen][:, None])
        xk = rotate(xk, freqs_cis[:seqlen][None, :, None])
        kv = (xk.transpose(1, 2), xv.transpose(1, 2))
        return attend_at_rows(self.inner_attention, xq, *kv, rows, enable_gqa=self.enable_gqa)


class LlamaFeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x). Hidden width int(2 hidden_dim / 3), times
    ffn_dim_multiplier if set, rounded up to a multiple of multiple_of."""

    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float | None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        # custom dim factor multiplier
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)

        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float) -> None:
        trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            trunc_normal_(linear.weight, mean=0.0, std=init_std)


class LlamaBlock(nn.Module):
    """Pre-norm block: h = x + attention(RMSNorm(x)), out = h + feed_forward(RMSNorm(h))."""

    def __init__(self, layer_id: int, model_args: LlamaBlockArgs):
        super().__init__()
        self.attention = LlamaAttention(model_args)
        self.feed_forward = LlamaFeedForward(
            dim=model_args.dim,
            hidden_dim=4 * model_args.dim,
            multiple_of=model_args.multiple_of,
            ffn_dim_multiplier=model_args.ffn_dim_multiplier,
        )
        self.attention_norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.ffn_norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)

        if model_args.depth_init:
            self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
        else:
            self.weight_init_std = 0.02 / (2 * model_args.n_layers) ** 0.5

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor,
        attention_masks: object | None,
        positions: torch.Tensor | None = None,
        rows: Rows | None = None,
    ) -> torch.Tensor:
        # `rows` (ours, not torchtitan's): only those flat positions returned (blocks/rows.py).
        attention_at = {} if rows is None else {"rows": rows}
        h = take_rows(x, rows) + self.attention(
            self.attention_norm(x), freqs_cis, attention_masks, positions, **attention_at
        )
        out = h + self.feed_forward(self.ffn_norm(h))
        return out

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)
