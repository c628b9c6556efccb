"""Ouro's exit distribution (objective = "exit_distribution") against a hand-written
reference: per-step readouts, p(t|x), the expected loss minus beta x entropy, Q-exit."""

import math

import pytest
import torch
import torch.nn.functional as F

from grt_titan.components.loss import grt_loss
from grt_titan.model import grt_flavors
from grt_titan.model.flavors import DEBUG_VOCAB_SIZE
from grt_titan.model.methods.ouro import exit_entropy, exit_log_probs, q_exit, q_exit_steps
from grt_titan.model.part import TrainingOutput

from grt_test_helpers import build_model, matmul_flops

VOCAB = DEBUG_VOCAB_SIZE  # the debug flavor's (gpt2_4k.tiktoken)
# Ouro's parts on the debug layout (docs/ouro.md).
OURO = dict(
    objective="exit_distribution",
    injection="none",
    update="overwrite",
    depth_sampling="fixed",
    state_noise_std=0.0,
    gate_noise_std=0.0,
)


def tokens(batch=2, seq=16, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def ouro_model(gate_std=1.0, **changes):
    """A debug-size Ouro model whose exit gate is spread out (at init lambda ~ 0.5 for all)."""
    model = build_model(**{**OURO, **changes})
    with torch.no_grad():
        model.exit_gate.weight.normal_(0, gate_std / math.sqrt(model.model_args.dim))
        model.exit_gate.bias.fill_(-0.5)
    return model


def reference_readouts(model, x, steps):
    """hidden_t = norm(coda(h_t)) for h_t = the state after t steps, computed by separate
    calls of the recurrence at depth t (no noise: deterministic), and lambda_t per token."""
    h_pre = model.prelude(model.embed(x), model.freqs_cis)
    hidden = [
        model.norm(model.coda(model.recurrence(h_pre, model.freqs_cis, t).state, model.freqs_cis))
        for t in range(1, steps + 1)
    ]
    z = [F.linear(h, model.exit_gate.weight, model.exit_gate.bias)[..., 0] for h in hidden]
    return hidden, z


def reference_loss(model, x, labels, steps, beta):
    """sum over tokens of sum_t p(t|x) CE_t - beta H(p), p written out as products."""
    hidden, z = reference_readouts(model, x, steps)
    lam = [torch.sigmoid(zt) for zt in z]
    remaining = torch.ones_like(lam[0])
    probs = []
    for t in range(steps):
        if t < steps - 1:
            probs.append(lam[t] * remaining)
            remaining = remaining * (1 - lam[t])
        else:
            probs.append(remaining)
    loss = 0.0
    entropy = 0.0
    for t in range(steps):
        logits = model.output(hidden[t])
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
        loss = loss + (probs[t] * ce).sum()
        entropy = entropy - (probs[t] * torch.log(probs[t])).sum()
    return loss - beta * entropy, torch.stack(probs)


def test_training_loss_matches_hand_written_reference():
    model = ouro_model(exit_entropy_weight=0.3).train()
    x, labels = tokens(), tokens(seed=2)
    out = model(x)
    R = model.model_args.num_recurrences
    assert isinstance(out, TrainingOutput)
    assert out.step_logits.shape == (R, 2, 16, VOCAB) and out.step_weights.shape == (R, 2, 16)
    loss = grt_loss(out, labels)
    loss.backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    expected, probs = reference_loss(model, x, labels, R, beta=0.3)
    expected.backward()
    # fp32; the loss sums 2 x 16 x 4 CE terms of ~11: relative 1e-5 is float rounding.
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.step_weights, probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.logits, out.step_logits[-1], rtol=0, atol=0)
    assert probs.std(dim=(1, 2)).min() > 1e-3  # the gate is not constant over tokens
    assert set(ours) == {n for n, p in model.named_parameters() if p.grad is not None}
    # Same math in a different order (one batch of T readouts vs T calls, log space vs
    # products): float32 rounding, ~1e-6 of the largest gradient entry; 1e-5 of it is safe.
    atol = 1e-5 * max(g.abs().max().item() for g in ours.values())
    for name, grad in ours.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, rtol=1e-4, atol=atol, msg=name)
    assert ours["exit_gate.weight"].abs().sum() > 0


