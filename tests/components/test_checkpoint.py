"""Checksummed DCP saves and verified loads (grt_titan/components/checksums.py and the 0.2.2
manager of checkpoint.py), in one process: DCP saves without a process group. End to end under torchrun:
tests/reliability/test_layouts_and_faults.py."""

from __future__ import annotations

import json
import os
import zlib

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from grt_titan.checkpoints.start_load import initial_load_line
from grt_titan.components.checkpoint import GRTCheckpointManager
from grt_titan.components.checksums import (
    CHECKSUM_FILE,
    ChecksumFileSystemWriter,
    CorruptCheckpointError,
    verify_checkpoint,
)

from grt_test_helpers import build_model, flip_byte


def save(path, checksums: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    state = {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g), "step": 3}
    writer = ChecksumFileSystemWriter(str(path)) if checksums else dcp.FileSystemWriter(str(path))
    dcp.save(state, storage_writer=writer)
    return state


def shard(path):
    (name,) = [p for p in os.listdir(path) if p.endswith(".distcp")]
    return os.path.join(path, name)


def test_checksums_are_committed_with_the_checkpoint_and_match_the_files(tmp_path):
    path = tmp_path / "step-1"
    state = save(path)
    body = json.loads((path / CHECKSUM_FILE).read_text())
    assert body["algorithm"] == "crc32" and set(body["files"]) == {os.path.basename(shard(path))}
    # independent of file_crc32: zlib over the whole file at once
    data = open(shard(path), "rb").read()
    assert body["files"][os.path.basename(shard(path))] == {"crc32": f"{zlib.crc32(data):08x}", "bytes": len(data)}
    assert verify_checkpoint(str(path)) == []
    loaded = {"w": torch.zeros(64, 64), "b": torch.zeros(64), "step": 0}
    dcp.load(loaded, checkpoint_id=str(path))  # DCP itself ignores the extra file
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3


def test_a_flipped_byte_is_named(tmp_path):
    path = tmp_path / "step-1"
    save(path)
    flip_byte(shard(path))
    (problem,) = verify_checkpoint(str(path))
    assert problem.startswith(os.path.basename(shard(path)) + ": crc32 ")


@pytest.mark.parametrize("fault", ["truncated_shard", "missing_shard", "corrupt_metadata"])
def test_other_faults_are_named(tmp_path, fault):
    path = tmp_path / "step-1"
    save(path)
    name = os.path.basename(shard(path))
    if fault == "truncated_shard":
        os.truncate(shard(path), 10)
        expected = f"{name}: 10 bytes"
    elif fault == "missing_shard":
        os.remove(shard(path))
        expected = f"{name}: missing"
    else:
        (path / ".metadata").write_bytes(b"\x80\x04garbage")
        expected = ".metadata: unreadable"
    problems = verify_checkpoint(str(path))
    assert any(p.startswith(expected) for p in problems), problems


def test_a_checkpoint_without_checksums_is_unverified(tmp_path):
    save(tmp_path / "step-1", checksums=False)
    assert verify_checkpoint(str(tmp_path / "step-1")) is None


def test_resaving_a_step_drops_its_stale_metadata_first(tmp_path, monkeypatch):
    """A save over an earlier save of the same step that dies before its commit leaves no
    `.metadata`, so it never counts as complete (the stale one would describe other bytes)."""
    path = tmp_path / "step-2"
    save(path)
    assert (path / ".metadata").is_file()
    calls = []

    def die_in_commit(self, metadata, results):
        calls.append(1)
        raise OSError("killed before .metadata")

    monkeypatch.setattr(dcp.FileSystemWriter, "finish", die_in_commit)
    with pytest.raises(CheckpointException, match="killed before .metadata"):  # DCP's wrapper
        save(path, seed=1)
    assert calls and not (path / ".metadata").exists()


def manager(folder) -> GRTCheckpointManager:
    """The load-step logic of GRTCheckpointManager without a trainer behind it."""
    m = GRTCheckpointManager.__new__(GRTCheckpointManager)
    m.folder = str(folder)
    return m


def test_load_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path, caplog):
    for step in (2, 4, 6):
        save(tmp_path / f"step-{step}")
    (tmp_path / "step-8").mkdir()  # half-written: no .metadata, never considered
    flip_byte(shard(tmp_path / "step-6"))
    os.remove(shard(tmp_path / "step-4"))
    with caplog.at_level("WARNING"):
        assert manager(tmp_path).verified_step(-1) == 2
    text = caplog.text
    assert "step-6 (step 6) is corrupted: __0_0.distcp: crc32" in text
    assert "step-4 (step 4) is corrupted: __0_0.distcp: missing" in text
    assert "Resuming from checkpoint" in text and "(step 2)" in text and "instead of step 6" in text


