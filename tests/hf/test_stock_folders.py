"""Dense models as stock transformers folders (grt_titan/hf/stock_folders.py; docs/hf_export.md,
"Dense models: stock GPT-2, Llama and Qwen3 folders"): export loads as GPT2LMHeadModel /
LlamaForCausalLM / Qwen3ForCausalLM with no trust_remote_code and computes the torchtitan
model's logits; import reads the folder (or one transformers wrote itself) back exactly; what
has no stock form is refused."""

import json

import pytest
import torch

from grt_titan.checkpoints.hf_weights import read_hf_weights
from grt_titan.checkpoints.load import load_checkpoint, model_from_state, save_checkpoint
from grt_titan.cli import main as cli
from grt_titan.hf.export import resolve_format
from grt_titan.hf.importer import import_hf
from grt_titan.hf.stock_folders import (
    STOCK_CLASSES,
    StockFormatError,
    dense_args_from_stock_config,
    native_to_stock_state_dict,
    read_stock_folder,
    stock_config,
    stock_export_problems,
    stock_to_native_state_dict,
    write_stock_folder,
)
from grt_titan.model import grt_flavors
from grt_titan.run_reader import load_model_args

from hf_helpers import ATOL, REPO, SMALL_VOCAB, prompt, seeded_model

# Tiny dense twins: the GPT-2 style (tied head, padded vocabulary) and the llama style with
# GQA; then the sizes a retrofitted source may have (explicit MLP width, untied GPT-2 head,
# tied Llama head, plain RoPE); and a dense Qwen3-style run (qk-norm, a head width other than
# d / heads, GQA, tied head, padded vocabulary, Qwen3's RoPE base).
VARIANTS = {
    "gpt2": dict(vocab_multiple_of=64),
    "llama_gqa": dict(block_style="llama", n_kv_heads=2, multiple_of=32, vocab_size=500, vocab_multiple_of=128),
    "gpt2_untied_ffn": dict(ffn_dim=320, tie_word_embeddings=False),
    "llama_tied_plain_rope": dict(
        block_style="llama", n_kv_heads=1, ffn_dim=200, tie_word_embeddings=True, rope_scaling=[1.0, 1.0, 4.0, 1024.0]
    ),
    "qwen3": dict(
        block_style="qwen3",
        n_kv_heads=2,
        attention_head_dim=48,
        ffn_dim=200,
        tie_word_embeddings=True,
        vocab_multiple_of=128,
        rope_theta=1e6,
    ),
}


def dense_args(variant: str):
    return grt_flavors["dense_debug"].replace(**{"vocab_size": SMALL_VOCAB, "n_prelude_layers": 3, **VARIANTS[variant]})


@pytest.fixture(scope="module", params=list(VARIANTS))
def stock_export(request, tmp_path_factory):
    """(args, torchtitan model, folder written with --verify) of one variant."""
    args = dense_args(request.param)
    model = seeded_model(args)
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    write_stock_folder(folder, model.state_dict(), args, write_tokenizer=False, verify=True)
    return args, model, folder


