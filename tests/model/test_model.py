"""GRT forward vs eq. 2-5 written out by hand, gate ablations, depth, noise, determinism."""

import math

import pytest
import torch
import torch.nn.functional as F

from grt_titan.model.flavors import DEBUG_VOCAB_SIZE

from grt_test_helpers import build_model

VOCAB = DEBUG_VOCAB_SIZE  # the debug flavor's (gpt2_4k.tiktoken)


def tokens(batch=2, seq=32, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def prelude_output(model, x):
    return model.prelude(model.embed(x), model.freqs_cis)


def reference_step(step, h, h_pre, state_noise, gate_noise, freqs_cis, tau):
    """Eq. 2-5 with plain functional ops on the step's weights."""
    h_tilde = F.linear(torch.cat([h + state_noise, h_pre], -1), step.proj.weight)
    o = step.core(h_tilde, freqs_cis)
    gate = step.gate
    features = torch.cat(
        [
            F.layer_norm(h, (h.shape[-1],), gate.state_norm.weight, gate.state_norm.bias, gate.state_norm.eps),
            F.layer_norm(h_pre, (h.shape[-1],), gate.anchor_norm.weight, gate.anchor_norm.bias, gate.anchor_norm.eps),
        ],
        -1,
    )
    hidden = F.silu(F.linear(features, gate.w_in.weight, gate.w_in.bias))
    g = torch.sigmoid(F.linear(hidden, gate.w_out.weight, gate.w_out.bias) / tau + gate_noise)
    return g * h + (1 - g) * o


@pytest.mark.parametrize("block_style", ["gpt2", "llama"])
def test_training_forward_matches_hand_written_recurrence(block_style):
    model = build_model(block_style=block_style, gate_temperature=0.7)
    model.train()
    x = tokens()
    captured = []
    model.recurrence.step.register_forward_pre_hook(lambda m, args: captured.append(args))
    logits = model(x, num_recurrences=3)

    h_pre = prelude_output(model, x)
    h = h_pre
    for _, _, _, state_noise, gate_noise in captured:
        h = reference_step(model.recurrence.step, h, h_pre, state_noise, gate_noise, model.freqs_cis, 0.7)
    # The readout written out as well (elsewhere: model.logits_from_state).
    expected = model.output(model.norm(model.coda(h, model.freqs_cis)))
    assert len(captured) == 3
    # fp32, identical op order except the functional layer norms: bit-level noise only.
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_gate_at_init_is_sigmoid_of_bias():
    model = build_model().eval()
    h = torch.randn(4, 64, 128)
    h_pre = torch.randn(4, 64, 128)
    g = model.recurrence.step.gate(h, h_pre, None)
    assert abs(g.mean().item() - 1 / (1 + math.exp(-4))) < 0.01


def test_gate_one_keeps_prelude_state_for_any_depth():
    model = build_model(gate_override=1.0)
    model.train()  # noise on: the copied state must not see it
    x = tokens()
    h_pre = prelude_output(model, x)
    for r in (1, 2, 5):
        h = model.recurrence(h_pre, model.freqs_cis, r).state
        torch.testing.assert_close(h, h_pre, rtol=0, atol=0)


def test_gate_zero_writes_core_output():
    model = build_model(gate_override=0.0).eval()
    x = tokens()
    h_pre = prelude_output(model, x)
    step = model.recurrence.step
    expected = step.core(step.proj(torch.cat([h_pre, h_pre], -1)), None)
    torch.testing.assert_close(model.recurrence(h_pre, None, 1).state, expected, rtol=0, atol=0)


def test_depth_zero_is_prelude_only_and_negative_is_rejected():
    model = build_model().eval()
    x = tokens()
    expected = model.logits_from_state(prelude_output(model, x))
    torch.testing.assert_close(model(x, num_recurrences=0), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="num_recurrences = -1"):
        model(x, num_recurrences=-1)


def test_early_exit_and_extrapolation_change_the_output():
    model = build_model().eval()
    x = tokens()
    outs = {r: model(x, num_recurrences=r) for r in (1, 4, 6)}
    assert model(x).equal(outs[4])  # eval default depth = R = 4
    assert not outs[1].equal(outs[4]) and not outs[6].equal(outs[4])


def test_eval_is_deterministic_and_training_is_noisy():
    model = build_model()
    x = tokens()
    model.eval()
    assert model(x).equal(model(x))
    model.train()
    assert not model(x, num_recurrences=2).equal(model(x, num_recurrences=2))


@pytest.mark.parametrize("sigma_x,sigma_g", [(0.1, 0.1), (0.3, 0.05)])
def test_training_noise_has_configured_std(sigma_x, sigma_g):
    model = build_model(state_noise_std=sigma_x, gate_noise_std=sigma_g).train()
    captured = []
    model.recurrence.step.register_forward_pre_hook(lambda m, args: captured.append(args))
    model(tokens(4, 64), num_recurrences=2)
    state = torch.cat([args[3].flatten() for args in captured])
    gate = torch.cat([args[4].flatten() for args in captured])
    # 2 steps x 4 x 64 x 128 = 65k samples: std estimate within ~0.6%; 3% is safe.
    assert state.std().item() == pytest.approx(sigma_x, rel=0.03)
    assert gate.std().item() == pytest.approx(sigma_g, rel=0.03)
    assert abs(state.mean().item()) < 0.01 * sigma_x * 3


def test_zero_noise_passes_none():
    model = build_model(state_noise_std=0.0, gate_noise_std=0.0).train()
    captured = []
    model.recurrence.step.register_forward_pre_hook(lambda m, args: captured.append(args))
    model(tokens(), num_recurrences=1)
    assert captured[0][3] is None and captured[0][4] is None


def test_dense_model_has_no_recurrence():
    model = build_model("dense_debug")
    assert model.recurrence is None
    assert not any("proj" in n or "gate" in n for n, _ in model.named_parameters())
    with pytest.raises(ValueError, match="dense"):
        model(tokens(), num_recurrences=2)


def test_gpt2_head_is_tied_llama_is_not():
    gpt2 = build_model()
    assert gpt2.output.weight is gpt2.tok_embeddings.weight
    llama = build_model(block_style="llama")
    assert llama.output.weight is not llama.tok_embeddings.weight


def test_llama_blocks_are_our_copy_of_torchtitans():
    """grt_titan/model/blocks/llama.py (tests/model/test_block_copies.py compares it with
    torchtitan 0.2.2's llama3 TransformerBlock)."""
    from grt_titan.model.blocks.llama import LlamaBlock

    model = build_model(block_style="llama")
    assert all(isinstance(b, LlamaBlock) for b in model.prelude.layers.values())
    assert model.freqs_cis is not None and model.pos_embeddings is None


def test_truncated_backprop_matches_detached_reference():
    x = tokens()
    full = build_model(state_noise_std=0.0, gate_noise_std=0.0, backprop_recurrences=1).train()
    full(x, num_recurrences=3).square().mean().backward()

    ref = build_model(state_noise_std=0.0, gate_noise_std=0.0).train()
    h_pre = prelude_output(ref, x)
    with torch.no_grad():
        h = ref.recurrence.step(ref.recurrence.step(h_pre, h_pre, None), h_pre, None)
    h = ref.recurrence.step(h, h_pre, None)  # only the last step carries gradient
    ref.logits_from_state(h).square().mean().backward()
    for (name, p), (_, q) in zip(full.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-8, msg=name)


def test_truncated_backprop_keeps_fewer_graphs():
    x = tokens()
    counts = {}
    for k in (None, 1):
        model = build_model(backprop_recurrences=k).train()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            model(x, num_recurrences=4)
        counts[k] = sum(saved)
    assert counts[1] < counts[None]


def test_observer_sees_every_step():
    model = build_model().eval()
    x = tokens()
    records = []
    model.recurrence.observer = records.append
    logits = model(x, num_recurrences=3)
    assert [r.index for r in records] == [1, 2, 3] and {r.depth for r in records} == {3}
    for rec in records:
        torch.testing.assert_close(rec.new_state, rec.gate * rec.state + (1 - rec.gate) * rec.proposal)
    assert records[0].state.equal(prelude_output(model, x))
    model.recurrence.observer = None
    assert model(x, num_recurrences=3).equal(logits)


@pytest.mark.parametrize("parts", ["grt", "ouro", "mor", "token_choice"])
def test_recurrence_returns_one_type_on_every_path(parts):
    """`RecurrenceOutput` from the plain loop, the per-step readout and both routers, in
    training and eval mode: the model reads fields, never tests types."""
    from grt_titan.model.recurrence import RecurrenceOutput

    from grt_test_helpers import MOR_PARTS, OURO_PARTS

    changes = {"grt": {}, "ouro": OURO_PARTS, "mor": MOR_PARTS, "token_choice": dict(MOR_PARTS, router="token_choice")}[
        parts
    ]
    model = build_model(**changes)
    routed = model.model_args.router != "none"
    for training in (True, False):
        model.train(training)
        h_pre = prelude_output(model, tokens(seq=16))
        for depth, all_states in ((0, False), (3, False), (3, True)):
            out = model.recurrence(h_pre, model.freqs_cis, depth, all_states=all_states)
            assert type(out) is RecurrenceOutput and out.state.shape == h_pre.shape
            assert out.step_states is None if routed or not all_states else len(out.step_states) == depth
            if out.step_states:
                assert out.step_states[-1] is out.state
            # The router's auxiliary loss: training forwards only (at r = 0, 0 or None).
            if not (routed and training):
                assert out.aux_loss_sum is None
            elif depth:
                assert out.aux_loss_sum.ndim == 0 and out.aux_loss_sum > 0
