"""SCSE (grt_titan/model/methods/scse.py) against the paper's equations written out by hand: the
anchor h* = e + a A e, h_0 = e + b B e, Delta <- Delta + m_b s G(Delta) with G(Delta) =
core(Delta) - Delta and m_b = 1{||Delta^(b)||_F^2 > eps} per sequence, readout of h* + Delta."""

import pytest
import torch
import torch.nn.functional as F

from grt_titan.model.flavors import DEBUG_VOCAB_SIZE

from grt_test_helpers import SCSE_PARTS, build_model, nonzero_biases

VOCAB = DEBUG_VOCAB_SIZE  # the debug flavor's (gpt2_4k.tiktoken)


def tokens(batch=2, seq=12, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def scse_model(block_style="llama", **changes):
    return build_model(**{**SCSE_PARTS, "block_style": block_style, **changes}).eval()


def reference_logits(model, x, depth):
    """The equations by hand, in the model's dtype: e from the prelude, then the loop on the
    deviation with the core blocks called one by one, the mask as a plain norm per sequence."""
    args, anchor = model.model_args, model.recurrence.anchor
    e = model.prelude(model.embed(x), model.freqs_cis)
    h_star = e + args.anchor_scale * (e @ anchor.anchor_proj.weight.T)
    delta = e + args.initial_deviation_scale * (e @ anchor.init_delta_proj.weight.T) - h_star
    for _ in range(depth):
        core = delta
        for block in model.recurrence.step.core.layers.values():
            core = block(core, model.freqs_cis, None)
        mask = torch.stack([(d * d).sum() > args.deviation_mask_eps for d in delta]).to(delta.dtype)
        delta = delta + mask[:, None, None] * args.deviation_step_size * (core - delta)
    return model.output(model.norm(model.coda(h_star + delta, model.freqs_cis)))


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_forward_matches_the_equations_by_hand_in_float64(depth):
    model = scse_model().double()
    x = tokens()
    with torch.no_grad():
        got = model(x, num_recurrences=depth)
        want = reference_logits(model, x, depth)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # Depth matters: the deviation evolves.
    with torch.no_grad():
        assert not torch.allclose(got, model(x, num_recurrences=depth + 1))


@pytest.mark.parametrize("block_style", ["llama", "gpt2"])
def test_the_anchor_is_a_fixed_point_bitwise_at_every_depth(block_style):
    """B = A gives h_0 = h* (Delta_0 = 0), and then every depth reads out exactly r = 0's
    logits: llama blocks map 0 to 0, and for GPT-2 blocks (G(0) != 0) the mask holds it."""
    model = scse_model(block_style)
    nonzero_biases(model.recurrence.step.core)  # GPT-2's: G(0) != 0
    with torch.no_grad():
        model.recurrence.anchor.init_delta_proj.weight.copy_(model.recurrence.anchor.anchor_proj.weight)
        x = tokens()
        at_anchor = model(x, num_recurrences=0)
        for depth in (1, 2, 5, 16):
            assert torch.equal(model(x, num_recurrences=depth), at_anchor), depth


def step_from(model, h, source):
    with torch.no_grad():
        return model.recurrence.step(h, source, model.freqs_cis)


@pytest.mark.parametrize("block_style", ["llama", "gpt2"])
def test_the_mask_is_per_sequence(block_style):
    """Sequence 0 at its anchor stays bitwise; sequence 1 (one position off its anchor) moves
    at every position, the ones with zero deviation too: the mask is the sequence's, not the
    token's. Without the mask (eps < 0) a GPT-2 core moves the anchor (G(0) != 0), a llama
    core does not (G(0) = 0)."""
    model = scse_model(block_style)
    torch.manual_seed(0)
    nonzero_biases(model.recurrence.step.core)
    source = torch.randn(2, 12, model.model_args.dim)
    h = source.clone()
    h[1, 5] += 0.5  # sequence 1: deviation at position 5 only
    new = step_from(model, h, source)
    assert torch.equal(new[0], h[0])
    moved = (new[1] - h[1]).abs().amax(-1)
    assert bool((moved[5:] > 0).all())  # causal: positions >= 5 see the deviation
    model.recurrence.step.deviation.mask_eps = -1.0  # every sequence updated: no mask
    drift = (step_from(model, source, source) - source).abs().max()
    assert (drift > 0) if block_style == "gpt2" else (drift == 0)


def test_the_step_reads_the_deviation_and_adds_s_times_the_core_residual():
    model = scse_model().double()
    torch.manual_seed(0)
    source, h = torch.randn(2, 2, 12, model.model_args.dim, dtype=torch.float64)
    core = h - source
    for block in model.recurrence.step.core.layers.values():
        core = block(core, model.freqs_cis, None)
    want = h + 0.5 * (core - (h - source))
    torch.testing.assert_close(step_from(model, h, source), want, rtol=1e-12, atol=1e-12)


def test_training_forward_backward_reaches_the_anchor_and_every_block():
    model = scse_model().train()
    x = tokens()
    loss = F.cross_entropy(model(x, num_recurrences=3).flatten(0, 1), tokens(seed=2).flatten())
    loss.backward()
    for name in ("recurrence.anchor.anchor_proj.weight", "recurrence.anchor.init_delta_proj.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name


def test_flops_count_the_anchor_once_and_no_projection_or_gate():
    from grt_titan.model import grt_flavors

    scse = grt_flavors["debug"].replace(**SCSE_PARTS)
    bare = scse.replace(injection="none", update="overwrite", initial_state="prelude")
    d, S = scse.dim, 128
    for r in (1, 4):
        assert scse.forward_flops_per_token(S, r) - bare.forward_flops_per_token(S, r) == 4 * d * d
    # What the anchor's module computes, counted by torch.
    from torch.utils.flop_counter import FlopCounterMode

    anchor = scse_model().recurrence.anchor
    e = torch.randn(1, S, d)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        anchor(e), anchor.initial_state(e)
    assert counter.get_total_flops() == S * 4 * d * d


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(update="gate"), "SCSE's parts go together"),
        (dict(initial_state="prelude"), "SCSE's parts go together"),
        (dict(deviation_step_size=0.0), "deviation_step_size = 0.0 is invalid; must be > 0"),
        (dict(anchor_scale=-0.1), "anchor_scale = -0.1 is invalid; must be >= 0"),
        (dict(router="expert_choice"), "router = 'expert_choice'"),
    ],
)
def test_bad_settings_are_named(changes, message):
    from grt_titan.model import grt_flavors

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        grt_flavors["debug"].replace(**{**SCSE_PARTS, **changes}).validate()


def test_an_scse_setting_without_scse_is_refused():
    from grt_titan.model import grt_flavors

    with pytest.raises(ValueError, match="anchor_scale = 0.2 is invalid; it is an SCSE setting"):
        grt_flavors["debug"].replace(anchor_scale=0.2).validate()
