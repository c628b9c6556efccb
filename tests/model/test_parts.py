"""The recurrence's parts (docs/architecture.md, "Methods as parts") against hand-written
references: no injection, the overwrite update, the random initial state, heavy-tail Poisson
depth, and RRT's per-step LoRA (checked against merged weights W + s B_t A_t)."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from grt_titan.model import grt_flavors
from grt_titan.model.flavors import DEBUG_VOCAB_SIZE
from grt_titan.model.methods.poisson import eval_initial_state
from grt_titan.model.recurrence import DepthSampler

from grt_test_helpers import LADDER_PARTS, MOR_PARTS, POISSON_PARTS, RRT_PARTS, build_model

VOCAB = DEBUG_VOCAB_SIZE  # the debug flavor's (gpt2_4k.tiktoken)
LADDER, POISSON, RRT = LADDER_PARTS, POISSON_PARTS, RRT_PARTS


def tokens(batch=2, seq=24, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def prelude_output(model, x):
    return model.prelude(model.embed(x), model.freqs_cis)


def readout(model, h):
    return model.output(model.norm(model.coda(h, model.freqs_cis)))


def test_overwrite_without_injection_is_the_core_applied_to_its_own_output():
    model = build_model(**{**LADDER, "state_noise_std": 0.1})
    step = model.recurrence.step
    assert not hasattr(step, "proj") and not hasattr(step, "gate")  # absent parts store nothing
    model.train()
    x = tokens()
    captured = []
    step.register_forward_pre_hook(lambda m, args: captured.append(args))
    logits = model(x, num_recurrences=3)
    h = prelude_output(model, x)
    for _, _, _, state_noise, _ in captured:
        h = step.core(h + state_noise, None)  # figure 5 rung 4: noise, no W_proj, no gate
    assert len(captured) == 3
    torch.testing.assert_close(logits, readout(model, h), rtol=1e-5, atol=1e-5)


def test_core_only_rung_starts_from_the_embeddings():
    model = build_model("debug_core_only", **LADDER).eval()
    x = tokens()
    h = model.embed(x)
    for _ in range(5):
        h = model.recurrence.step.core(h, None)
    torch.testing.assert_close(model(x), readout(model, h), rtol=1e-5, atol=1e-5)


def test_poisson_step_is_the_adapter_on_state_and_prelude_output_from_a_random_state():
    model = build_model(**POISSON).eval()
    x = tokens()
    h_pre = prelude_output(model, x)
    std = model.model_args.initial_state_std
    h = eval_initial_state(model.model_args.depth_seed, model.model_args.max_seq_len, 128, std)[: x.shape[1]]
    h = h.expand_as(h_pre)
    for _ in range(4):  # eval depth R = 4: h <- core(adapter([h ; h_pre])), no gate
        h = model.recurrence.step.core(F.linear(torch.cat([h, h_pre], -1), model.recurrence.step.proj.weight), None)
    torch.testing.assert_close(model(x), readout(model, h), rtol=1e-5, atol=1e-5)


def test_random_initial_state_is_fresh_each_training_forward_and_truncated():
    model = build_model(**POISSON, initial_state_std=0.5)
    h_pre = torch.zeros(2, 64, 128)
    first, second = model.recurrence.start(h_pre, None)[0], model.recurrence.start(h_pre, None)[0]
    assert not torch.equal(first, second)
    assert first.abs().max() <= 1.5 and 0.4 < first.std() < 0.5  # N(0, 0.5) cut at 3 std: std ~0.49
    # Eval: one fixed draw per position, so a prefix sees the state a longer input gives it.
    model.eval()
    torch.testing.assert_close(model(tokens(seq=24))[:, :10], model(tokens(seq=24)[:, :10]), rtol=1e-5, atol=1e-5)


def test_heavy_tail_depth_has_the_configured_mean_and_a_heavy_tail():
    args = grt_flavors["debug"].replace(**POISSON, num_recurrences=10, depth_mean=5.5, depth_seed=3)
    a, b = DepthSampler(args), DepthSampler(args)
    draws = np.array([a.sample() for _ in range(20000)])
    assert draws.tolist()[:50] == [b.sample() for _ in range(50)]  # a function of (seed, index)
    assert draws.min() == 1
    assert abs(draws.mean() - 5.5) < 0.1
    # The log-normal rate makes the tail heavier than Poisson(4.5) + 1's, whose P(r > 11) ~ 0.3%.
    assert (draws > 11).mean() > 0.03
    assert args.expected_recurrences == 5.5
    # Default mean: the uniform sampler's (r_min + R) / 2, the same expected training compute.
    assert grt_flavors["debug"].replace(**POISSON, num_recurrences=10).expected_recurrences == 5.5


def _merged_block_forward(block, x, adapter):
    """A GPT-2 block with each adapted linear's weight merged: W + s B A (an independent path)."""
    s = adapter.scale
    merged = lambda linear, factors: linear.weight + s * factors[1] @ factors[0]  # noqa: E731
    attn, ffn = block.attention, block.feed_forward
    qkv_weight = torch.cat([attn.wq.weight, attn.wk.weight, attn.wv.weight]) + s * adapter.qkv[1] @ adapter.qkv[0]
    qkv_bias = torch.cat([attn.wq.bias, attn.wk.bias, attn.wv.bias])
    y = F.layer_norm(
        x, (x.shape[-1],), block.attention_norm.weight, block.attention_norm.bias, block.attention_norm.eps
    )
    q, k, v = F.linear(y, qkv_weight, qkv_bias).chunk(3, -1)
    bs, seq, _ = x.shape
    q, k, v = (t.view(bs, seq, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(bs, seq, -1)
    h = x + F.linear(out, merged(attn.wo, adapter.attention_out), attn.wo.bias)
    y = F.layer_norm(h, (h.shape[-1],), block.ffn_norm.weight, block.ffn_norm.bias, block.ffn_norm.eps)
    hidden = F.gelu(F.linear(y, merged(ffn.w1, adapter.mlp_in), ffn.w1.bias), approximate="tanh")
    return h + F.linear(hidden, merged(ffn.w2, adapter.mlp_out), ffn.w2.bias)


def test_rrt_step_t_uses_its_own_adapters_on_the_shared_core():
    model = build_model(**RRT)
    adapters = model.recurrence.step.adapters
    with torch.no_grad():  # B = 0 at init (a no-op); give every step its own non-zero adapter
        for b in adapters.b.values():
            b.normal_(std=0.05)
    model.eval()
    x = tokens()
    h = prelude_output(model, x)
    for t in range(4):
        step_adapters = adapters.at_step(torch.tensor(t))
        for block, adapter in zip(model.recurrence.step.core.layers.values(), step_adapters):
            h = _merged_block_forward(block, h, adapter)
    torch.testing.assert_close(model(x), readout(model, h), rtol=1e-4, atol=1e-4)


def test_rrt_adapters_start_as_no_ops_and_get_gradients_per_step():
    model = build_model(**RRT)
    plain = build_model(**{**RRT, "step_adapter": "none"})
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".adapters." not in k})
    x = tokens()
    logits = model(x)
    torch.testing.assert_close(logits, plain(x))  # B = 0: the adapters change nothing yet
    logits.float().logsumexp(-1).mean().backward()
    grad = model.recurrence.step.adapters.b["qkv"].grad
    assert all(grad[t].abs().sum() > 0 for t in range(4))  # every step's own B is trained


