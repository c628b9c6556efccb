"""Mixture-of-Recursions (router = expert_choice) against a hand-written loop over tokens:
hierarchical expert-choice top-k, the router-weighted delta update, the BCE auxiliary loss;
the released code's update (router_update = "block") against its layer written out in torch."""

import math

import pytest
import torch
import torch.nn.functional as F

from grt_titan.components.loss import grt_loss
from grt_titan.model import grt_flavors
from grt_titan.model.part import TrainingOutput

from grt_test_helpers import MOR_PARTS, build_model, matmul_flops

VOCAB = 512
# The references below write out the delta update h + g (o - h): set it explicitly.
MOR = dict(MOR_PARTS, vocab_size=VOCAB, router_update="delta")


def tokens(batch=2, seq=16, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def reference_recurrence(model, h_pre, depth):
    """One sequence at a time, one token at a time: pick, update and score by hand."""
    args, router, core = model.model_args, model.recurrence.router, model.recurrence.step.core
    seq_len = h_pre.shape[1]
    capacities = args.router_capacities
    out, aux = [], 0.0
    for b in range(h_pre.shape[0]):
        h = [h_pre[b, t] for t in range(seq_len)]
        candidates = list(range(seq_len))
        for i in range(depth):
            w = router.steps[i].weight[0]
            logit = {t: torch.dot(w, h[t]) for t in candidates}
            k = max(1, int(capacities[i] * seq_len))
            chosen = sorted(sorted(candidates, key=lambda t: -logit[t].item())[:k])  # causal order
            for t in candidates:  # BCE(logit, 1[chosen]), the step's mean counted once per token
                y = 1.0 if t in chosen else 0.0
                bce = -(y * F.logsigmoid(logit[t]) + (1 - y) * F.logsigmoid(-logit[t]))
                aux = aux + bce * seq_len / len(candidates)
            o = core(torch.stack([h[t] for t in chosen])[None], None)[0]  # attention among chosen only
            for j, t in enumerate(chosen):
                g = torch.sigmoid(logit[t]) * args.router_scale
                h[t] = h[t] + g * (o[j] - h[t])  # the block delta, added once
            candidates = chosen
        out.append(torch.stack(h))
    return torch.stack(out), aux * args.router_aux_weight


@pytest.mark.parametrize("capacity,depth", [(None, 4), ([1, 0.5, 0.5, 0.25], 4), ([0.75, 0.5, 0.25, 0.125], 3)])
def test_training_forward_matches_hand_written_routing(capacity, depth):
    model = build_model(router_capacity=capacity, router_aux_weight=0.01, **MOR)
    x = tokens()
    out = model(x, num_recurrences=depth)
    assert isinstance(out, TrainingOutput)

    h_pre = model.prelude(model.embed(x), None)
    h, aux = reference_recurrence(model, h_pre, depth)
    expected = model.output(model.norm(model.coda(h, None)))
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.aux_loss_sum, aux, rtol=1e-5, atol=1e-6)
    # The training loss is torchtitan's summed CE plus the auxiliary sum.
    ce = F.cross_entropy(expected.flatten(0, 1), x.flatten(), reduction="sum")
    torch.testing.assert_close(grt_loss(out, x), ce + aux, rtol=1e-5, atol=1e-4)


def test_default_capacities_and_kept_tokens():
    args = grt_flavors["small"].replace(**MOR)
    assert args.router_capacities == tuple((10 - i) / 10 for i in range(10))
    assert args.router_tokens_kept(1024) == [1024, 921, 819, 716, 614, 512, 409, 307, 204, 102]
    assert args.replace(router_capacity=[0.001]).replace(num_recurrences=1).router_tokens_kept(16) == [1]


def test_aux_loss_at_init_is_log2_per_step_and_token():
    """Router logits start near 0: each step's mean BCE is ~log 2, times B x S tokens."""
    model = build_model(router_aux_weight=1.0, **MOR)
    x = tokens(batch=3, seq=16)
    aux = model(x).aux_loss_sum.item()
    assert aux == pytest.approx(4 * math.log(2) * 3 * 16, rel=0.02)


def test_core_is_one_set_of_weights_run_every_step():
    model = build_model(**MOR)
    plain = build_model(vocab_size=VOCAB)
    core = {n for n, _ in model.named_parameters() if ".core." in n}
    assert core == {n for n, _ in plain.named_parameters() if ".core." in n}  # one core, not R
    assert not any(".proj." in n or ".gate." in n for n, _ in model.named_parameters())
    calls = []
    model.recurrence.step.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[1]))
    model(tokens(seq=16))
    assert calls == [16, 12, 8, 4]  # the same module, on k_i tokens at step i


