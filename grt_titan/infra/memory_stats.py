"""Bytes an autograd forward keeps for backward, for tests and the activation benchmark."""

from __future__ import annotations

import torch
from torch import nn


def saved_activation_bytes(model: nn.Module, tokens: torch.Tensor, **forward_kwargs) -> int:
    """Bytes of the distinct storages saved for backward by `model(tokens, **kwargs)`.

    Counted with `torch.autograd.graph.saved_tensors_hooks`: a checkpointed region saves
    only its inputs, and a tensor saved by several ops is counted once.
    """
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, **forward_kwargs)
    return sum(storages.values())
