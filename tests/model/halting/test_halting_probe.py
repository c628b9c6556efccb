"""Fitting the learned halting rule's probe (grt_titan/model/halting/probe.py): its states
and targets against the fixed-depth forwards, the probe learning its targets beyond their base
rate on fresh tokens with the model unchanged, the positions it learns from, and its refusals."""

import pytest
import torch
import torch.nn.functional as F

from grt_titan.model.halting.probe import fit_halting_probe, step_states_and_targets

from grt_test_helpers import MOR_PARTS, build_model

DEPTH = 4


@pytest.fixture(scope="module")
def model():
    # a gate that starts near overwriting: the readout moves from step to step (at +4 it holds)
    return build_model(
        "debug", seed=1, state_noise_std=0.0, gate_noise_std=0.0, gate_bias_init=-4.0, vocab_size=256
    ).eval()


def batches(seed, batch=4, seq=16, positions=None):
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(0, 256, (batch, seq), generator=generator), positions


def test_states_and_targets_are_the_fixed_depth_forwards(model):
    """Step s's state read out is the forward at r = s; the target is True where the argmax at
    s is the one at DEPTH and no step between changes it (by hand, from the forwards)."""
    tokens = next(batches(0))[0]
    states, targets = step_states_and_targets(model, tokens, DEPTH)
    vocab = model.model_args.vocab_size
    with torch.no_grad():
        tops = [model(tokens, num_recurrences=s)[..., :vocab].argmax(-1) for s in range(1, DEPTH + 1)]
        for s in range(DEPTH):
            assert torch.equal(model.logits_from_state(states[s]), model(tokens, num_recurrences=s + 1))
    for s in range(DEPTH):
        held = torch.stack([tops[t] == tops[-1] for t in range(s, DEPTH)]).all(0)
        assert torch.equal(targets[s], held), s
    assert targets[-1].all() and not targets[0].all()  # a mix, or the test proves nothing


def test_the_probe_learns_its_targets_beyond_their_base_rate_and_leaves_the_model(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe, log = fit_halting_probe(model, batches(1), steps=60, depth=DEPTH, lr=1e-2)
    assert [step for step, _ in log] == [50, 60]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not model.training
    states, targets = step_states_and_targets(model, next(batches(99, batch=16))[0], DEPTH)  # fresh tokens
    base = targets.float().mean()
    with torch.no_grad():
        fitted = F.binary_cross_entropy_with_logits(probe(states), targets.float()).item()
    constant = F.binary_cross_entropy(base.expand(targets.shape), targets.float()).item()
    assert fitted < 0.85 * constant, (fitted, constant)  # 0.73x when written


def test_only_the_positions_asked_are_learned_from(model):
    """With every position but the first masked off, the fitted probe is the one fitted to
    that position's rows alone."""
    positions = torch.zeros(4, 16, dtype=torch.bool)
    positions[:, 0] = True
    torch.manual_seed(0)
    masked, _ = fit_halting_probe(model, batches(2, positions=positions), steps=5, depth=DEPTH)
    first = ((tokens[:, :1], None) for tokens, _ in batches(2))
    torch.manual_seed(0)
    alone, _ = fit_halting_probe(model, first, steps=5, depth=DEPTH)
    torch.manual_seed(0)
    every, _ = fit_halting_probe(model, batches(2), steps=5, depth=DEPTH)
    for a, b, c in zip(masked.parameters(), alone.parameters(), every.parameters()):
        assert (a - b).abs().max() < 1e-4 < (a - c).abs().max()  # 5 steps of lr 3e-3 move it ~1e-2


def test_the_default_depth_is_the_eval_depth(model):
    torch.manual_seed(0)
    default, _ = fit_halting_probe(model, batches(3), steps=3)
    torch.manual_seed(0)
    explicit, _ = fit_halting_probe(model, batches(3), steps=3, depth=DEPTH)
    assert model.recurrence.eval_recurrences == DEPTH
    for a, b in zip(default.parameters(), explicit.parameters()):
        assert torch.equal(a, b)


def test_refusals_name_the_cause(model):
    with pytest.raises(ValueError, match="steps = 0; allowed: >= 1"):
        fit_halting_probe(model, batches(0), steps=0, depth=DEPTH)
    with pytest.raises(ValueError, match="batches ran out after 2 of 3 steps"):
        fit_halting_probe(model, [next(batches(0))] * 2, steps=3, depth=DEPTH)
    dense = build_model("debug", n_core_layers=0, num_recurrences=0)
    with pytest.raises(ValueError, match="a halting probe needs a recurrent model"):
        fit_halting_probe(dense, batches(0), steps=1, depth=DEPTH)
    mor = build_model("debug", **MOR_PARTS).eval()  # its router chooses each token's steps
    with pytest.raises(ValueError, match="halting = 'learned' is not supported with router = "):
        fit_halting_probe(mor, batches(0), steps=1, depth=DEPTH)
