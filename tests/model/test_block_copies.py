"""Our copies of torchtitan 0.2.2's blocks (grt_titan/model/blocks/llama.py, qwen3.py,
sdpa.py, init.py) against the originals, the independent computation: the same state-dict
keys in the same order, the same draws at construction and in `init_weights` under one seed,
the same RoPE tables, and bit-equal outputs and gradients in float32.

Skipped where torchtitan 0.2.2's modules are absent (another host torchtitan)."""

import dataclasses

import pytest
import torch

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.blocks import build_block, rope_table
from grt_titan.model.blocks.init import trunc_normal_
from grt_titan.model.blocks.llama import LlamaBlockArgs, RoPEScalingArgs, precompute_freqs_cis
from grt_titan.model.blocks.qwen3 import Qwen3BlockArgs, precompute_rope_cache
from grt_titan.model.blocks.sdpa import ScaledDotProductAttentionWrapper

tt_llama = pytest.importorskip("torchtitan.models.llama3.model.model")
tt_llama_args = pytest.importorskip("torchtitan.models.llama3.model.args")
tt_qwen3 = pytest.importorskip("torchtitan.models.qwen3.model.model")
tt_qwen3_args = pytest.importorskip("torchtitan.models.qwen3.model.args")
tt_attention = pytest.importorskip("torchtitan.models.attention")
tt_utils = pytest.importorskip("torchtitan.models.utils")

TINY = dict(dim=32, n_heads=4, vocab_size=64, max_seq_len=16, n_prelude_layers=1, n_core_layers=1, n_coda_layers=1)
LLAMA_CASES = {
    "default_rope_scaling": {},
    "rope_scaling": {"rope_scaling": [4.0, 1.0, 4.0, 32]},
    "no_rope_scaling": {"rope_scaling": [1.0, 1.0, 4.0, 8192]},
    "gqa": {"n_kv_heads": 2, "multiple_of": 16, "ffn_dim_multiplier": 1.3},
    "ffn_dim": {"ffn_dim": 40, "n_kv_heads": 1},
}


def grt_args(block_style: str, **changes) -> GRTModelArgs:
    return GRTModelArgs(block_style=block_style, **{**TINY, **changes})


def torchtitan_llama_block(args: GRTModelArgs, layer_id: int):
    """What grt_titan built before the copy: torchtitan's block from its own args (depth_init
    off, n_layers the unrolled depth), its FeedForward swapped for an explicit ffn_dim."""
    scaling = {}
    if args.rope_scaling is not None:
        factor, low, high, original = args.rope_scaling
        scaling = {"rope_scaling_args": tt_llama_args.RoPEScalingArgs(factor, low, high, int(original))}
    tt_args = tt_llama_args.TransformerModelArgs(
        dim=args.dim,
        n_layers=args.unrolled_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        vocab_size=args.vocab_size,
        multiple_of=args.multiple_of,
        ffn_dim_multiplier=args.ffn_dim_multiplier,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        max_seq_len=args.max_seq_len,
        depth_init=False,
        **scaling,
    )
    block = tt_llama.TransformerBlock(layer_id, tt_args)
    if args.ffn_dim is not None:
        block.feed_forward = tt_llama.FeedForward(args.dim, -(-3 * args.ffn_dim // 2), 1, None)
    table = tt_llama.precompute_freqs_cis(args.head_dim, args.max_seq_len, args.rope_theta, tt_args.rope_scaling_args)
    return block, table


def torchtitan_qwen3_block(args: GRTModelArgs, layer_id: int):
    tt_args = tt_qwen3_args.Qwen3ModelArgs(
        dim=args.dim,
        n_layers=args.unrolled_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads or args.n_heads,
        vocab_size=args.vocab_size,
        head_dim=args.head_dim,
        hidden_dim=args.ffn_hidden_dim,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        qk_norm=True,
        max_seq_len=args.max_seq_len,
        depth_init=False,
    )
    table = tt_qwen3.precompute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta)
    return tt_qwen3.TransformerBlock(layer_id, tt_args), table


def built_pair(args: GRTModelArgs, layer_id: int = 1):
    """(ours, our table, theirs, their table), each block built after the same seed."""
    theirs_of = torchtitan_llama_block if args.block_style == "llama" else torchtitan_qwen3_block
    torch.manual_seed(0)
    ours = build_block(args, layer_id)
    torch.manual_seed(0)
    theirs, their_table = theirs_of(args, layer_id)
    return ours, rope_table(args), theirs, their_table


def assert_equal_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)  # the same keys, in the same (registration) order
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def init(block: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        if isinstance(block, tt_qwen3.TransformerBlock):
            block.init_weights(None)  # torchtitan's takes the MoE buffer device
        else:
            block.init_weights()


def forward_backward(block: torch.nn.Module, table: torch.Tensor, x: torch.Tensor, weight: torch.Tensor):
    """(output, grad of x, grads of the parameters by name) of sum(weight * block(x))."""
    x = x.clone().requires_grad_(True)
    out = block(x, table, None)
    (out * weight).sum().backward()
    return out.detach(), x.grad, {name: p.grad for name, p in block.named_parameters()}


def check_block_pair(args: GRTModelArgs) -> None:
    ours, our_table, theirs, their_table = built_pair(args)
    assert torch.equal(our_table, their_table) and our_table.dtype == their_table.dtype
    assert_equal_state(ours, theirs)  # construction draws the same numbers
    init(ours, seed=3)
    init(theirs, seed=3)
    assert_equal_state(ours, theirs)
    assert ours.weight_init_std == theirs.weight_init_std
    with torch.no_grad():  # weights neither init drew (norms != 1 too): ours loads them
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ours.load_state_dict(theirs.state_dict())
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, args.max_seq_len - 3, args.dim, generator=gen)
    weight = torch.randn(x.shape, generator=gen)
    (out, x_grad, grads), (ref, ref_x_grad, ref_grads) = (
        forward_backward(m, our_table, x, weight) for m in (ours, theirs)
    )
    assert torch.equal(out, ref) and torch.equal(x_grad, ref_x_grad)
    assert list(grads) == list(ref_grads)
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name


