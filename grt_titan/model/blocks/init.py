"""`trunc_normal_`, the truncated-normal init of every GRT linear.

A copy of torchtitan 0.2.2's `trunc_normal_` (torchtitan/models/utils.py), so that the
model's init does not change with the host torchtitan (0.3 reorganised its models and
renamed their parameters); tests/model/test_block_copies.py checks it draws what the
original draws under the same seed.

Copyright (c) Meta Platforms, Inc. and affiliates. All rights reserved.
BSD-3-Clause, torchtitan's licence: grt_titan/model/LICENSE.torchtitan.
"""

from __future__ import annotations

import torch
from torch import nn


def trunc_normal_(
    tensor: torch.Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
) -> None:
    """Fill `tensor` from N(mean, std^2) truncated to [a, b] (absolute bounds, not stds).

    Drawn in float32 and cast back: torch's trunc_normal_ is unstable in low precision.
    """
    tmp = tensor.float()
    nn.init.trunc_normal_(tmp, mean=mean, std=std, a=a, b=b)
    tensor.copy_(tmp)