def test_rrt_refuses_depths_beyond_its_adapters():
    model = build_model(**RRT).eval()
    with pytest.raises(ValueError, match="num_recurrences = 5 is invalid with step_adapter = 'lora'"):
        model(tokens(), num_recurrences=5)


def test_parameter_counts_follow_the_parts():
    def count(**changes):
        return sum(p.numel() for p in build_model(**changes).parameters())

    d, n, R, r = 128, 2, 4, 3
    grt = count()
    gate = 2 * d * d + d + d * d + d + 4 * d  # w_in, w_out with biases, two LayerNorms
    assert count(update="overwrite") == grt - gate
    assert count(injection="none") == grt - 2 * d * d
    assert count(**RRT) == grt - gate - 2 * d * d + R * n * 16 * d * r  # + one LoRA per (block, step)


def test_method_names():
    assert grt_flavors["small"].method_name == "GRT"
    assert grt_flavors["debug"].replace(**POISSON).method_name == "Heavy-tail Poisson"
    assert grt_flavors["debug"].replace(**RRT).method_name == "RRT"
    assert grt_flavors["debug"].replace(**LADDER).method_name == "recurrence + prelude/coda"
    assert (
        grt_flavors["debug_core_only"].replace(**{**LADDER, "state_noise_std": 0.1}).method_name == "recurrence + noise"
    )
    # The two routers are two methods: token choice is not table 1's MoR row (expert choice).
    mor = grt_flavors["debug"].replace(**MOR_PARTS)
    assert (mor.router, mor.method_name) == ("expert_choice", "MoR")
    assert mor.replace(router="token_choice").method_name == "MoR (token choice)"


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(step_adapter="lora"), "needs depth_sampling = 'fixed'"),
        (dict(step_adapter="lora", depth_sampling="fixed", block_style="llama"), "block_style = 'gpt2'"),
        (dict(update="overwrite", gate_override=0.5), "needs update = 'gate'"),
        (dict(depth_mean=3.0), "poisson_lognormal"),
        (dict(depth_sampling="poisson_lognormal", depth_mean=0.5), "depth_mean = 0.5 is invalid"),
        (dict(initial_state_std=0.0), "initial_state_std"),
        (dict(injection="concat"), "injection"),
    ],
)
def test_invalid_parts_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        grt_flavors["debug"].replace(**changes).validate()


