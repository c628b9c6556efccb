"""`vocab_multiple_of` and the HF side: exports hold the true vocabulary, imports pad it back."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file

from grt_titan.checkpoints.load import load_checkpoint
from grt_titan.cli import main as cli
from grt_titan.hf.convert import SINGLE_FILE, write_hf_folder
from grt_titan.hf.importer import import_hf
from grt_titan.model import GRTModel
from grt_titan.model.state_dict_adapter import TRAINING_ONLY_KEYS, GRTStateDictAdapter
from grt_titan.run_reader import load_model_args

from hf_helpers import load_hf, seeded_model, sharded_state_dict, small_args

VOCAB, PADDED = 500, 512  # vocab_multiple_of = 128
ATOL = 1e-4  # as test_hf_parity.py: fp32, same ops up to RoPE's form and SDPA kernels
VOCAB_KEYS = {
    "gpt2": {"model.embed_tokens.weight": "tok_embeddings.weight"},
    "llama": {"model.embed_tokens.weight": "tok_embeddings.weight", "lm_head.weight": "output.weight"},
}


def padded_args(style):
    return small_args(style).replace(vocab_size=VOCAB, vocab_multiple_of=128)


@pytest.fixture(scope="module")
def padded_models():
    return {style: seeded_model(padded_args(style), seed=2) for style in ("gpt2", "llama")}


@pytest.fixture(scope="module")
def padded_exports(padded_models, module_tmp):
    root = module_tmp("padded")
    return {
        style: write_hf_folder(
            root / style, m.state_dict(), m.model_args, write_tokenizer=False, verify=True
        )  # verify: fp32 logits over the true ids
        for style, m in padded_models.items()
    }


def tokens(seed=5):
    return torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_export_holds_the_true_vocabulary(style, padded_models, padded_exports):
    native = padded_models[style].state_dict()
    assert native["tok_embeddings.weight"].shape[0] == PADDED
    folder = padded_exports[style]
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == VOCAB
    assert config["training_settings"]["grt_model_args"]["vocab_multiple_of"] == 128
    weights = load_file(str(folder / SINGLE_FILE))
    assert ("lm_head.weight" in weights) == (style == "llama")  # gpt2 ties the head
    for hf_key, native_key in VOCAB_KEYS[style].items():
        assert weights[hf_key].shape == (VOCAB, native[native_key].shape[1])
        assert torch.equal(weights[hf_key], native[native_key][:VOCAB])


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_exported_model_has_the_training_models_logits_over_the_true_ids(style, padded_models, padded_exports):
    native, hf = padded_models[style], load_hf(padded_exports[style])
    assert hf.config.vocab_size == VOCAB
    assert hf.get_input_embeddings().weight.shape[0] == VOCAB
    assert hf.get_output_embeddings().weight.shape[0] == VOCAB
    x = tokens()
    R = native.model_args.num_recurrences
    with torch.no_grad():
        for r in (0, 1, R):
            ref = native(x, num_recurrences=r)
            got = hf(x, num_recurrences=r).logits
            assert ref.shape[-1] == PADDED and got.shape[-1] == VOCAB
            assert (got - ref[..., :VOCAB]).abs().max().item() < ATOL
        # Generation samples over vocab_size columns: a padded id cannot come out.
        torch.manual_seed(0)
        out = hf.generate(x[:1, :4], max_new_tokens=8, do_sample=True, top_k=0)
    assert out.shape[1] == 12 and int(out.max()) < VOCAB


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_import_pads_back_and_export_import_export_is_exact(style, padded_models, padded_exports, tmp_path):
    native = padded_models[style].state_dict()
    folder = padded_exports[style]
    ckpt = import_hf(folder, tmp_path / "checkpoint" / "step-0")
    args = padded_args(style)
    imported, _ = load_checkpoint(ckpt, args)
    assert set(imported) == set(native)
    for key, value in native.items():
        if key in TRAINING_ONLY_KEYS:
            continue
        if key in ("tok_embeddings.weight", "output.weight"):
            assert imported[key].shape == value.shape == (PADDED, args.dim)
            assert torch.equal(imported[key][:VOCAB], value[:VOCAB])
            assert not imported[key][VOCAB:].any()  # the padded rows come back as zeros
        else:
            assert torch.equal(imported[key], value), key
    again = write_hf_folder(tmp_path / "again", imported, args, write_tokenizer=False, verify=True)
    assert (again / SINGLE_FILE).read_bytes() == (folder / SINGLE_FILE).read_bytes()
    assert json.loads((again / "config.json").read_text()) == json.loads((folder / "config.json").read_text())


def _padded_toml(debug_config, tmp_path):
    text = debug_config.read_text()
    assert "\n[grt]\n" in text
    path = tmp_path / "grt_debug_padded.toml"
    path.write_text(text.replace("\n[grt]\n", "\n[grt]\nvocab_multiple_of = 128\n", 1))
    return path


def test_import_into_a_padded_config_and_back(debug_export, debug_checkpoint, debug_config, tmp_path):
    """An unpadded export of grt_debug (gpt2_4k.tiktoken's 4097 ids) imported for padded training
    (4224 rows), exported again (4097 rows, the same bytes), and imported back into the unpadded config."""
    padded_toml = _padded_toml(debug_config, tmp_path)
    padded, _ = load_model_args(padded_toml)
    assert (padded.vocab_size, padded.padded_vocab_size) == (4097, 4224)
    ckpt = tmp_path / "ft" / "checkpoint" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(debug_export), "--out", str(ckpt), "--config", str(padded_toml)]) == 0
    imported, _ = load_checkpoint(ckpt, padded)
    _, native = debug_checkpoint
    embeddings = imported["tok_embeddings.weight"]
    assert embeddings.shape == (4224, padded.dim)
    assert torch.equal(embeddings[:4097], native.tok_embeddings.weight) and not embeddings[4097:].any()

    again = tmp_path / "again"
    assert cli(["export-hf", "--checkpoint", str(ckpt), "--config", str(padded_toml), "--out", str(again)]) == 0
    assert (again / SINGLE_FILE).read_bytes() == (debug_export / SINGLE_FILE).read_bytes()
    assert json.loads((again / "config.json").read_text())["vocab_size"] == 4097
    assert load_hf(again).config.vocab_size == 4097

    back = tmp_path / "back" / "checkpoint" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(again), "--out", str(back), "--config", str(debug_config)]) == 0
    unpadded, _ = load_checkpoint(back, native.model_args)
    assert torch.equal(unpadded["tok_embeddings.weight"], native.tok_embeddings.weight)


# ---- the state-dict adapter (torchtitan's last_save_in_hf / initial_load_in_hf) ----------


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_adapter_trims_to_vocab_size_and_pads_back(style, padded_models):
    native = padded_models[style].state_dict()
    adapter = GRTStateDictAdapter(padded_args(style), None)
    hf = adapter.to_hf(native)
    for hf_key, native_key in VOCAB_KEYS[style].items():
        assert hf[hf_key].shape[0] == VOCAB
        # A view of the native rows: a DCP load into the HF plan fills the model's tensor.
        assert hf[hf_key].data_ptr() == native[native_key].data_ptr()
    assert all(v is native[adapter.from_hf_map[k]] for k, v in hf.items() if k not in VOCAB_KEYS[style])
    back = adapter.from_hf(hf)
    for native_key in VOCAB_KEYS[style].values():
        assert back[native_key].shape[0] == PADDED
        assert torch.equal(back[native_key][:VOCAB], native[native_key][:VOCAB])
        assert not back[native_key][VOCAB:].any()
    again = adapter.to_hf(back)
    assert again.keys() == hf.keys() and all(torch.equal(again[k], hf[k]) for k in hf)
    # Meta tensors (shape-only plans) are trimmed and padded the same way.
    with torch.device("meta"):
        meta = GRTModel(padded_args(style)).state_dict()
    assert adapter.from_hf(adapter.to_hf(meta))["tok_embeddings.weight"].shape == (
        PADDED,
        meta["tok_embeddings.weight"].shape[1],
    )


def test_adapter_pads_dtensors_back_to_their_sharding(tmp_path):
    """torchtitan hands the spec's adapter the (vocabulary-sharded) DTensors of the model."""
    from torch.distributed.tensor import DTensor, Shard

    from grt_titan.components.checkpoint import ShardedGRTStateDictAdapter

    args = padded_args("llama")
    torch.manual_seed(0)
    with sharded_state_dict(args, tmp_path, make=torch.randn) as sharded:
        adapter = ShardedGRTStateDictAdapter(args, None)
        hf = adapter.to_hf(sharded)
        assert all(isinstance(hf[k], DTensor) for k in hf)
        assert hf["model.embed_tokens.weight"].shape == (VOCAB, args.dim)
        back = adapter.from_hf(hf)
        for key in ("tok_embeddings.weight", "output.weight"):
            assert isinstance(back[key], DTensor) and back[key].placements == (Shard(0),)
            assert back[key].shape == (PADDED, args.dim)
            full = back[key].full_tensor()
            assert torch.equal(full[:VOCAB], sharded[key].full_tensor()[:VOCAB]) and not full[VOCAB:].any()


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_torchtitan_hf_save_and_load_paths(style, padded_models, padded_exports, tmp_path):
    """What CheckpointManager does with the adapter (as in test_hf_adapter.py), padded: its
    HF save holds vocab_size rows, and loading an export pads the rows with zeros."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    from grt_titan.components.checkpoint import ShardedGRTStateDictAdapter

    model = padded_models[style]
    args = model.model_args
    # The spec's adapter, CheckpointManager's: torchtitan's base gives it get_hf_storage_reader.
    adapter = ShardedGRTStateDictAdapter(args, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        step = tmp_path / "step-5"
        dcp.save(
            adapter.to_hf(model.state_dict()),
            storage_writer=HuggingFaceStorageWriter(path=str(step), save_distributed=True, enable_consolidation=True),
        )
        written = {}
        for f in step.glob("*.safetensors"):
            written.update(load_file(str(f)))
        assert written["model.embed_tokens.weight"].shape == (VOCAB, args.dim)
        assert torch.equal(written["model.embed_tokens.weight"], model.tok_embeddings.weight[:VOCAB])
        saved, _ = load_checkpoint(step, args)  # what export-hf reads from such a save
        assert saved["tok_embeddings.weight"].shape == (PADDED, args.dim)

        target = GRTModel(args)
        hf_plan = adapter.to_hf({k: torch.ones_like(v) for k, v in target.state_dict().items()})
        dcp.load(hf_plan, storage_reader=adapter.get_hf_storage_reader(str(padded_exports[style])))
        missing, unexpected = target.load_state_dict(adapter.from_hf(hf_plan), strict=False)
    assert not unexpected
    loaded = target.state_dict()
    for key, value in model.state_dict().items():
        if key in TRAINING_ONLY_KEYS:
            continue
        if key in ("tok_embeddings.weight", "output.weight"):
            assert torch.equal(loaded[key][:VOCAB], value[:VOCAB]) and not loaded[key][VOCAB:].any()
        else:
            assert torch.equal(loaded[key], value), key
