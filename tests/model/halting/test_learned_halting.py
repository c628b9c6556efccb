"""The learned halting rule (grt_titan/model/halting/rules.py, `HaltingProbe`; docs/tasks.md, "A learned
halting rule"): its targets by hand, each token's depth and logits by hand on rows of one token,
the threshold limits against the fixed depth, and the refusals."""

import pytest
import torch

from grt_titan.model.halting.rules import HaltingProbe, consistency_targets

from grt_test_helpers import build_model

MAX_DEPTH = 6  # above the debug flavor's R: the rule may extrapolate
INF = float("inf")


@pytest.fixture(scope="module")
def model_and_probe():
    model = build_model("debug", seed=2, state_noise_std=0.0, gate_noise_std=0.0).eval()
    torch.manual_seed(5)
    return model, HaltingProbe(model.model_args.dim)


def ids(batch, seq, seed):
    return torch.randint(0, 200, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_targets_are_the_last_steps_token_held_from_there_on():
    # steps down the first axis; columns: always the same; arrives at 2; right at 1, changed at 2,
    # back from 3; right only at the last step
    tokens = torch.tensor([[5, 1, 2, 3], [5, 2, 1, 3], [5, 2, 2, 1], [5, 2, 2, 3]])[:, None, :]
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)[:, None, :]
    assert torch.equal(consistency_targets(tokens), expected)


def test_each_token_halts_where_its_probe_says_on_rows_of_one_token(model_and_probe):
    """One-token rows see only themselves: a token's depth is the first step s >= 2 at which
    1 - sigmoid(probe(h_s)) (h_s from the fixed-depth forward) is below the threshold, and its
    logits are the fixed-depth forward's at that depth."""
    model, probe = model_and_probe
    tokens, min_depth = ids(16, 1, seed=3), 2
    with torch.no_grad():
        h_pre = model.prelude(model.embed(tokens), model.freqs_cis)
        states = model.recurrence(h_pre, model.freqs_cis, MAX_DEPTH, all_states=True).step_states
        measures = torch.stack([1 - torch.sigmoid(probe(h)) for h in states])  # [depth, B, 1]
    after_min = measures[min_depth - 1].flatten().sort().values
    threshold = float(after_min[len(after_min) // 2 - 1 : len(after_min) // 2 + 1].mean())  # half halt at 2
    steps = torch.arange(1, MAX_DEPTH + 1)[:, None, None]
    below = (measures < threshold) & (steps >= min_depth)
    expected = torch.where(below.any(0), below.int().argmax(0) + 1, MAX_DEPTH)
    assert len(expected.unique()) > 1, expected
    with torch.no_grad():
        logits, depths = model.forward_with_halting(
            tokens, "learned", threshold, min_recurrences=min_depth, num_recurrences=MAX_DEPTH, probe=probe
        )
        assert torch.equal(depths, expected)
        for row, depth in enumerate(expected[:, 0].tolist()):
            alone = model(tokens[row : row + 1], num_recurrences=depth)
            assert torch.allclose(logits[row : row + 1], alone, atol=1e-5, rtol=0), (row, depth)


def test_threshold_zero_is_the_fixed_depth_and_infinity_the_minimum(model_and_probe):
    model, probe = model_and_probe
    tokens = ids(2, 9, seed=4)
    with torch.no_grad():
        never, never_depths = model.forward_with_halting(tokens, "learned", 0.0, num_recurrences=MAX_DEPTH, probe=probe)
        always, always_depths = model.forward_with_halting(
            tokens, "learned", INF, min_recurrences=2, num_recurrences=MAX_DEPTH, probe=probe
        )
        assert torch.equal(never, model(tokens, num_recurrences=MAX_DEPTH)) and (never_depths == MAX_DEPTH).all()
        assert torch.equal(always, model(tokens, num_recurrences=2)) and (always_depths == 2).all()


@pytest.mark.parametrize(
    "halting, threshold, probe, error",
    [
        ("learned", 0.1, None, "halting = 'learned' needs probe = a HaltingProbe fitted to this model"),
        ("learned", 0.1, HaltingProbe(8), "probe reads states of dim 8; this model's dim is"),
        ("learned", None, "ok", "halting = 'learned' needs halting_threshold"),
        ("learned", -1.0, "ok", r"halting_threshold = -1.0; allowed: >= 0"),
        ("state", 0.1, "ok", "probe given with halting = 'state': only halting = 'learned' reads one"),
    ],
)
def test_bad_learned_halting_arguments_are_named(halting, threshold, probe, error, model_and_probe):
    model, fitted = model_and_probe
    with pytest.raises(ValueError, match=error), torch.no_grad():
        model.forward_with_halting(ids(1, 4, seed=0), halting, threshold, probe=fitted if probe == "ok" else probe)
