"""Checksummed DCP saves and verified loads (grt_titan/components/checkpoint.py), in one
process: DCP saves without a process group. End to end under torchrun:
tests/reliability/test_layouts_and_faults.py."""

from __future__ import annotations

import json
import os
import zlib

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from grt_titan.components.checkpoint import (
    CHECKSUM_FILE,
    ChecksumFileSystemWriter,
    CorruptCheckpointError,
    GRTCheckpointManager,
    verify_checkpoint,
)

from grt_test_helpers import flip_byte


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
