"""A block asked for some rows (grt_titan/model/blocks/rows.py) runs its attention's queries and
its feed-forward there alone. The independent computation: the whole block, then those rows
taken. Rows fall unevenly over the sequences (one with none, one at position 0 alone)."""

import pytest
import torch

from grt_titan.model.blocks.rows import at_rows, take_rows
from grt_titan.model.methods.rrt import BlockAdapter, _linear_shapes

from grt_test_helpers import build_model

BATCH, SEQLEN = 3, 12
# Sequence 0: four rows, up to the last position; sequence 1: none; sequence 2: position 0 alone.
FLAT = torch.tensor([2, 5, 6, 11, 2 * SEQLEN])


def random_adapter(dim: int, rank: int = 4) -> BlockAdapter:
    """RRT's LoRA factors with a nonzero B (its init is zero, which would hide the delta)."""
    g = torch.Generator().manual_seed(1)
    factors = [
        (torch.randn(rank, fan_in, generator=g) * 0.1, torch.randn(fan_out, rank, generator=g) * 0.1)
        for fan_in, fan_out in _linear_shapes(dim).values()
    ]
    return BlockAdapter(*factors, scale=2.0)


@pytest.mark.parametrize(
    "changes, adapted",
    [
        ({}, False),
        ({}, True),
        ({"block_style": "llama", "n_kv_heads": 2}, False),
        ({"block_style": "qwen3", "n_kv_heads": 2}, False),
    ],
    ids=["gpt2", "gpt2_lora", "llama_gqa", "qwen3_gqa"],
)
def test_a_block_at_some_rows_is_the_whole_block_read_there(changes, adapted):
    model = build_model(**changes)
    block = model.coda.layers["0"]
    args = (model.freqs_cis, None, None) + ((random_adapter(model.model_args.dim),) if adapted else ())
    x = torch.randn(BATCH, SEQLEN, model.model_args.dim, generator=torch.Generator().manual_seed(0))
    x.requires_grad_(True)

    got = block(x, *args, rows=at_rows(FLAT, BATCH, SEQLEN))
    want = take_rows(block(x, *args), at_rows(FLAT, BATCH, SEQLEN))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(2))
    params = [x, *block.parameters()]
    grads = torch.autograd.grad((got * weights).sum(), params)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    for grad, want_grad in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)


def test_the_rows_grid_holds_each_sequences_positions_in_order():
    rows = at_rows(FLAT, BATCH, SEQLEN)
    assert rows.sequence.tolist() == [0, 0, 0, 0, 2]
    assert rows.slot.tolist() == [0, 1, 2, 3, 0]
    assert rows.positions.tolist() == [[2, 5, 6, 11], [0, 0, 0, 0], [0, 0, 0, 0]]
    none = at_rows(torch.zeros(0, dtype=torch.long), BATCH, SEQLEN)
    assert none.positions.shape == (BATCH, 1)  # one empty slot: the kernel never sees zero queries
