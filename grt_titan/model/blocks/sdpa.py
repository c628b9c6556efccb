"""The attention kernel of every block: causal `F.scaled_dot_product_attention` as a module.

A copy of torchtitan 0.2.2's `ScaledDotProductAttentionWrapper`
(torchtitan/models/attention.py), so that the blocks do not change with the host torchtitan
(0.3 reorganised its models and renamed their parameters). A module, not a function, so that
a parallel plan can name it (`attention.inner_attention`); it holds no parameters.

Copyright (c) Meta Platforms, Inc. and affiliates. All rights reserved.
BSD-3-Clause, torchtitan's licence: grt_titan/model/LICENSE.torchtitan.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class ScaledDotProductAttentionWrapper(nn.Module):
    """`F.scaled_dot_product_attention`, causal by default, under torchtitan's backend order.

    q, k, v are the first three arguments (what torchtitan's context-parallel wrapper expects).
    """

    # These backends only (no memory-efficient kernel), tried in this order (set_priority).
    sdpa_backends: list[SDPBackend] = []

    def __init__(self) -> None:
        super().__init__()
        if not self.sdpa_backends:
            self.sdpa_backends = [
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.MATH,
            ]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
        is_causal: bool = True,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`attn_mask` (ours, with is_causal=False): the queries at some rows only (blocks/rows.py)."""
        with sdpa_kernel(self.sdpa_backends, set_priority=True):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa
            )
