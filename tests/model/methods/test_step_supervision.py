"""Per-step supervision's readout (grt_titan/model/methods/step_supervision.py) runs the coda's
last feed-forward, the norm and the head at the scored positions alone. The independent
computation: every step's state read out at every position by `logits_from_state`, the
cross-entropy of each step against its target taken by hand; loss and gradients agree, for
every block style and with no coda or two coda blocks."""

import pytest
import torch
import torch.nn.functional as F

from grt_titan.components.loss import grt_loss
from grt_titan.model.methods.step_supervision import scored_rows
from grt_titan.model.part import IGNORE_INDEX

from grt_test_helpers import build_model

DEPTH, STEPS_GIVEN = 3, 2  # step 3 trains on the final labels


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [2, 16]; answers at positions 9-12 of row 0 and 5-6 of row 1, the rest prompt."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (2, 16), generator=g)
    labels = torch.full((2, 16), IGNORE_INDEX)
    labels[0, 9:13] = torch.randint(0, vocab, (4,), generator=g)
    labels[1, 5:7] = torch.randint(0, vocab, (2,), generator=g)
    step_labels = torch.randint(0, vocab, (2, 16, STEPS_GIVEN), generator=g)
    return tokens, labels, step_labels.masked_fill((labels == IGNORE_INDEX)[..., None], IGNORE_INDEX)


def loss_by_hand(model, tokens, labels, step_labels) -> torch.Tensor:
    h = model.prelude(model.embed(tokens), model.freqs_cis)
    states = model.recurrence(h, model.freqs_cis, DEPTH, all_states=True).step_states
    total = 0.0
    for t, state in enumerate(states):
        target = step_labels[..., t] if t < STEPS_GIVEN else labels
        logits = model.logits_from_state(state)  # every position
        total = total + F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum") / DEPTH
    return total


@pytest.mark.parametrize(
    "changes",
    [{}, {"block_style": "llama"}, {"block_style": "qwen3"}, {"n_coda_layers": 0}, {"n_coda_layers": 2}],
    ids=["gpt2", "llama", "qwen3", "no_coda", "two_coda_blocks"],
)
def test_the_readout_at_the_scored_rows_gives_the_full_readouts_loss_and_gradients(changes):
    model = build_model(step_supervision=True, state_noise_std=0.0, gate_noise_std=0.0, **changes)
    tokens, labels, step_labels = batch(model.model_args.vocab_size)
    out = model(tokens, num_recurrences=DEPTH, step_labels=step_labels)
    scored = labels != IGNORE_INDEX
    assert out.step_logits.shape == (DEPTH, *tokens.shape, model.model_args.padded_vocab_size)
    assert not out.step_logits[:, ~scored].any() and out.step_logits[:, scored].abs().min() > 0
    loss = grt_loss(out, labels)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    expected = loss_by_hand(model, tokens, labels, step_labels)
    expected_grads = torch.autograd.grad(expected, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_rows_are_each_steps_scored_positions_and_none_for_a_slice_of_the_sequence():
    _, labels, step_labels = batch(64)
    rows = scored_rows(step_labels, torch.zeros(2, 16, 8), steps=2)
    scored = torch.cat([(labels != IGNORE_INDEX).flatten()] * 2).nonzero().squeeze(1)
    assert torch.equal(rows, scored)  # step 2's rows follow step 1's B * S positions
    # Sequence parallel: the state holds this rank's half of the positions, read out whole.
    assert scored_rows(step_labels, torch.zeros(2, 8, 8), steps=2) is None
    assert scored_rows(None, torch.zeros(2, 16, 8), steps=2) is None
