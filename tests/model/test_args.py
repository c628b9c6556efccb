"""Parameter counts, eq. 1 FLOPs by hand, depth sampling, config validation."""

import pytest
import torch

from grt_titan.model import DepthSampler, grt_flavors
from grt_titan.model.model import build_meta_model

from grt_test_helpers import LADDER_PARTS, POISSON_PARTS, RRT_PARTS, build_model, matmul_flops


def nparams(args) -> int:
    return sum(p.numel() for p in build_meta_model(args).parameters())


@pytest.mark.parametrize(
    "flavor,expected",
    [
        ("large", 288e6),  # paper table 1: ~288M stored for GRT-large
        ("dense_small", 124e6),  # GPT-2 small (tied embeddings)
        ("dense_medium", 355e6),
        ("dense_large", 774e6),
    ],
)
def test_flavor_parameter_counts(flavor, expected):
    assert nparams(grt_flavors[flavor]) == pytest.approx(expected, rel=0.01)


def test_llama_flavor_stores_over_a_billion():
    assert nparams(grt_flavors["llama_1b"]) >= 1e9
    twin = grt_flavors["dense_llama_1b"]
    assert twin.unrolled_layers == grt_flavors["llama_1b"].unrolled_layers


@pytest.mark.parametrize("flavor", ["debug", "large"])
def test_stored_parameters_do_not_depend_on_depth(flavor):
    counts = {nparams(grt_flavors[flavor].replace(num_recurrences=r)) for r in (1, 4, 12)}
    assert len(counts) == 1


def eq1_by_hand(p, n, c, R, d, S, V):
    """Paper eq. 1 plus the LM head, forward FLOPs per token."""
    return (p + n * R + c) * (24 * d * d + 4 * S * d) + R * 10 * d * d + 2 * d * V


@pytest.mark.parametrize(
    "flavor,layout",
    [("small", (1, 1, 1, 768)), ("large", (1, 5, 5, 1280))],
)
def test_flops_equal_eq1(flavor, layout):
    p, n, c, d = layout
    args = grt_flavors[flavor]
    S, V, R = 1024, 50257, args.num_recurrences
    expected_r = (1 + R) / 2  # E[r] of Uniform{1..R}
    _, flops = args.get_nparams_and_flops(build_meta_model(args), S)
    assert flops == int(3 * eq1_by_hand(p, n, c, expected_r, d, S, V))
    assert args.forward_flops_per_token(S, R) == eq1_by_hand(p, n, c, R, d, S, V)


def test_realised_flops_average_eq1_over_the_tokens_depths():
    """Per-token halting: tokens that ran depths 2, 2 and 5 cost eq. 1 at each, averaged."""
    from grt_titan.model.flops import realised_flops_per_token

    args = grt_flavors["large"]
    by_hand = [eq1_by_hand(1, 5, 5, r, 1280, 1024, 50257) for r in (2, 2, 5)]
    assert realised_flops_per_token(args, 1024, [2, 2, 5]) == pytest.approx(sum(by_hand) / 3, rel=1e-12)
    assert realised_flops_per_token(args, 1024, torch.tensor([[4, 4]]).flatten()) == eq1_by_hand(
        1, 5, 5, 4, 1280, 1024, 50257
    )
    with pytest.raises(ValueError, match="at least one token's depth"):
        realised_flops_per_token(args, 1024, [])
    # The readout rules also read out each earlier step: coda (5 blocks) and head, d - 1 times.
    readout = 5 * (24 * 1280 * 1280 + 4 * 1024 * 1280) + 2 * 1280 * 50257
    with_readouts = sum(by_hand) / 3 + (1 + 1 + 4) * readout / 3
    assert realised_flops_per_token(args, 1024, [2, 2, 5], readout_every_step=True) == pytest.approx(
        with_readouts, rel=1e-12
    )