def load_stock(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()  # no trust_remote_code


def test_stock_class_logits_equal_torchtitan(stock_export):
    args, model, folder = stock_export
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == args.block_style and config["architectures"] == [STOCK_CLASSES[args.block_style]]
    assert "auto_map" not in config and not list(folder.glob("*.py"))  # nothing remote
    assert resolve_format(args) == "stock"  # what export-hf --format auto writes
    assert config["vocab_size"] == args.vocab_size  # padding trimmed
    hf = load_stock(folder)
    assert type(hf).__name__ == STOCK_CLASSES[args.block_style]
    assert hf.config.tie_word_embeddings == args.tie_embeddings
    ids = prompt(batch=2, seq=24, seed=3) % args.vocab_size
    with torch.no_grad():
        ref = model(ids)[..., : args.vocab_size]
        got = hf(ids).logits
    diff = (ref - got).abs().max().item()
    print(f"{args.block_style} max |logit diff| = {diff:.3g}")
    assert diff < ATOL


def test_export_import_round_trip_is_exact(stock_export, tmp_path):
    """export -> import gives the torchtitan weights (padded rows: zeros) and args;
    import -> export again gives byte-identical safetensors."""
    args, model, folder = stock_export
    out = import_hf(folder, tmp_path / "step-0")
    state, _ = load_checkpoint(out, args)
    for key, value in model.state_dict().items():
        rows = args.vocab_size if key in ("tok_embeddings.weight", "output.weight") else None
        assert torch.equal(state[key][:rows], value[:rows]), key
        if rows is not None:
            assert not state[key][rows:].any(), key
    read_args, native = read_stock_folder(folder)
    assert read_args == args
    again = write_stock_folder(tmp_path / "again", state, args, write_tokenizer=False)
    assert (again / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert native_to_stock_state_dict(stock_to_native_state_dict(read_hf_weights(folder), args), args).keys() == (
        read_hf_weights(folder).keys()
    )


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen3"])
def test_import_a_folder_transformers_wrote(model_type, tmp_path):
    """A folder saved by transformers' own class (no grt_titan settings in it) imports as the
    dense model, all layers in the prelude, and computes the stock model's logits."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    # Llama and Qwen3: GQA; Qwen3 with its own head width (24, not 64 / 4) and RoPE base.
    rope_blocks = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    llama3_rope = {
        "rope_type": "llama3",
        "rope_theta": 50000.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 2.0,
        "original_max_position_embeddings": 32,
    }
    if model_type == "gpt2":
        config = GPT2Config(
            vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
        )
        hf = GPT2LMHeadModel(config)
    elif model_type == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**rope_blocks, rope_parameters=llama3_rope))
    else:
        qwen3_rope = {"rope_type": "default", "rope_theta": 1e6}
        hf = Qwen3ForCausalLM(Qwen3Config(**rope_blocks, head_dim=24, rope_parameters=qwen3_rope))
        with torch.no_grad():  # qk-norm weights away from 1, so a lost q_norm / k_norm shows
            for name, p in hf.named_parameters():
                if "_norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    hf.eval().save_pretrained(str(tmp_path / "src"))
    out = import_hf(tmp_path / "src", tmp_path / "step-0")
    args = dense_args_from_stock_config(json.loads((tmp_path / "src" / "config.json").read_text()))
    assert (args.n_prelude_layers, args.n_core_layers, args.n_coda_layers) == (2, 0, 0)
    model = model_from_state(load_checkpoint(out, args)[0], args).eval()
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(ids) - hf(ids).logits).abs().max().item()
    assert diff < ATOL


def test_cli_exports_a_dense_run_as_stock_gpt2(tmp_path, capsys):
    """`grt-titan export-hf` of a dense_debug checkpoint: the default --format auto writes
    GPT2LMHeadModel with the GPT-2 tokenizer files; AutoTokenizer + generate need no flag;
    `--format grt` still writes the remote-code model."""
    from transformers import AutoTokenizer

    config = REPO / "train_configs" / "dense_debug.toml"
    args, _ = load_model_args(config)
    step = tmp_path / "checkpoint" / "step-5"
    save_checkpoint(step, seeded_model(args, seed=2).state_dict())
    out = tmp_path / "exports" / "dense_debug"
    assert cli(["export-hf", "--checkpoint", str(step), "--config", str(config), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"exported {step} -> {out} (stock GPT2LMHeadModel)"
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    tok = AutoTokenizer.from_pretrained(str(out))
    generated = load_stock(out).generate(**tok(["Once upon a time"], return_tensors="pt"), max_new_tokens=4)
    assert generated.shape[1] == len(tok("Once upon a time").input_ids) + 4
    grt = tmp_path / "exports" / "grt_format"
    rc = cli(["export-hf", "--checkpoint", str(step), "--config", str(config), "--out", str(grt), "--format", "grt"])
    assert rc == 0
    back = tmp_path / "imported" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(out), "--out", str(back), "--config", str(config)]) == 0
    saved, imported = load_checkpoint(step, args)[0], load_checkpoint(back, args)[0]
    assert all(torch.equal(imported[k], v) for k, v in saved.items())
    assert json.loads((grt / "config.json").read_text())["model_type"] == "grt"


def test_recurrent_model_refused_as_stock_in_one_line(tmp_path, capsys):
    config = REPO / "train_configs" / "grt_debug.toml"
    out = tmp_path / "x"
    rc = cli(
        ["export-hf", "--checkpoint", str(tmp_path), "--config", str(config), "--out", str(out), "--format", "stock"]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 1 and not out.exists() and "\n" not in err
    assert "n_core_layers = 2" in err and "--format grt" in err
    assert stock_export_problems(grt_flavors["dense_debug"]) == []


@pytest.mark.parametrize(
    "variant, change, key",
    [
        ("llama_gqa", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_scaling"),
        ("llama_gqa", {"attention_bias": True}, "attention_bias"),
        ("llama_gqa", {"head_dim": 64}, "head_dim"),
        ("llama_gqa", {"model_type": "mistral"}, "model_type"),
        ("qwen3", {"use_sliding_window": True}, "use_sliding_window"),
        ("qwen3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0}}, "rope_scaling"),
    ],
)
def test_stock_settings_grt_titan_cannot_compute_are_refused(variant, change, key):
    config = stock_config(dense_args(variant)).to_dict()
    assert dense_args_from_stock_config(config) == dense_args(variant)
    with pytest.raises(StockFormatError, match=key) as info:
        dense_args_from_stock_config({**config, **change})
    assert "\n" not in str(info.value)
