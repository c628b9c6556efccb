"""A block's output at some positions only: a readout scored at a few positions (per-step
supervision scores the answers alone) runs its last feed-forward, the final norm and the LM
head on those rows, while the attention before them reads every position."""

from __future__ import annotations

import torch


def take_rows(h: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """h [B, S, dim] -> [N, dim] at `rows` (flat indices into the B * S positions); None: h."""
    return h if rows is None else h.flatten(0, 1).index_select(0, rows)