@pytest.mark.parametrize("aux_weight", [0.0, 0.001])
def test_gradients_reach_every_router_and_the_core(aux_weight):
    model = build_model(router_aux_weight=aux_weight, **MOR)
    x = tokens()
    out = model(x)
    # No auxiliary term: plain logits, as for every method without one.
    assert isinstance(out, TrainingOutput) == (aux_weight > 0)
    loss = out.float().square().mean() if aux_weight == 0 else out.aux_loss_sum
    loss.backward()
    for linear in model.recurrence.router.steps:  # through g (LM loss) or the BCE (aux)
        assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0
    if aux_weight == 0:
        assert all(p.grad is not None for p in model.recurrence.step.parameters())


def test_eval_returns_logits_and_depth_is_bounded_by_R():
    model = build_model(**MOR).eval()
    x = tokens()
    assert isinstance(model(x), torch.Tensor)
    assert model(x).equal(model(x, num_recurrences=4))
    torch.testing.assert_close(
        model(x, num_recurrences=0), model.logits_from_state(model.prelude(model.embed(x), None))
    )
    with pytest.raises(ValueError, match="num_recurrences = 5"):
        model(x, num_recurrences=5)


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"block_style": "llama"}, "block_style"),
        ({"depth_sampling": "uniform"}, "depth_sampling"),
        ({"injection": "proj"}, "injection"),
        ({"update": "gate"}, "update"),
        ({"state_noise_std": 0.1}, "state_noise_std"),
        ({"eval_recurrences": 5}, "eval_recurrences"),
        ({"router_capacity": [1, 0.5]}, "router_capacity"),
        ({"router_capacity": [1, 0.5, 0.75, 0.25]}, "router_capacity"),
        ({"router_capacity": [1, 0.5, 0, 0]}, "router_capacity"),
        ({"router_capacity": "1,0.5,0.5,0.25"}, "router_capacity"),
        ({"router_capacity": [1, 0.5, float("nan"), 0.25]}, "router_capacity"),
        ({"router_scale": 0.0}, "router_scale"),
    ],
)
def test_invalid_router_args_name_the_key(changes, key):
    with pytest.raises(ValueError, match=key):
        grt_flavors["debug"].replace(**{**MOR, **changes}).validate()


def test_flops_follow_the_kept_tokens():
    """By hand (small flavor, S = 1024): (p + c) B + n sum_i [(k_i / S) 24 d^2 + 4 (k_i^2 / S) d]
    + router + head, with B = 24 d^2 + 4 S d; below the nominal p + nR + c blocks of eq. 1."""
    args = grt_flavors["small"].replace(**{**MOR, "vocab_size": 50257})
    S, d, V = 1024, 768, 50257
    kept = [1024, 921, 819, 716, 614, 512, 409, 307, 204, 102]
    candidates = [1024] + kept[:-1]
    expected = (
        2 * (24 * d * d + 4 * S * d)
        + sum((k / S) * 24 * d * d + 4 * (k * k / S) * d for k in kept)
        + sum((m / S) * 2 * d for m in candidates)
        + 2 * d * V
    )
    assert args.forward_flops_per_token(S) == pytest.approx(expected, rel=1e-12)
    nominal = grt_flavors["small"].forward_flops_per_token(S, 10) - 10 * 10 * d * d  # eq. 1 without W_proj/gate
    assert args.forward_flops_per_token(S) < 0.71 * nominal
    assert sum(kept) / (10 * S) == pytest.approx(0.55, abs=0.002)  # the core's linears: 55% of nominal
    assert args.unrolled_layers == 12  # the nominal block applications (table 1's isoFLOP sense)


def test_truncated_backprop_flops_skip_the_routed_tokens_of_the_untracked_steps():
    """By hand (small flavor, S = 1024, R = 10, backprop_recurrences = 3): steps 0..6 run
    without autograd, each on its own k_i tokens and its router on its m_i candidates, so the
    backward saved is 2 sum_{i<7} [(k_i / S) 24 d^2 + 4 (k_i^2 / S) d + (m_i / S) 2 d], not 7
    whole steps."""
    args = grt_flavors["small"].replace(**{**MOR, "vocab_size": 50257, "backprop_recurrences": 3})
    S, d = 1024, 768
    kept = [1024, 921, 819, 716, 614, 512, 409, 307, 204, 102]
    candidates = [1024] + kept[:-1]
    untracked = sum(
        (k / S) * 24 * d * d + 4 * (k * k / S) * d + (m / S) * 2 * d for k, m in zip(kept[:7], candidates[:7])
    )
    forward = args.forward_flops_per_token(S, 10, training=True)
    assert args.train_flops_per_token(S) == pytest.approx(3 * forward - 2 * untracked, rel=1e-12)
    whole_steps = 7 * (24 * d * d + 4 * S * d)  # the unrouted count, too much for routed steps
    assert args.train_flops_per_token(S) > 3 * forward - 2 * whole_steps
    assert args.replace(backprop_recurrences=10).train_flops_per_token(S) == 3 * forward  # k >= r: all tracked