def test_export_refuses_parts_the_hf_model_does_not_implement():
    from grt_titan.hf.convert import ExportError, build_hf_config

    parts = dict(router="token_choice")  # MoR's token choice: no HF implementation
    args = grt_flavors["debug"].replace(**parts)
    assert args.non_grt_parts == parts
    with pytest.raises(
        ExportError, match=re.escape(args.method_name) + ".*cannot be exported to Hugging Face format yet"
    ):
        build_hf_config(args)
    ouro = dict(LADDER, objective="exit_distribution")
    for exported in ({}, LADDER, POISSON, RRT, ouro, MOR_PARTS):  # GRT and the parts the HF model implements
        build_hf_config(grt_flavors["debug"].replace(**exported))


def test_truncated_backprop_training_flops_skip_the_untracked_backward():
    args = grt_flavors["debug"].replace(**POISSON, backprop_recurrences=2)
    d, S, n = 128, 64, 2
    core_step = n * (24 * d * d + 4 * S * d) + 2 * (2 * d * d)  # blocks + W_proj (no gate)
    # r = 5: all 5 steps forward (in 3 F), only the last 2 backward: 3 untracked steps x 2 F_step less.
    assert args.train_flops_per_token(S, 5) == 3 * args.forward_flops_per_token(S, 5) - 2 * 3 * core_step
    assert args.train_flops_per_token(S, 2) == 3 * args.forward_flops_per_token(S, 2)  # r <= k: full backward


def _eq1_train_by_hand(r, k, p=1, n=2, c=1, d=128, S=64, V=VOCAB, proj=True):
    """3 x eq. 1 (+ LM head) at depth r without the gate, less the backward (2x forward) of
    the r - k untracked steps."""
    per_block = 24 * d * d + 4 * S * d
    step = n * per_block + (4 * d * d if proj else 0)
    forward = (p + c) * per_block + r * step + 2 * d * V
    return 3 * forward - 2 * max(r - k, 0) * step


def test_start_up_training_flops_are_the_expectation_over_the_sampled_depths():
    """torchtitan's start-up FLOPs (get_nparams_and_flops) are E_r[train(r)], what the logged
    MFU averages over the sampled depths: not train(E[r]), which truncated backprop bends."""
    from grt_titan.model.model import build_meta_model

    S = 64
    # Uniform r in 1..4 with k = 2, the ladder's parts (no W_proj, no gate): the mean of 4 counts.
    uniform = grt_flavors["debug"].replace(**LADDER, backprop_recurrences=2)
    by_hand = sum(_eq1_train_by_hand(r, 2, proj=False) for r in (1, 2, 3, 4)) / 4
    assert uniform.expected_train_flops_per_token(S) == pytest.approx(by_hand, rel=1e-12)
    assert uniform.get_nparams_and_flops(build_meta_model(uniform), S)[1] == int(by_hand)
    assert uniform.train_flops_per_token(S) > by_hand  # at E[r] = 2.5: overstated
    # Without truncation the count is linear in r: the expectation is the count at E[r].
    plain = uniform.replace(backprop_recurrences=None)
    assert plain.expected_train_flops_per_token(S) == pytest.approx(plain.train_flops_per_token(S), rel=1e-12)

    # Heavy-tail Poisson, E[r] = 2.5, k = 2: E[(r - 2)+] = E[r] - 2 + P(r = 1), and P(r = 1) =
    # E[exp(-tau)] over tau ~ LogNormal(log 1.5 - 1/8, 1/2), integrated by hand (midpoint rule in log tau).
    poisson = grt_flavors["debug"].replace(**POISSON, depth_mean=2.5, backprop_recurrences=2)
    mu, sigma = np.log(1.5) - 0.125, 0.5
    z = np.linspace(-12, 12, 240_001)
    z = (z[1:] + z[:-1]) / 2
    density = np.exp(-z * z / 2) / np.sqrt(2 * np.pi) * (24 / 240_000)
    p1 = float(np.sum(density * np.exp(-np.exp(mu + sigma * z))))
    step = 2 * (24 * 128**2 + 4 * S * 128) + 4 * 128**2
    by_hand = _eq1_train_by_hand(2.5, k=float("inf")) - 2 * step * (2.5 - 2 + p1)  # 3 F(E[r]) less E[untracked]
    assert poisson.expected_train_flops_per_token(S) == pytest.approx(by_hand, rel=1e-9)
    assert poisson.get_nparams_and_flops(build_meta_model(poisson), S)[1] == int(by_hand)
    # What the metrics average: the count over the sampler's own draws tends to it.
    sampler = DepthSampler(poisson)
    drawn = np.mean([poisson.train_flops_per_token(S, sampler.depth_at(i)) for i in range(20000)])
    assert drawn == pytest.approx(by_hand, rel=5e-3)
    assert poisson.train_flops_per_token(S) - by_hand == pytest.approx(2 * step * p1, rel=1e-9)  # at E[r]: overstated