def test_last_step_takes_the_remaining_mass():
    z = torch.tensor([[0.3], [-1.0], [2.0], [40.0]])  # lambda_T is unused
    lam = torch.sigmoid(z)
    p = exit_log_probs(z).exp()
    expected = torch.stack(
        [
            lam[0],
            (1 - lam[0]) * lam[1],
            (1 - lam[0]) * (1 - lam[1]) * lam[2],
            (1 - lam[0]) * (1 - lam[1]) * (1 - lam[2]),
        ]
    )
    torch.testing.assert_close(p, expected, rtol=1e-6, atol=0)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_saturated_gate_has_zero_entropy_and_finite_gradients():
    z = torch.tensor([[200.0], [-3.0], [1.0]], requires_grad=True)  # exits at step 1 surely
    log_p = exit_log_probs(z)
    h = exit_entropy(log_p)
    assert h.item() == pytest.approx(0.0, abs=1e-30)
    h.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_q_exit_picks_the_first_step_whose_cdf_reaches_q():
    model = ouro_model(gate_std=3.0, exit_threshold=0.6).eval()
    x = tokens(seq=32)
    R = model.model_args.num_recurrences
    hidden, z = reference_readouts(model, x, R)
    lam = [torch.sigmoid(zt) for zt in z]
    expected = torch.empty(2, 32, VOCAB)
    chosen = torch.empty(2, 32, dtype=torch.long)
    for b in range(2):
        for s in range(32):
            cdf, stay = 0.0, 1.0
            for t in range(R):
                cdf = 1.0 if t == R - 1 else cdf + lam[t][b, s].item() * stay
                stay *= 1 - lam[t][b, s].item()
                if cdf >= 0.6:
                    break
            chosen[b, s] = t
            expected[b, s] = model.output(hidden[t][b, s])
    logits = model(x)
    assert len(set(chosen.flatten().tolist())) >= 2  # tokens exit at different steps
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert q_exit_steps(torch.stack(z), 0.6).equal(chosen)
    h_pre = model.prelude(model.embed(x), model.freqs_cis)
    states = model.recurrence(h_pre, model.freqs_cis, R, all_states=True).step_states
    q_logits, steps = q_exit(model, states, 0.6)  # what a benchmark counts: 1-based steps
    torch.testing.assert_close(q_logits, expected, rtol=1e-5, atol=1e-5)
    assert steps.equal(chosen + 1)


def test_threshold_one_is_the_last_step_even_for_a_saturated_gate():
    model = ouro_model().eval()
    with torch.no_grad():
        model.exit_gate.bias.fill_(60.0)  # lambda = 1.0 in float32: CDF(1) = 1 already
    x = tokens()
    h_pre = model.prelude(model.embed(x), model.freqs_cis)
    last = model.logits_from_state(model.recurrence(h_pre, model.freqs_cis, 4).state)
    torch.testing.assert_close(model(x), last, rtol=0, atol=0)
    assert q_exit_steps(torch.full((4, 1), 60.0), 1.0).item() == 3
    model.model_args.exit_threshold = 0.99
    first = model.logits_from_state(model.recurrence(h_pre, model.freqs_cis, 1).state)
    torch.testing.assert_close(model(x), first, rtol=1e-5, atol=1e-5)


def test_depth_zero_and_explicit_depths():
    model = ouro_model().train()
    x = tokens()
    plain = model(x, num_recurrences=0)  # no step to read out: the prelude-only logits
    assert isinstance(plain, torch.Tensor) and plain.shape == (2, 16, VOCAB)
    assert model(x, num_recurrences=2).step_logits.shape[0] == 2


@pytest.mark.parametrize(
    "changes,key",
    [
        (dict(exit_threshold=0.5), "exit_threshold"),  # objective 'final' has no exit gate
        (dict(objective="exit_distribution", router="expert_choice"), "router"),
    ],
)
def test_invalid_exit_settings_name_the_field(changes, key):
    with pytest.raises(ValueError, match=key):
        grt_flavors["debug"].replace(**changes).validate()


def test_dense_flavor_rejects_the_exit_objective():
    with pytest.raises(ValueError, match="objective"):
        grt_flavors["dense_debug"].replace(objective="exit_distribution").validate()


@pytest.mark.parametrize("training,threshold", [(True, 1.0), (False, 0.5), (False, 1.0)])
def test_flops_match_flop_counter(training, threshold):
    """Per-step readouts and the exit gate counted as FlopCounterMode measures them at r = 3."""
    model = ouro_model(exit_threshold=threshold).train(training)
    args, S, r = model.model_args, 16, 3
    measured = matmul_flops(model, tokens(batch=1, seq=S), num_recurrences=r)
    readouts = r if (training or threshold < 1) else 1
    blocks = args.n_prelude_layers + args.n_core_layers * r + args.n_coda_layers * readouts
    # The CPU SDPA kernel is not counted by FlopCounterMode: eq. 1 without 4 S d per block.
    assert measured == S * (args.forward_flops_per_token(S, r, training=training) - blocks * 4 * S * args.dim)
    plain = args.replace(objective="final", exit_threshold=1.0)
    extra = args.forward_flops_per_token(S, r, training) - plain.forward_flops_per_token(S, r)
    d, c, V = args.dim, args.n_coda_layers, args.padded_vocab_size
    by_hand = {
        (True, 1.0): 2 * (c * (24 * d * d + 4 * S * d) + 2 * d * V) + 3 * 2 * d,
        (False, 0.5): 2 * c * (24 * d * d + 4 * S * d) + 3 * 2 * d,
        (False, 1.0): 0,
    }[(training, threshold)]
    assert extra == by_hand
