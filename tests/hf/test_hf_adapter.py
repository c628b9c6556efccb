"""GRTStateDictAdapter: the key map torchtitan's `last_save_in_hf` / `initial_load_in_hf` use."""

import json

import pytest
import torch

from grt_titan.model import GRTModel, grt_flavors
from grt_titan.model.state_dict_adapter import (
    TRAINING_ONLY_KEYS,
    GRTStateDictAdapter,
    expected_native_keys,
)

from hf_helpers import sharded_state_dict, small_args


@pytest.mark.parametrize("flavor", sorted(grt_flavors))
def test_key_map_is_one_to_one_and_covers_every_flavor(flavor):
    args = grt_flavors[flavor]
    adapter = GRTStateDictAdapter(args, None)
    native = expected_native_keys(args)
    exported = set(native) - TRAINING_ONLY_KEYS - ({"output.weight"} if args.tie_embeddings else set())
    assert set(adapter.to_hf_map) == exported
    assert len(set(adapter.to_hf_map.values())) == len(exported)
    # One copy of the shared core, whatever R is.
    core = [k for k in adapter.hf_keys if k.startswith("model.core.")]
    assert len({k.split(".")[2] for k in core}) == args.n_core_layers
    assert not any("draws" in k for k in adapter.hf_keys)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_round_trip_on_a_native_state_dict(style, native_models):
    model = native_models[style]
    adapter = GRTStateDictAdapter(model.model_args, None)
    native = model.state_dict()
    hf = adapter.to_hf(native)
    # Values pass through untouched (no permutation): same tensor objects.
    for hf_key, value in hf.items():
        assert value is native[adapter.from_hf_map[hf_key]]
    back = adapter.from_hf(hf)
    dropped = set(native) - set(back)
    assert dropped == set(TRAINING_ONLY_KEYS) | ({"output.weight"} if style == "gpt2" else set())
    assert all(back[k] is native[k] for k in back)
    assert adapter.to_hf(back).keys() == hf.keys()
    # import leaves the depth sampler's counter alone (strict=False load, as torchtitan does)
    model.recurrence.depth_sampler.draws.fill_(17)
    try:
        missing, unexpected = model.load_state_dict(back, strict=False)
        assert not unexpected and set(missing) <= set(dropped)
        assert int(model.recurrence.depth_sampler.draws) == 17
    finally:
        model.recurrence.depth_sampler.draws.zero_()


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_hf_keys_are_the_hf_models_parameters(style, hf_models, native_models):
    adapter = GRTStateDictAdapter(native_models[style].model_args, None)
    hf_params = set(hf_models[style].state_dict())
    if style == "gpt2":
        hf_params.discard("lm_head.weight")  # tied to model.embed_tokens.weight
    assert set(adapter.hf_keys) == hf_params


def test_to_hf_accepts_dtensors(tmp_path):
    """torchtitan applies to_hf to the empty sharded state dict to plan its HF reads."""
    args = small_args("llama")
    with sharded_state_dict(args, tmp_path) as sharded:
        adapter = GRTStateDictAdapter(args, None)
        hf = adapter.to_hf(sharded)
        assert set(hf) == set(adapter.hf_keys)
        assert all(type(hf[k]).__name__ == "DTensor" for k in hf)
        assert adapter.to_hf(adapter.from_hf(hf)) == hf


def test_unknown_keys_are_errors():
    adapter = GRTStateDictAdapter(small_args("gpt2"), None)
    with pytest.raises(ValueError, match="unexpected GRT state-dict key 'layers.0.attention.wq.weight'"):
        adapter.to_hf({"layers.0.attention.wq.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="unexpected Hugging Face key 'lm_head.weight'"):
        adapter.from_hf({"lm_head.weight": torch.zeros(1)})  # gpt2 ties the head


def test_hf_assets_path_file_or_index(tmp_path):
    args = small_args("gpt2")
    # The tokenizer's .tiktoken file as hf_assets_path: no index, one file (no crash).
    assert GRTStateDictAdapter(args, "grt_titan/assets/gpt2.tiktoken").fqn_to_index_mapping is None
    adapter = GRTStateDictAdapter(args, None)
    weight_map = {k: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, k in enumerate(adapter.hf_keys)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    mapping = GRTStateDictAdapter(args, str(tmp_path)).fqn_to_index_mapping
    assert mapping == {k: 1 + i % 2 for i, k in enumerate(adapter.hf_keys)}
    # An index of another model is ignored rather than breaking the save.
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00001-of-00001.safetensors"}})
    )
    assert GRTStateDictAdapter(args, str(tmp_path)).fqn_to_index_mapping is None


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_torchtitan_hf_save_and_load_paths(style, native_models, exported, tmp_path):
    """What CheckpointManager does with the adapter (dcp_save to_hf=True / dcp_load from_hf=True),
    in one process: its HF save is exportable, and an exported folder is loadable."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    from grt_titan.checkpoints.load import load_checkpoint
    from grt_titan.components.checkpoint import ShardedGRTStateDictAdapter

    model = native_models[style]
    args = model.model_args
    # The spec's adapter, CheckpointManager's: torchtitan's base gives it get_hf_storage_reader.
    adapter = ShardedGRTStateDictAdapter(args, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        # last_save_in_hf: to_hf, then the HF writer with consolidation (no index mapping).
        step = tmp_path / "step-5"
        dcp.save(
            adapter.to_hf(model.state_dict()),
            storage_writer=HuggingFaceStorageWriter(path=str(step), save_distributed=True, enable_consolidation=True),
        )
        saved, facts = load_checkpoint(step, args)
        assert facts["step"] == 5
        for key, value in adapter.to_hf(model.state_dict()).items():
            assert torch.equal(saved[adapter.from_hf_map[key]], value)
        # initial_load_in_hf from an exported folder: to_hf of the model's own (empty)
        # state dict is the read plan, from_hf maps back, strict=False load.
        target = GRTModel(args)
        hf_plan = adapter.to_hf({k: torch.zeros_like(v) for k, v in target.state_dict().items()})
        dcp.load(hf_plan, storage_reader=adapter.get_hf_storage_reader(str(exported[style])))
        missing, unexpected = target.load_state_dict(adapter.from_hf(hf_plan), strict=False)
    assert not unexpected
    for key, value in model.state_dict().items():
        if key not in TRAINING_ONLY_KEYS:
            assert torch.equal(target.state_dict()[key], value), key
