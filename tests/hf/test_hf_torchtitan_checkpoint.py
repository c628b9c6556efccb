"""torchtitan's own HF checkpointing through the spec's state-dict adapter, under torchrun."""

import json
import shutil

import pytest
from safetensors import safe_open

from grt_titan.checkpoints.start_load import HF_ASSETS_KEY, INITIAL_LOAD_KEY
from grt_titan.model import grt_flavors
from grt_titan.model.state_dict_adapter import GRTStateDictAdapter

from grt_test_helpers import REPO, SHORT_DEBUG_RUN, step_losses

COMMON = [*SHORT_DEBUG_RUN, "--checkpoint.enable"]


def assert_loads_trained_weights(run_torchrun, tmp_path, save, folder, nproc, extra, *, as_assets=False):
    """One step on `nproc` ranks from the HF folder that run `save` wrote: the loaded weights
    are the trained ones, so its first loss is below the trained run's first (an untrained
    model's is ln(4097) = 8.3). `as_assets`: the folder, with its tokenizer beside the
    weights as in a Hugging Face model folder, is `[model] hf_assets_path` with no
    initial_load_path and checkpointing off (torchtitan's fallback, which it would skip)."""
    trained = step_losses(save.stdout + save.stderr)
    source, key = ["--checkpoint.initial_load_path", str(folder)], INITIAL_LOAD_KEY
    if as_assets:
        shutil.copy(REPO / "grt_titan" / "assets" / "gpt2_4k.tiktoken", folder)  # grt_debug's
        source, key = ["--model.hf_assets_path", str(folder), "--checkpoint.no-enable"], HF_ASSETS_KEY
    load = run_torchrun(
        nproc,
        [
            *COMMON,
            *extra,
            "--job.dump_folder",
            str(tmp_path / "b"),
            "--training.steps",
            "1",
            *source,
            "--checkpoint.initial_load_in_hf",
        ],
        tmp_path / "b",
    )
    output = load.stdout + load.stderr
    assert load.returncode == 0, output[-3000:]
    assert f"loading from HF safetensors from {key}: {folder}" in output
    assert f"Initial weights: loaded {folder} ({key})" in output
    assert step_losses(output)[1] < trained[1] - 0.5


@pytest.mark.slow
def test_last_save_in_hf_then_initial_load_in_hf(run_torchrun, tmp_path):
    save = run_torchrun(
        2,
        [
            *COMMON,
            "--job.dump_folder",
            str(tmp_path / "a"),
            "--training.steps",
            "6",
            "--checkpoint.last_save_in_hf",
            "--checkpoint.last_save_model_only",
        ],
        tmp_path / "a",
    )
    assert save.returncode == 0, (save.stdout + save.stderr)[-3000:]
    folder = tmp_path / "a" / "checkpoint" / "step-6"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    adapter = GRTStateDictAdapter(grt_flavors["debug"], None)
    assert set(index["weight_map"]) == set(adapter.hf_keys)  # no training-only buffer, one tied head
    with safe_open(str(folder / sorted(set(index["weight_map"].values()))[0]), "pt") as f:
        assert all("draws" not in key for key in f.keys())

    assert_loads_trained_weights(
        run_torchrun, tmp_path, save, folder, 1, ["--parallelism.data_parallel_shard_degree", "1"], as_assets=True
    )


@pytest.mark.slow
def test_padded_vocab_hf_save_under_tp_then_load_under_fsdp(run_torchrun, tmp_path):
    """`[grt] vocab_multiple_of = 128`: the vocabulary-sharded (TP) embedding is saved with
    its 4097 true rows (gpt2_4k.tiktoken's ids), and loads (padded with zero rows) into an FSDP-sharded
    4224-row one."""
    pad = ["--grt.vocab_multiple_of", "128"]
    save = run_torchrun(
        2,
        [
            *COMMON,
            *pad,
            "--job.dump_folder",
            str(tmp_path / "a"),
            "--training.steps",
            "6",
            "--parallelism.data_parallel_shard_degree",
            "1",
            "--parallelism.tensor_parallel_degree",
            "2",
            "--checkpoint.last_save_in_hf",
            "--checkpoint.last_save_model_only",
        ],
        tmp_path / "a",
    )
    assert save.returncode == 0, (save.stdout + save.stderr)[-3000:]
    folder = tmp_path / "a" / "checkpoint" / "step-6"
    padded = grt_flavors["debug"].replace(vocab_multiple_of=128)
    adapter = GRTStateDictAdapter(padded, None)
    shapes = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            shapes.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})
    assert set(shapes) == set(adapter.hf_keys)
    assert shapes["model.embed_tokens.weight"] == (4097, padded.dim)  # the true vocabulary

    assert_loads_trained_weights(run_torchrun, tmp_path, save, folder, 2, pad)
