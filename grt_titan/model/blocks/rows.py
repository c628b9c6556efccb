"""A block's output at some positions only: a readout scored at a few positions (per-step
supervision scores the answers alone) runs its last block's attention queries, feed-forward, the
final norm and the LM head on those rows, while the keys and values still cover every position.

The attention at the rows is the causal attention of the whole sequence, read at those rows: each
sequence's queries sit in a [B, W] grid (W: the most rows of one sequence) and attend to the keys
at or before their own position; the grid's empty slots attend to key 0 and are dropped."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class Rows(NamedTuple):
    """Some positions of a [B, S] batch, and their place in the queries' [B, W] grid. A
    NamedTuple, so that a compiled block sees its tensors (sizes marked dynamic by `at_rows`)."""

    flat: torch.Tensor  # [N] flat indices into the B * S positions, ascending
    sequence: torch.Tensor  # [N] each row's sequence
    slot: torch.Tensor  # [N] its place among its sequence's rows
    positions: torch.Tensor  # [B, W] each sequence's row positions, the empty slots 0


def at_rows(flat: torch.Tensor, batch: int, seqlen: int) -> Rows:
    """The `Rows` of ascending flat indices into a [batch, seqlen] batch. Counts its rows (a host
    sync): call it once per readout, outside any compiled block."""
    sequence, position = flat // seqlen, flat % seqlen
    counts = torch.bincount(sequence, minlength=batch)
    slot = torch.arange(flat.numel(), device=flat.device) - (counts.cumsum(0) - counts)[sequence]
    positions = flat.new_zeros(batch, max(int(counts.max()), 1))  # one empty slot when none is scored
    positions[sequence, slot] = position
    rows = Rows(flat, sequence, slot, positions)
    # Every size follows r and the batch's answers: a compiled coda block traces them symbolic
    # from its first call, not once per r.
    for tensor in rows:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
    torch._dynamo.maybe_mark_dynamic(positions, 1)
    return rows


def take_rows(h: torch.Tensor, rows: Rows | None) -> torch.Tensor:
    """h [B, S, dim] -> [N, dim] at `rows`; None: h."""
    return h if rows is None else h.flatten(0, 1).index_select(0, rows.flat)


def attend_at_rows(
    inner_attention: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, **kwargs
) -> torch.Tensor:
    """Causal attention read at `rows`: queries q [N, heads, head_dim] (at those rows), keys and
    values k, v [B, kv_heads, S, head_dim] (every position) -> [N, heads * head_dim]. `kwargs`
    go to the kernel (scale, enable_gqa)."""
    batch, seqlen = k.shape[0], k.shape[2]
    grid = q.new_zeros(batch, rows.positions.shape[1], *q.shape[1:]).index_put((rows.sequence, rows.slot), q)
    mask = torch.arange(seqlen, device=q.device) <= rows.positions[..., None]  # [B, W, S]
    out = inner_attention(grid.transpose(1, 2), k, v, attn_mask=mask[:, None], is_causal=False, **kwargs)
    return out.transpose(1, 2)[rows.sequence, rows.slot].flatten(1)
