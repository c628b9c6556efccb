"""What a halted token's readers see (grt_titan/model/halting/rules.py; docs/generation.md,
"Per-token halting"): at every later step, in every core block, the K/V of the last step it
computed. The reference is written without the K/V substitution: a halted prefix reads only
itself (causal attention), so at any step the core recomputes its last step's K/V from the
core input it had then; later steps feed the core that input for it. `may_halt`: the tokens the
rule may halt; the others run to the maximum depth (a prompt prefilled at full depth)."""

import pytest
import torch

from grt_titan.model.halting.rules import Halting, halting_recurrence

from grt_test_helpers import build_model

DEPTH = 4
PREFIX = 5  # of 12 tokens
HALT_AT_ONCE = Halting("state", float("inf"), 1, DEPTH)  # halts every token it may after step 1


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request):
    # The gate starting near overwriting: each step rewrites the state, so a token's K/V of
    # step 1 and of step 2 differ and reading the wrong one shows.
    args = dict(state_noise_std=0.0, gate_noise_std=0.0, gate_bias_init=-4.0)
    return build_model("debug", seed=3, block_style=request.param, **args).eval()


def tokens():
    return torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(7))


def prelude(model, ids):
    return model.prelude(model.embed(ids), model.freqs_cis)


def prefix_halted_after_step_one(model, ids) -> torch.Tensor:
    """The state after DEPTH steps when the first PREFIX tokens halt after step 1 and the rest
    run on, by hand: the prefix keeps h_1 and, at each later step, its core input of step 1."""
    step = model.recurrence.step
    h, source = model.recurrence.start(prelude(model, ids), None)
    first_input = None
    for index in range(DEPTH):
        x = step.injection.core_input(step, h, source)
        if first_input is None:
            first_input = x[:, :PREFIX]
        x = torch.cat([first_input, x[:, PREFIX:]], dim=1)
        proposal = step.core(x, model.freqs_cis, step.step_adapter.step_adapters(step, None))
        new_h, _ = step.update.update(step, h, source, x, proposal, None)
        h = new_h if index == 0 else torch.cat([h[:, :PREFIX], new_h[:, PREFIX:]], dim=1)
    return h


@torch.no_grad()
def test_readers_see_a_halted_tokens_kv_of_its_last_step(model):
    ids = tokens()
    may_halt = torch.arange(ids.shape[1]) < PREFIX  # the prefix halts, the rest is held
    h, depths, _ = halting_recurrence(
        model.recurrence, prelude(model, ids), model.freqs_cis, HALT_AT_ONCE, may_halt=may_halt
    )
    assert depths.tolist() == [[1] * PREFIX + [DEPTH] * (ids.shape[1] - PREFIX)] * ids.shape[0]
    expected = prefix_halted_after_step_one(model, ids)
    torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-5)
    # What the readers would read if the prefix's K/V followed its kept state h_1 instead.
    fixed = model.recurrence(prelude(model, ids), model.freqs_cis, DEPTH).state
    assert (h[:, PREFIX:] - fixed[:, PREFIX:]).abs().max() > 1e-3


@torch.no_grad()
def test_tokens_held_from_halting_run_every_step_and_read_each_others_steps(model):
    """The held prefix is the fixed depth's forward there; the rest halts after step 1 (h_1)."""
    ids = tokens()
    may_halt = (torch.arange(ids.shape[1]) >= PREFIX).expand(ids.shape)
    h, depths, _ = halting_recurrence(
        model.recurrence, prelude(model, ids), model.freqs_cis, HALT_AT_ONCE, may_halt=may_halt
    )
    assert depths.tolist() == [[DEPTH] * PREFIX + [1] * (ids.shape[1] - PREFIX)] * ids.shape[0]
    deep = model.recurrence(prelude(model, ids), model.freqs_cis, DEPTH).state
    shallow = model.recurrence(prelude(model, ids), model.freqs_cis, 1).state
    torch.testing.assert_close(h[:, :PREFIX], deep[:, :PREFIX], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h[:, PREFIX:], shallow[:, PREFIX:], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_forward_with_halting_takes_may_halt_of_the_tokens_shape(model):
    ids = tokens()
    _, depths = model.forward_with_halting(
        ids, "state", float("inf"), num_recurrences=DEPTH, may_halt=torch.arange(12) >= PREFIX
    )
    assert depths[:, :PREFIX].eq(DEPTH).all() and depths[:, PREFIX:].eq(1).all()
    with pytest.raises(ValueError, match=r"may_halt: a bool tensor of the tokens' shape \(2, 12\)"):
        model.forward_with_halting(ids, "state", 0.1, may_halt=torch.ones(2, 11, dtype=torch.bool))