@pytest.mark.parametrize("twin", sorted(name for name in grt_flavors if name.startswith("dense_")))
def test_each_dense_twin_has_its_flavors_block_applications(twin):
    """`dense_X` is X's isoFLOP twin (model/flavors.py): p + n R + c unshared layers of X's
    width, heads, block style and vocabulary, no core."""
    dense, grt = grt_flavors[twin], grt_flavors[twin.removeprefix("dense_")]
    applications = grt.n_prelude_layers + grt.n_core_layers * grt.num_recurrences + grt.n_coda_layers
    assert dense.n_core_layers == 0 and dense.n_prelude_layers + dense.n_coda_layers == applications
    same = ("dim", "n_heads", "n_kv_heads", "block_style", "vocab_size")
    assert [getattr(dense, f) for f in same] == [getattr(grt, f) for f in same]


def test_dense_flops_are_eq1_without_recurrence():
    args = grt_flavors["dense_small"]
    assert args.forward_flops_per_token(1024) == eq1_by_hand(12, 0, 0, 0, 768, 1024, 50257)


@pytest.mark.parametrize(
    "changes",
    [{}, dict(block_style="llama", n_kv_heads=2), LADDER_PARTS, POISSON_PARTS, RRT_PARTS],
    ids=["gpt2", "llama", "ladder_parts", "poisson_parts", "rrt_parts"],
)
def test_matmul_flops_match_flop_counter(changes):
    """The linear part of the count equals what torch's FlopCounterMode measures at r = 3,
    for both block styles and each set of recurrence parts (W_proj, gate, LoRA present or not)."""
    args = grt_flavors["debug"].replace(**changes)
    model = build_model(args).eval()
    S, r = 16, 3
    x = torch.randint(0, args.vocab_size, (1, S))
    measured_mm = matmul_flops(model, x, num_recurrences=r)
    blocks = args.n_prelude_layers + args.n_core_layers * r + args.n_coda_layers
    # The CPU SDPA kernel is not counted by FlopCounterMode; compare the linear layers,
    # i.e. eq. 1 without its attention term 4 S d per block.
    assert measured_mm == S * (args.forward_flops_per_token(S, r) - blocks * 4 * S * args.dim)


def test_depth_sampler_is_uniform_and_reproducible():
    args = grt_flavors["debug"].replace(num_recurrences=6, min_recurrences=2, depth_seed=7)
    a, b = DepthSampler(args), DepthSampler(args)
    draws = [a.sample() for _ in range(6000)]
    assert draws == [b.sample() for _ in range(6000)]
    counts = [draws.count(r) for r in range(2, 7)]
    assert set(draws) == {2, 3, 4, 5, 6}
    expected = len(draws) / 5
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001


def test_depth_sampler_resumes_from_its_buffer():
    args = grt_flavors["debug"].replace(depth_seed=3)
    first = DepthSampler(args)
    straight = [first.sample() for _ in range(10)]
    part = DepthSampler(args)
    head = [part.sample() for _ in range(4)]
    state = {k: v.clone() for k, v in part.state_dict().items()}
    resumed = DepthSampler(args)
    resumed.load_state_dict(state)
    assert head + [resumed.sample() for _ in range(6)] == straight


def test_fixed_sampling_always_uses_R():
    sampler = DepthSampler(grt_flavors["debug"].replace(depth_sampling="fixed"))
    assert {sampler.sample() for _ in range(20)} == {4}


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"num_recurrences": 0}, "num_recurrences"),
        ({"min_recurrences": 5}, "min_recurrences"),
        ({"state_noise_std": -0.1}, "state_noise_std"),
        ({"gate_noise_std": -1.0}, "gate_noise_std"),
        ({"gate_temperature": 0.0}, "gate_temperature"),
        ({"dim": 130}, "dim"),
        ({"n_kv_heads": 3}, "n_kv_heads"),
        ({"block_style": "mamba"}, "block_style"),
        ({"depth_sampling": "poisson"}, "depth_sampling"),
        ({"gate_override": 2.0}, "gate_override"),
        ({"eval_recurrences": -1}, "eval_recurrences"),
    ],
)
def test_invalid_args_name_the_key(changes, key):
    with pytest.raises(ValueError, match=key):
        grt_flavors["debug"].replace(**changes).validate()