def test_load_stops_when_no_checkpoint_verifies_or_the_chosen_one_does_not(tmp_path):
    save(tmp_path / "step-2")
    save(tmp_path / "step-4")
    flip_byte(shard(tmp_path / "step-4"))
    with pytest.raises(CorruptCheckpointError, match=r"step-4 \(step 4, \[checkpoint\] load_step\) failed"):
        manager(tmp_path).verified_step(4)
    assert manager(tmp_path).verified_step(2) == 2
    flip_byte(shard(tmp_path / "step-2"))
    with pytest.raises(CorruptCheckpointError, match=r"no checkpoint in .* passes its checksums \(steps 4, 2"):
        manager(tmp_path).verified_step(-1)
    assert manager(tmp_path / "none").verified_step(-1) == -1


# ---- [checkpoint] initial_load_path --------------------------------------------------------


def retrofit_record(folder, **changes):
    record = {
        "source": "/models/SmolLM2-135M",
        "model_type": "llama",
        "source_layers": 30,
        "prelude": list(range(12)),
        "core": list(range(12, 18)),
        "coda": list(range(18, 30)),
        "dropped": [],
        "init": "every-depth",
        **changes,
    }
    record = {k: v for k, v in record.items() if v is not None}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "retrofit.json").write_text(json.dumps(record))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_initial_load_path_loads_with_checkpointing_off_and_saves_nothing(tmp_path, caplog):
    """torchtitan skips initial_load_path with `[checkpoint] enable = false`; ours loads it (the
    weights equal the saved ones, not the module's own init), names it, and saves nothing."""
    from torchtitan.config import Checkpoint

    torch.manual_seed(0)
    saved = torch.nn.Linear(4, 3)
    path = tmp_path / "retrofit" / "model"
    dcp.save(dict(saved.state_dict()), checkpoint_id=str(path))
    retrofit_record(tmp_path / "retrofit")
    model = torch.nn.Linear(4, 3)
    assert not torch.equal(model.weight, saved.weight)
    config = Checkpoint(enable=False, initial_load_path=str(path))
    m = GRTCheckpointManager(None, [model], None, None, {}, config, None, str(tmp_path / "run"))
    with caplog.at_level("INFO"):
        assert m.load() is True
    assert torch.equal(model.weight, saved.weight) and torch.equal(model.bias, saved.bias)
    assert f"Loading the checkpoint from {path}." in caplog.text
    assert initial_load_line(str(path)) in caplog.text
    m.save(curr_step=1, last_step=True)
    assert not (tmp_path / "run").exists()
    assert GRTCheckpointManager(None, [model], None, None, {}, Checkpoint(), None, str(tmp_path)).load() is False


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_hf_initial_load_path_loads_with_checkpointing_off(tmp_path):
    """`initial_load_in_hf = true` is respected without checkpointing: torchtitan's HF read
    (the spec's adapter, `to_hf` -> HuggingFaceStorageReader -> `from_hf`) fills the model."""
    from safetensors.torch import save_file
    from torchtitan.config import Checkpoint

    from grt_titan.components.checkpoint import ShardedGRTStateDictAdapter

    saved = build_model("debug", seed=1, vocab_size=512)
    args = saved.model_args
    hf = ShardedGRTStateDictAdapter(args, None).to_hf(saved.state_dict())
    (tmp_path / "hf").mkdir()
    save_file({k: v.contiguous() for k, v in hf.items()}, str(tmp_path / "hf" / "model.safetensors"))
    model = build_model("debug", seed=2, vocab_size=512)
    adapter = ShardedGRTStateDictAdapter(args, None)
    keys = set(adapter.from_hf_map.values())  # what an HF folder holds (not training-only buffers)
    assert not torch.equal(model.tok_embeddings.weight, saved.tok_embeddings.weight)
    config = Checkpoint(enable=False, initial_load_path=str(tmp_path / "hf"), initial_load_in_hf=True)
    assert GRTCheckpointManager(None, [model], None, None, {}, config, adapter, str(tmp_path)).load()
    assert all(torch.equal(model.state_dict()[k], saved.state_dict()[k]) for k in keys)


def test_start_up_line_names_the_retrofit(tmp_path):
    path = str(tmp_path / "model")
    retrofit_record(tmp_path)
    assert initial_load_line(path) == (
        f"Retrofit: loaded {path} (/models/SmolLM2-135M, llama, 30 source layers: prelude 0-11, "
        "core 12-17, coda 18-29, dropped none; init every-depth)"
    )
    # A retrofit from before --init: nothing said about the init. Dropped layers as ranges.
    retrofit_record(tmp_path, init=None, prelude=[0, 1], core=[3], coda=[5], dropped=[2, 4])
    assert initial_load_line(path) == (
        f"Retrofit: loaded {path} (/models/SmolLM2-135M, llama, 30 source layers: prelude 0-1, "
        "core 3, coda 5, dropped 2, 4)"
    )
    (tmp_path / "retrofit.json").write_text("{")
    assert initial_load_line(path).startswith(f"Initial weights: loaded {path} ([checkpoint] initial_load_path; its ")
    other = str(tmp_path / "run" / "checkpoint" / "step-10")
    assert initial_load_line(other) == f"Initial weights: loaded {other} ([checkpoint] initial_load_path)"
