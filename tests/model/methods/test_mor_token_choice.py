"""Mixture-of-Recursions token choice (router = token_choice) against hand-written loops over
rows and tokens: each token's depth and weight, the routed delta update on unpadded rows, the
balancing loss and z-loss, padding, the FLOP convention, the config errors."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grt_titan.components.loss import grt_loss
from grt_titan.model import grt_flavors
from grt_titan.model.part import TrainingOutput

from grt_test_helpers import MOR_PARTS, build_model, matmul_flops, parse_config, parts_overrides

VOCAB = 512
TOKEN_CHOICE = dict(MOR_PARTS, router="token_choice", vocab_size=VOCAB)


def tokens(batch=2, seq=16, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def reference_recurrence(model, h_pre, depth):
    """One row at a time, one token at a time, no padding: choose, update and score by hand."""
    args, router, core = model.model_args, model.recurrence.router, model.recurrence.step.core
    R, (batch, seq_len, _) = args.num_recurrences, h_pre.shape
    w = router.depth.weight  # [R, d]
    out, chosen, probs, lse = [], [], [], []
    for b in range(batch):
        h = [h_pre[b, t] for t in range(seq_len)]
        p = [torch.softmax(torch.stack([torch.dot(w[j], h[t]) for j in range(R)]), 0) for t in range(seq_len)]
        lse += [torch.logsumexp(torch.stack([torch.dot(w[j], h[t]) for j in range(R)]), 0) for t in range(seq_len)]
        token_depth = [int(p[t].argmax()) + 1 for t in range(seq_len)]
        for i in range(depth):
            active = [t for t in range(seq_len) if token_depth[t] > i]  # causal order
            if not active:
                continue
            o = core(torch.stack([h[t] for t in active])[None], None)[0]  # attention among active only
            for j, t in enumerate(active):
                g = p[t][token_depth[t] - 1]  # its router probability, alpha = 1
                h[t] = h[t] + g * (o[j] - h[t])
        out.append(torch.stack(h))
        chosen += token_depth
        probs += p
    n = batch * seq_len
    balance = R * sum(sum(pt[j] for pt in probs) / n * sum(c == j + 1 for c in chosen) / n for j in range(R))
    aux = n * args.router_balance_weight * balance + args.router_z_loss_weight * sum(x * x for x in lse)
    return torch.stack(out), aux, chosen


@pytest.mark.parametrize("depth,z_loss", [(4, 0.0), (3, 0.01)])
def test_training_forward_matches_hand_written_routing(depth, z_loss):
    model = build_model(router_z_loss_weight=z_loss, **TOKEN_CHOICE)
    with torch.no_grad():  # spread the depths: more than one depth per row, rows that differ
        model.recurrence.router.depth.weight.normal_(std=0.5)
    x = tokens()
    out = model(x, num_recurrences=depth)
    assert isinstance(out, TrainingOutput)

    h_pre = model.prelude(model.embed(x), None)
    h, aux, chosen = reference_recurrence(model, h_pre, depth)
    assert len(set(chosen)) > 2
    expected = model.output(model.norm(model.coda(h, None)))
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.aux_loss_sum, aux, rtol=1e-5, atol=1e-6)
    ce = F.cross_entropy(expected.flatten(0, 1), x.flatten(), reduction="sum")
    torch.testing.assert_close(grt_loss(out, x), ce + aux, rtol=1e-5, atol=1e-4)
    # Eval routes the same way and returns plain logits.
    model.eval()
    torch.testing.assert_close(model(x, num_recurrences=depth), expected, rtol=1e-5, atol=1e-5)


def test_balance_loss_by_hand():
    router = build_model(**TOKEN_CHOICE).recurrence.router
    R = router.num_recurrences
    # Balanced: every depth chosen by a quarter of the tokens, uniform probabilities: R sum 1/R^2 = 1.
    logits = torch.zeros(2, 8, R)
    depths = (torch.arange(16).reshape(2, 8) % R) + 1
    assert router.aux_loss(logits, depths).item() == pytest.approx(0.1 * 1.0 * 16)
    # Collapsed onto depth 1 with probability p: R P_1 f_1 = R p.
    logits = torch.tensor([2.0, 0.0, 0.0, 0.0]).expand(2, 8, R)
    p = torch.softmax(torch.tensor([2.0, 0.0, 0.0, 0.0]), 0)[0].item()
    assert router.aux_loss(logits, torch.ones(2, 8, dtype=torch.long)).item() == pytest.approx(
        0.1 * R * p * 16, rel=1e-6
    )


def test_core_runs_on_the_padded_active_tokens_each_step():
    model = build_model(**TOKEN_CHOICE)
    x = tokens()
    _, depths, _ = model.recurrence.router.route(model.prelude(model.embed(x), None))
    shapes = []
    model.recurrence.step.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape[:2])))
    model(x)
    assert shapes == [(2, int((depths > i).sum(1).max())) for i in range(4)]
    assert shapes[0] == (2, 16)  # every token takes part in step 1


class PadScrambler(nn.Module):
    """The routed step with garbage written into the pads (weight 0) of its input."""

    def __init__(self, step: nn.Module):
        super().__init__()
        self.inner, self.pads_seen = step, 0

    def forward(self, h_sel, weight, freqs_cis):
        pads = weight == 0
        self.pads_seen += int(pads.sum())
        noise = 1e3 * torch.randn(h_sel.shape, generator=torch.Generator().manual_seed(self.pads_seen))
        return self.inner(torch.where(pads, noise, h_sel), weight, freqs_cis)


def test_padding_never_leaks():
    model = build_model(**TOKEN_CHOICE)
    with torch.no_grad():
        model.recurrence.router.depth.weight.normal_(std=0.5)
    x = tokens()
    clean = model(x)
    scrambler = PadScrambler(model.recurrence.step)
    model.recurrence.step = scrambler
    scrambled = model(x)
    assert scrambler.pads_seen > 0  # the rows had different counts
    torch.testing.assert_close(scrambled.logits, clean.logits, rtol=0, atol=0)
    torch.testing.assert_close(scrambled.aux_loss_sum, clean.aux_loss_sum, rtol=0, atol=0)


def test_observer_sees_each_step_in_the_grt_convention():
    """Step metrics read h <- g h + (1 - g) o: 1 - g on the active tokens, 1 (copy) elsewhere."""
    model = build_model(**TOKEN_CHOICE)
    x = tokens()
    _, depths, weights = model.recurrence.router.route(model.prelude(model.embed(x), None))
    records = []
    model.recurrence.observer = records.append
    model(x)
    assert [r.index for r in records] == [1, 2, 3, 4]
    for i, record in enumerate(records):
        active = (depths > i).unsqueeze(-1)
        expected_gate = torch.where(active, (1 - weights).unsqueeze(-1), 1.0).expand_as(record.gate)
        torch.testing.assert_close(record.gate, expected_gate)
        assert record.new_state[~active.expand_as(record.state)].equal(record.state[~active.expand_as(record.state)])
        torch.testing.assert_close(record.new_state, record.gate * record.state + (1 - record.gate) * record.proposal)


@pytest.mark.parametrize("balance_weight", [0.0, 0.1])
def test_gradients_reach_the_router_and_the_core(balance_weight):
    model = build_model(router_balance_weight=balance_weight, **TOKEN_CHOICE)
    out = model(tokens())
    assert isinstance(out, TrainingOutput) == (balance_weight > 0)  # no auxiliary term: plain logits
    loss = out.float().square().mean() if balance_weight == 0 else out.aux_loss_sum
    loss.backward()
    grad = model.recurrence.router.depth.weight.grad  # through g (LM loss) or the balance loss
    assert grad is not None and grad.abs().sum() > 0
    if balance_weight == 0:
        assert all(p.grad is not None for p in model.recurrence.step.parameters())


def test_eval_depth_is_bounded_by_R():
    model = build_model(**TOKEN_CHOICE).eval()
    x = tokens()
    assert isinstance(model(x), torch.Tensor)
    torch.testing.assert_close(
        model(x, num_recurrences=0), model.logits_from_state(model.prelude(model.embed(x), None))
    )
    with pytest.raises(ValueError, match="num_recurrences = 5"):
        model(x, num_recurrences=5)


@pytest.mark.parametrize(
    "changes,pattern",
    [
        (
            {"router_capacity": [1, 0.5, 0.5, 0.25]},
            r"router_capacity = \[1, 0.5, 0.5, 0.25\] is invalid; is used by router = 'expert_choice' only",
        ),
        ({"router_scale": 0.2}, r"router_scale = 0.2 .*'expert_choice' only"),
        ({"router_aux_weight": 0.01}, r"router_aux_weight = 0.01 .* router_balance_weight"),
        ({"router_balance_weight": -1.0}, r"router_balance_weight = -1.0 is invalid; must be >= 0"),
        ({"router_z_loss_weight": float("nan")}, r"router_z_loss_weight"),
        ({"depth_sampling": "uniform"}, r"router = 'token_choice' needs depth_sampling = 'fixed'"),
        ({"update": "gate"}, r"router = 'token_choice' needs update = 'overwrite'"),
        ({"eval_recurrences": 5}, r"eval_recurrences = 5"),
        (
            {"router": "expert_choice", "router_balance_weight": 0.5},
            r"router_balance_weight = 0.5 .* 'token_choice' only",
        ),
        (
            {"router": "none", "router_z_loss_weight": 0.01, **{k: v for k, v in MOR_PARTS.items() if k != "router"}},
            r"router_z_loss_weight = 0.01 .* 'token_choice' only",
        ),
    ],
)
def test_invalid_token_choice_args_name_the_key(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        grt_flavors["debug"].replace(**{**TOKEN_CHOICE, **changes}).validate()


def test_tensor_parallel_and_hf_export_are_refused_by_name():
    from torchtitan.protocols.train_spec import get_train_spec

    import grt_titan.spec  # noqa: F401  registers the spec
    from grt_titan.hf.convert import ExportError, check_exportable

    overrides = parts_overrides({key: value for key, value in TOKEN_CHOICE.items() if key != "vocab_size"})
    config = parse_config(*overrides, "--parallelism.tensor_parallel_degree", "2")
    args = get_train_spec("grt").model_args[config.model.flavor].replace()
    with pytest.raises(ValueError) as info:
        args.update_from_config(config)
    assert re.search(
        r"tensor_parallel_degree = 2 is not supported with \[grt\] router = 'token_choice'", str(info.value)
    )
    assert "top-k" not in str(info.value)  # not expert choice's reason
    with pytest.raises(ExportError, match=r"router = 'token_choice'.*no token-choice routing"):
        check_exportable(grt_flavors["debug"].replace(**TOKEN_CHOICE))


def test_compile_with_step_checkpointing_passes_start_up():
    """No capacity rule: at seq_len 4 expert choice's default capacities would keep one token
    at step 4 (refused with compile); token choice has no capacities."""
    from torchtitan.protocols.train_spec import get_train_spec

    import grt_titan.spec  # noqa: F401  registers the spec

    overrides = parts_overrides({key: value for key, value in TOKEN_CHOICE.items() if key != "vocab_size"})
    config = parse_config(
        *overrides,
        "--compile.enable",
        "--activation_checkpoint.mode",
        "full",
        "--grt.recurrence_checkpoint",
        "step",
        "--training.seq_len",
        "4",
        "--validation.no-enable",
    )
    args = get_train_spec("grt").model_args[config.model.flavor].replace()
    args.update_from_config(config)
    assert (args.router, args.method_name) == ("token_choice", "MoR (token choice)")


def test_router_weight_has_a_hugging_face_checkpoint_name():
    from grt_titan.model.state_dict_adapter import GRTStateDictAdapter

    model = build_model(**TOKEN_CHOICE)
    adapter = GRTStateDictAdapter(model.model_args, None)
    assert adapter.to_hf_map["recurrence.router.depth.weight"] == "model.depth_router.weight"


def test_flops_by_hand_under_balanced_routing():
    """Small flavor, S = 1024, R = 10: step i updates S (R - i) / R tokens."""
    args = grt_flavors["small"].replace(**{**TOKEN_CHOICE, "vocab_size": 50257})
    S, d, V, R = 1024, 768, 50257, 10
    kept = [S * (R - i) / R for i in range(R)]
    expected = (
        2 * (24 * d * d + 4 * S * d)
        + sum((k / S) * 24 * d * d + 4 * (k * k / S) * d for k in kept)
        + 2 * d * R
        + 2 * d * V
    )
    assert args.forward_flops_per_token(S) == pytest.approx(expected, rel=1e-12)
    assert args.forward_flops_per_token(S, 0) == pytest.approx(2 * (24 * d * d + 4 * S * d) + 2 * d * V)


def test_truncated_backprop_flops_skip_the_active_tokens_of_the_untracked_steps():
    """By hand (small flavor, S = 1024, R = 10, backprop_recurrences = 3), the convention of
    the forward count: steps 0..6 run without autograd on S (R - i) / R tokens each, so the
    backward saved is 2 sum_{i<7} [(k_i / S) 24 d^2 + 4 (k_i^2 / S) d]; the router runs once,
    before the steps, with its gradient, and its backward stays."""
    args = grt_flavors["small"].replace(**{**TOKEN_CHOICE, "vocab_size": 50257, "backprop_recurrences": 3})
    S, d, R = 1024, 768, 10
    kept = [S * (R - i) / R for i in range(R)]
    untracked = sum((k / S) * 24 * d * d + 4 * (k * k / S) * d for k in kept[:7])
    forward = args.forward_flops_per_token(S, R, training=True)
    assert args.train_flops_per_token(S) == pytest.approx(3 * forward - 2 * untracked, rel=1e-12)
    assert args.train_flops_per_token(S) > 3 * forward - 2 * 7 * (24 * d * d + 4 * S * d)  # not whole steps
    assert args.replace(backprop_recurrences=None).train_flops_per_token(S) == 3 * forward


class ForcedDepths(nn.Linear):
    """The router Linear(d, R) (its matmul still runs) with token t forced to depth t % R + 1."""

    def forward(self, h):
        R, seq_len = self.out_features, h.shape[1]
        forced = F.one_hot(torch.arange(seq_len) % R, R).to(h.dtype) * 100.0
        return super().forward(h) + forced


@pytest.mark.parametrize("depth", [4, 2])
def test_matmul_flops_match_flop_counter_under_balanced_routing(depth):
    """Exact where the routing is the convention's: every depth chosen by S / R tokens of each
    row (no pads). The CPU SDPA kernel is not counted: the attention terms are removed."""
    model = build_model(**TOKEN_CHOICE).eval()
    router = model.recurrence.router
    forced = ForcedDepths(router.depth.in_features, router.depth.out_features, bias=False)
    forced.weight = router.depth.weight
    router.depth = forced
    args, S = model.model_args, 32
    measured_mm = matmul_flops(model, tokens(batch=2, seq=S), num_recurrences=depth)
    kept = [S * share for share in args.token_choice_active_shares[:depth]]
    attention = (args.n_prelude_layers + args.n_coda_layers) * 4 * S * S * args.dim + args.n_core_layers * sum(
        4 * k * k * args.dim for k in kept
    )
    assert measured_mm == 2 * (S * args.forward_flops_per_token(S, depth) - attention)


def test_compiled_step_does_not_recompile_for_another_k():
    """aot_eager (dynamo + AOTAutograd, where shapes are decided): the k of every step and
    every batch share one graph after the first."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = build_model(**TOKEN_CHOICE)
    model.recurrence.step = torch.compile(model.recurrence.step, backend="aot_eager", fullgraph=True)
    ks = []
    model.recurrence.step.register_forward_hook(lambda m, args, out: ks.append(args[0].shape[1]))
    model(tokens(seed=1)).logits.square().mean().backward()
    graphs = counters["stats"]["unique_graphs"]
    model(tokens(seed=2)).logits.square().mean().backward()
    assert len(set(ks)) > 2 and min(ks) >= 2  # several k, none specialized as 1
    assert counters["stats"]["unique_graphs"] == graphs == 1
    assert not counters["recompiles"], dict(counters["recompiles"])