@pytest.mark.parametrize("depth", [4, 2])
def test_matmul_flops_match_flop_counter(depth):
    """The linear part of the count (core on k_i tokens, routers on their candidates, prelude,
    coda, head) equals what torch's FlopCounterMode measures."""
    model = build_model(**MOR).eval()
    args, S = model.model_args, 32
    measured_mm = matmul_flops(model, tokens(batch=1, seq=S), num_recurrences=depth)
    # The CPU SDPA kernel is not counted by FlopCounterMode: remove the attention terms.
    kept = args.router_tokens_kept(S)[:depth]
    attention = (args.n_prelude_layers + args.n_coda_layers) * 4 * S * S * args.dim + args.n_core_layers * sum(
        4 * k * k * args.dim for k in kept
    )
    assert measured_mm == S * args.forward_flops_per_token(S, depth) - attention


def test_router_weights_have_hugging_face_checkpoint_names():
    """torchtitan builds the HF key map of every run ([checkpoint] last_save_in_hf)."""
    from grt_titan.model.state_dict_adapter import GRTStateDictAdapter

    model = build_model(**MOR)
    adapter = GRTStateDictAdapter(model.model_args, None)
    assert adapter.to_hf_map["recurrence.router.steps.3.weight"] == "model.router.3.weight"
    native = {k: v for k, v in model.state_dict().items() if k in adapter.to_hf_map}
    back = adapter.from_hf(adapter.to_hf(native))
    assert back.keys() == native.keys() and all(back[k].equal(native[k]) for k in native)


# ---- eval-time routing: router_inference = "threshold" (causal) ---------------------------------


def reference_threshold_recurrence(model, h_pre, depth, add_block=False):
    """One sequence, one token at a time: token t goes on to step i while it was active at
    step i-1 and sigmoid(w_i . h_t) > 0.5; the core attends among the step's active tokens.
    Also returns, per sequence, the number of steps each token took. `add_block`: the update
    h + g o (router_update = "block") instead of h + g (o - h)."""
    args, router, core = model.model_args, model.recurrence.router, model.recurrence.step.core
    seq_len = h_pre.shape[1]
    out, steps_taken = [], []
    for b in range(h_pre.shape[0]):
        h = [h_pre[b, t] for t in range(seq_len)]
        taken = [0] * seq_len
        active = list(range(seq_len))
        for i in range(depth):
            w = router.steps[i].weight[0]
            logit = {t: torch.dot(w, h[t]) for t in active}
            active = [t for t in active if torch.sigmoid(logit[t]).item() > 0.5]
            if not active:
                break
            o = core(torch.stack([h[t] for t in active])[None], None)[0]
            for j, t in enumerate(active):
                g = torch.sigmoid(logit[t]) * args.router_scale
                h[t] = h[t] + g * o[j] if add_block else h[t] + g * (o[j] - h[t])
                taken[t] += 1
        out.append(torch.stack(h))
        steps_taken.append(taken)
    return torch.stack(out), steps_taken


@pytest.mark.parametrize("depth", [4, 2])
def test_threshold_routing_matches_hand_written_rule(depth):
    model = build_model(router_inference="threshold", **MOR).eval()
    x = tokens(batch=3, seq=16)
    with torch.no_grad():
        logits = model(x, num_recurrences=depth)
        h_pre = model.prelude(model.embed(x), None)
        h, taken = reference_threshold_recurrence(model, h_pre, depth)
        expected = model.output(model.norm(model.coda(h, None)))
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # The rule really routes: tokens stop after different numbers of steps, rows differ.
    counts = {n for row in taken for n in row}
    assert len(counts) >= 3 and 0 in counts, taken
    assert taken[0] != taken[1]


def test_threshold_routing_is_causal_and_top_k_is_not():
    """A prefix's logits do not depend on later tokens under threshold routing; they do under
    top-k (its selection ranks the whole sequence)."""
    x = tokens(batch=1, seq=24)
    changed = x.clone()
    changed[:, 12:] = tokens(batch=1, seq=12, seed=9)
    with torch.no_grad():
        threshold = build_model(router_inference="threshold", **MOR).eval()
        torch.testing.assert_close(threshold(x)[:, :12], threshold(changed)[:, :12], rtol=0, atol=1e-6)
        top_k = build_model(**MOR).eval()
        assert not torch.allclose(top_k(x)[:, :12], top_k(changed)[:, :12], atol=1e-4)


