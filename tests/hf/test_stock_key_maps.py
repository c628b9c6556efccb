"""Our copy of torchtitan 0.2.2's Llama 3 / Qwen3 <-> Hugging Face key maps
(grt_titan/hf/stock_key_maps.py) against the originals: the same keys, in the same order, and
bit-equal tensors both ways (Llama's q/k permutation with GQA; Qwen3's q/k norms and a head
width other than dim / heads). The comparisons skip where torchtitan 0.2.2's adapters are
absent; the round trip runs on every host."""

import pytest
import torch

from grt_titan.hf.stock_key_maps import LlamaKeyMap, Qwen3KeyMap, stock_key_map
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.blocks import build_block, llama_block_args

N_LAYERS = 2
CASES = {
    "llama": dict(block_style="llama", n_kv_heads=2),
    "qwen3": dict(block_style="qwen3", n_kv_heads=2, attention_head_dim=12),
}


def grt_args(style: str) -> GRTModelArgs:
    return GRTModelArgs(
        dim=32,
        n_heads=4,
        vocab_size=64,
        max_seq_len=16,
        n_prelude_layers=1,
        n_core_layers=0,
        n_coda_layers=1,
        **CASES[style],
    )


def native_flat(args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """Random flat native weights (`layers.{i}.<block>`, embeddings, norm, head), every entry
    distinct, so that a wrong permutation or key shows."""
    shapes = {f"layers.{i}.{k}": v.shape for i in range(N_LAYERS) for k, v in build_block(args, i).state_dict().items()}
    shapes |= {
        "tok_embeddings.weight": (args.vocab_size, args.dim),
        "norm.weight": (args.dim,),
        "output.weight": (args.vocab_size, args.dim),
    }
    generator = torch.Generator().manual_seed(0)
    return {k: torch.randn(shape, generator=generator) for k, shape in shapes.items()}


def their_adapter(args: GRTModelArgs):
    """torchtitan 0.2.2's own adapter of `args` (skips where absent)."""
    if args.block_style == "llama":
        module = pytest.importorskip("torchtitan.models.llama3.model.state_dict_adapter")
        return module.Llama3StateDictAdapter(llama_block_args(args), None)
    module = pytest.importorskip("torchtitan.models.qwen3.model.state_dict_adapter")
    tt_args = pytest.importorskip("torchtitan.models.qwen3.model.args")
    qwen3_args = tt_args.Qwen3ModelArgs(
        dim=args.dim,
        n_layers=N_LAYERS,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        head_dim=args.head_dim,
        hidden_dim=args.ffn_hidden_dim,
        vocab_size=args.vocab_size,
        enable_weight_tying=False,
    )
    return module.Qwen3StateDictAdapter(qwen3_args, None)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)  # the same keys in the same order
    for key in a:
        assert a[key].shape == b[key].shape and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("style", CASES)
def test_to_hf_equals_torchtitans(style):
    args = grt_args(style)
    theirs = their_adapter(args)
    flat = native_flat(args)
    ours = stock_key_map(args).to_hf(flat)
    assert_same(ours, theirs.to_hf(dict(flat)))
    assert "model.layers.1.self_attn.k_proj.weight" in ours and "lm_head.weight" in ours
    if style == "qwen3":
        assert "model.layers.0.self_attn.q_norm.weight" in ours


@pytest.mark.parametrize("style", CASES)
def test_from_hf_equals_torchtitans(style):
    args = grt_args(style)
    theirs = their_adapter(args)
    hf = {k: v.clone() for k, v in theirs.to_hf(native_flat(args)).items()}
    if style == "llama":  # an old file's rotary buffer, dropped (torchtitan's Qwen3 adapter fails on it)
        hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(args.head_dim // 2)
    assert_same(stock_key_map(args).from_hf(dict(hf)), theirs.from_hf(dict(hf)))


@pytest.mark.parametrize("style", CASES)
def test_round_trip_is_exact(style):
    args = grt_args(style)
    key_map = stock_key_map(args)
    assert isinstance(key_map, LlamaKeyMap if style == "llama" else Qwen3KeyMap)
    flat = native_flat(args)
    hf = key_map.to_hf(flat)
    if style == "llama":  # q / k rows are permuted to rotate_half's order, the rest is not
        assert not torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], flat["layers.0.attention.wq.weight"])
        assert not torch.equal(hf["model.layers.0.self_attn.k_proj.weight"], flat["layers.0.attention.wk.weight"])
    assert torch.equal(hf["model.layers.0.self_attn.v_proj.weight"], flat["layers.0.attention.wv.weight"])
    hf["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(args.head_dim // 2)  # dropped
    assert_same(key_map.from_hf(hf), flat)


def test_unknown_keys_and_styles_are_refused():
    with pytest.raises(KeyError):
        stock_key_map(grt_args("qwen3")).to_hf({"layers.0.attention.bogus.weight": torch.zeros(1)})
    with pytest.raises(KeyError):
        stock_key_map(grt_args("llama")).from_hf({"model.layers.0.mlp.bogus.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="gpt2"):
        stock_key_map(GRTModelArgs(block_style="gpt2", dim=32, n_heads=4, vocab_size=64, max_seq_len=16))