@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_llama_block_is_torchtitans(case):
    check_block_pair(grt_args("llama", **LLAMA_CASES[case]))


@pytest.mark.parametrize("changes", [{}, {"n_kv_heads": 2, "attention_head_dim": 16, "ffn_dim": 48}])
def test_qwen3_block_is_torchtitans(changes):
    check_block_pair(grt_args("qwen3", rope_theta=1_000_000.0, norm_eps=1e-6, **changes))


def test_llama_rope_table_is_torchtitans_at_real_sizes():
    """head_dim 64 / 128 over 4096 positions, scaled as Llama 3.1 and 3.2 are, and unscaled."""
    for head_dim, theta, scaling in ((64, 500000.0, (32.0, 1.0, 4.0, 8192)), (128, 10000.0, (1.0, 1.0, 4.0, 8192))):
        ours = RoPEScalingArgs(*scaling)
        theirs = tt_llama_args.RoPEScalingArgs(*scaling)
        ref = tt_llama.precompute_freqs_cis(head_dim, 4096, theta, theirs)
        assert torch.equal(precompute_freqs_cis(head_dim, 4096, theta, ours), ref)
        args = grt_args("llama", dim=4 * head_dim, rope_theta=theta, max_seq_len=4096, rope_scaling=list(scaling))
        assert torch.equal(rope_table(args), ref)


def test_qwen3_rope_cache_is_torchtitans():
    for head_dim, length, base in ((128, 4096, 1_000_000.0), (16, 7, 10_000.0)):
        assert torch.equal(
            precompute_rope_cache(head_dim, length, base), tt_qwen3.precompute_rope_cache(head_dim, length, base)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trunc_normal_draws_torchtitans(dtype):
    for kwargs in ({}, {"mean": 0.5, "std": 0.02}, {"std": 0.1, "a": -0.3, "b": 0.3}):
        ours, theirs = torch.empty(64, 48, dtype=dtype), torch.empty(64, 48, dtype=dtype)
        torch.manual_seed(9)
        trunc_normal_(ours, **kwargs)
        torch.manual_seed(9)
        tt_utils.trunc_normal_(theirs, **kwargs)
        assert torch.equal(ours, theirs), kwargs


@pytest.mark.parametrize("kwargs", [{}, {"scale": 0.3, "enable_gqa": True}, {"is_causal": False}])
def test_sdpa_wrapper_is_torchtitans(kwargs):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 6, 8, generator=gen)
    k, v = (torch.randn(2, 2 if kwargs.get("enable_gqa") else 4, 6, 8, generator=gen) for _ in range(2))
    ours, theirs = ScaledDotProductAttentionWrapper(), tt_attention.ScaledDotProductAttentionWrapper()
    assert ours.sdpa_backends == theirs.sdpa_backends
    assert torch.equal(ours(q, k, v, **kwargs), theirs(q, k, v, **kwargs))
    assert not list(ours.parameters()) and not list(ours.buffers())


@pytest.mark.parametrize(
    "ours, theirs",
    [(LlamaBlockArgs, "llama"), (Qwen3BlockArgs, "qwen3"), (RoPEScalingArgs, "rope")],
)
def test_our_args_are_torchtitans_fields_with_its_defaults(ours, theirs):
    """Our args keep torchtitan 0.2.2's field names and defaults (the copies' code reads them
    as the originals do)."""
    theirs = {
        "llama": tt_llama_args.TransformerModelArgs,
        "qwen3": tt_qwen3_args.Qwen3ModelArgs,
        "rope": tt_llama_args.RoPEScalingArgs,
    }[theirs]()
    our_fields, their_fields = dataclasses.asdict(ours()), dataclasses.asdict(theirs)
    assert our_fields == {name: their_fields[name] for name in our_fields}


def test_the_copies_hold_torchtitans_parameter_names():
    """The names the TP plans, float8 filters, HF key map and every checkpoint use."""
    llama, qwen3 = build_block(grt_args("llama"), 0), build_block(grt_args("qwen3"), 0)
    llama_keys = [
        "attention.wq.weight",
        "attention.wk.weight",
        "attention.wv.weight",
        "attention.wo.weight",
        "feed_forward.w1.weight",
        "feed_forward.w2.weight",
        "feed_forward.w3.weight",
        "attention_norm.weight",
        "ffn_norm.weight",
    ]
    assert list(llama.state_dict()) == llama_keys
    assert list(qwen3.state_dict()) == ["attention.q_norm.weight", "attention.k_norm.weight", *llama_keys]
    for block in (llama, qwen3):
        assert isinstance(block.attention.inner_attention, ScaledDotProductAttentionWrapper)