def test_router_inference_applies_in_eval_only_and_defaults_to_top_k():
    assert grt_flavors["debug"].replace(**MOR).router_inference == "top_k"
    top_k, threshold = build_model(**MOR), build_model(router_inference="threshold", **MOR)
    x = tokens()
    # Training routes by top-k whatever the eval rule (same weights: same seed).
    torch.testing.assert_close(top_k(x).logits, threshold(x).logits, rtol=0, atol=0)
    with torch.no_grad():
        assert not torch.allclose(top_k.eval()(x), threshold.eval()(x))
        threshold.recurrence.router.inference = "top_k"  # the rule is a switch on the router
        torch.testing.assert_close(top_k(x), threshold(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "changes,pattern",
    [
        (
            {**MOR, "router_inference": "greedy"},
            r"router_inference = 'greedy' is invalid; allowed: 'top_k', 'threshold'",
        ),
        (
            {"router_inference": "threshold"},
            r"router_inference = 'threshold' is invalid; is used by router = 'expert_choice'",
        ),
    ],
)
def test_bad_router_inference_names_the_key(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        grt_flavors["debug"].replace(**changes).validate()


# ---- router_update = "block": the released code's update ----------------------------------------


def released_code_recurrence(model, h_pre, depth):
    """The released MoR code's expert-choice layer (MoRLlamaDecoderLayer.forward, its steps 1-5)
    written out: top-k of sigmoid(logit) x alpha among the previous step's tokens, sorted into
    causal order; the block on the gathered tokens (its residual inside, as our core's);
    `total_x = scatter_add(total_x, selected, Block(x) * weights)`."""
    args, router, core = model.model_args, model.recurrence.router, model.recurrence.step.core
    _, seq_len, d = h_pre.shape
    total_x, prev = h_pre, None
    for i in range(depth):
        x = total_x if prev is None else torch.gather(total_x, 1, prev.expand(-1, -1, d))
        probs = torch.sigmoid(router.steps[i](x)) * args.router_scale  # [B, m, 1]
        k = max(1, int(args.router_capacities[i] * seq_len))
        weights, selected = torch.topk(probs, k, dim=1, sorted=False)
        selected, index = torch.sort(selected, dim=1)
        weights = torch.gather(weights, 1, index)
        top_k_tokens = torch.gather(x, 1, selected.expand(-1, -1, d))
        if prev is not None:
            selected = torch.gather(prev, 1, selected)
        processed = core(top_k_tokens, None)
        total_x = torch.scatter_add(total_x, 1, selected.expand(-1, -1, d), processed * weights)
        prev = selected
    return total_x


@pytest.mark.parametrize("capacity,depth", [(None, 4), ([0.75, 0.5, 0.25, 0.125], 3)])
def test_block_update_matches_the_released_code(capacity, depth):
    """router_update = "block": h + g core(h) = (1 + g) h + g f(h) on routed tokens, the released
    code's update, in training and in eval under both routing rules."""
    block = build_model(router_capacity=capacity, **{**MOR, "router_update": "block"})
    x = tokens()
    out = block(x, num_recurrences=depth)
    h_pre = block.prelude(block.embed(x), None)
    expected = block.output(block.norm(block.coda(released_code_recurrence(block, h_pre, depth), None)))
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    # The same weights under delta: other states, other logits (the option is not a no-op).
    delta = build_model(router_capacity=capacity, **MOR)
    delta.load_state_dict(block.state_dict())
    assert (delta(x, num_recurrences=depth).logits - out.logits).abs().max().item() > 1e-3
    # Eval mode, both rules: threshold against the per-token rule with the block update.
    block.eval()
    with torch.no_grad():
        torch.testing.assert_close(block(x, num_recurrences=depth), expected, rtol=1e-5, atol=1e-5)
        block.recurrence.router.inference = "threshold"
        h, _ = reference_threshold_recurrence(block, h_pre, depth, add_block=True)
        torch.testing.assert_close(
            block(x, num_recurrences=depth), block.output(block.norm(block.coda(h, None))), rtol=1e-5, atol=1e-5
        )


def test_router_update_is_an_expert_choice_setting():
    assert grt_flavors["debug"].replace(**MOR_PARTS).router_update == "delta"  # every older run's
    for changes in ({}, {**MOR_PARTS, "router": "token_choice"}):
        with pytest.raises(ValueError, match="router_update = 'block' is invalid; is used by router = 'expert_choice'"):
            grt_flavors["debug"].replace(**changes, router_update="block").validate()
    with pytest.raises(ValueError, match="router_update = 'residual' is invalid; allowed: 'delta', 'block'"):
        grt_flavors["debug"].replace(**{**MOR, "router_update": "residual"}).validate()
