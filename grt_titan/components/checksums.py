"""Checksummed checkpoints on either torchtitan host (docs/reliability.md, "Checkpoint checksums").

Why: a checkpoint shard corrupted on disk loads without a word in DCP; training then runs on
wrong weights or stops later with an error that points at the data. Here:

- Save: every rank computes the CRC32 of the shard files it wrote (`ChecksumFileSystemWriter.
  write_data`); the coordinator writes them to `grt_checksums.json` inside DCP's commit,
  i.e. in `finish` before `.metadata` (which DCP renames into place last). A checkpoint
  whose `.metadata` exists therefore always has its checksums; a half-written one still
  never counts as complete. A stale `.metadata` of an earlier save of the same step is
  removed first, so an overwrite killed half-way is incomplete too.
- Load (`ChecksummedCheckpointing.verified_step`): the step torchtitan would load is verified
  first (the ranks split the files, one all-gather of the verdicts). A mismatch is named
  (file, step) in a warning and the next older complete checkpoint is tried; when none
  verifies the run stops. A checkpoint without checksums (older, or saved with `[checkpoint]
  checksums = false`) loads unverified, with a log line saying so.

`ChecksummedCheckpointing` is the part of grt_titan's checkpoint manager that both hosts
share: it overrides `dcp_save` and `dcp_load`, whose signatures torchtitan 0.2.2 and 0.3 have
in common. Each host's manager adds it to its own CheckpointManager and verifies before its
own load (0.2.2: grt_titan/components/checkpoint.py; 0.3: grt_titan/torchtitan_0_3/
checkpoint.py). The format is one, so a checkpoint of either host verifies on the other.
Nothing here is imported from torchtitan's checkpoint module, which moved in 0.3.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Callable

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import GarbageCollection

from grt_titan.checkpoints.folders import METADATA_FILE, checkpoint_steps

CHECKSUM_FILE = "grt_checksums.json"
CHECKSUM_FORMAT = "grt_titan.checkpoint_checksums"
_CHECKSUM_INDEX = MetadataIndex("__grt_titan_checksums__")  # travels in the write results only
_CHUNK = 16 << 20


class CorruptCheckpointError(RuntimeError):
    """No complete checkpoint (or not the one asked for) passes its checksums."""


def file_crc32(path: str | os.PathLike) -> str:
    """CRC32 of a file, as 8 hex digits (zlib's, about 1.5 GB/s on one core here)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


class ChecksumFileSystemWriter(FileSystemWriter):
    """DCP's FileSystemWriter that commits a CRC32 per shard file with the checkpoint."""

    def write_data(self, plan, planner) -> Future[list[WriteResult]]:
        results = super().write_data(plan, planner).wait()  # written synchronously
        files = sorted({r.storage_data.relative_path for r in results})
        sums = {
            name: {
                "crc32": file_crc32(os.path.join(self.path, name)),
                "bytes": os.path.getsize(os.path.join(self.path, name)),
            }
            for name in files
        }
        out: Future[list[WriteResult]] = Future()
        out.set_result([*results, WriteResult(index=_CHECKSUM_INDEX, size_in_bytes=0, storage_data=sums)])
        return out

    def finish(self, metadata, results: list[list[WriteResult]]) -> None:
        sums: dict[str, dict] = {}
        kept = []
        for rank_results in results:
            kept.append([r for r in rank_results if r.index != _CHECKSUM_INDEX])
            for r in rank_results:
                if r.index == _CHECKSUM_INDEX:
                    sums.update(r.storage_data)
        stale = os.path.join(self.path, METADATA_FILE)
        if os.path.exists(stale):  # an earlier save of this step: incomplete until the new one lands
            os.remove(stale)
        body = {"format": CHECKSUM_FORMAT, "version": 1, "algorithm": "crc32", "files": dict(sorted(sums.items()))}
        tmp = os.path.join(self.path, CHECKSUM_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(body, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, CHECKSUM_FILE))
        super().finish(metadata, kept)  # writes .metadata last: the commit


def verify_files(path: str, names: list[str], expected: dict) -> list[str]:
    """Problems of the shard files `names` of checkpoint `path` against `expected`."""
    problems = []
    for name in names:
        full = os.path.join(path, name)
        want = expected[name]
        if not os.path.isfile(full):
            problems.append(f"{name}: missing")
        elif os.path.getsize(full) != want["bytes"]:
            problems.append(f"{name}: {os.path.getsize(full)} bytes, {want['bytes']} when saved")
        else:
            got = file_crc32(full)
            if got != want["crc32"]:
                problems.append(f"{name}: crc32 {got}, {want['crc32']} when saved")
    return problems


def read_checksums(path: str) -> dict | None:
    """The checksums committed with checkpoint `path`, or None if it was saved without them."""
    file = os.path.join(path, CHECKSUM_FILE)
    if not os.path.isfile(file):
        return None
    with open(file) as f:
        body = json.load(f)
    if body.get("format") != CHECKSUM_FORMAT or body.get("algorithm") != "crc32":
        raise CorruptCheckpointError(f"{file}: not a grt_titan checksum file (format {body.get('format')!r})")
    return body["files"]


def verify_checkpoint(path: str, rank: int = 0, world_size: int = 1) -> list[str] | None:
    """This rank's share of the problems of checkpoint `path` (files split over the ranks;
    rank 0 also reads `.metadata` and checks it names only checksummed files). None: no
    checksums to check."""
    try:
        expected = read_checksums(path)
    except (OSError, ValueError, CorruptCheckpointError) as e:
        return [f"{CHECKSUM_FILE}: unreadable ({e})"] if rank == 0 else []
    if expected is None:
        return None
    problems = verify_files(path, sorted(expected)[rank::world_size], expected)
    if rank == 0:
        try:
            metadata = FileSystemReader(path).read_metadata()
            used = {info.relative_path for info in metadata.storage_data.values()}
            problems += [f"{name}: named by .metadata but not checksummed" for name in sorted(used - set(expected))]
        except Exception as e:  # noqa: BLE001  any failure to unpickle is corruption
            problems.append(f"{METADATA_FILE}: unreadable ({type(e).__name__}: {e})")
    return problems


def _all_problems(path: str) -> list[str] | None:
    """verify_checkpoint over every rank of the job: the same verdict on each."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return verify_checkpoint(path)
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, verify_checkpoint(path, rank, world))
    if any(g is None for g in gathered):
        return None
    return [p for g in gathered for p in g]


class ChecksummedCheckpointing:
    """Mixed into a torchtitan CheckpointManager (before it): checksummed DCP saves
    (`checksums`), a `verified_step` for the host's load to call, and a dataloader and
    trainer state whose format follows the checkpoint being loaded (`select_saved_state`:
    torchtitan's per-rank data keys, a loss-spike history)."""

    checksums: bool = True
    # The host CheckpointManager's (both hosts name them alike).
    folder: str
    pg: Any
    stager: Any
    _create_checkpoint_id: Callable[[int], str]

    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: str,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Any:
        if to_hf or not self.checksums:
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        writer = ChecksumFileSystemWriter(checkpoint_id)
        # The host's dcp_save with our storage writer (it passes one only for HF saves). Its
        # AsyncMode is a str enum on both hosts, from a module that 0.3 moved: compared by value.
        if async_mode == "async":
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg)
        elif async_mode == "async_with_pinned_mem":
            ret = dcp.async_save(
                state_dict,
                storage_writer=writer,
                process_group=self.pg,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.stager,
            )
        else:
            ret = dcp.save(state_dict, storage_writer=writer)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None:
        if not from_hf:
            saved = set(FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata)
            for name, value in state_dict.items():
                select = getattr(value, "select_saved_state", None)
                if select is not None:
                    select({k.split(".", 1)[1] for k in saved if k.startswith(name + ".")})
        super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)

    def verified_step(self, step: int) -> int:
        """`step` (an explicit `load_step`) if it verifies, else raise; for -1 the newest
        complete step (grt_titan.checkpoints.folders.checkpoint_steps) that verifies, warning about
        every newer one that does not."""
        if step != -1:
            problems = _all_problems(self._create_checkpoint_id(step))
            if problems:
                raise CorruptCheckpointError(
                    f"checkpoint {self._create_checkpoint_id(step)} (step {step}, [checkpoint] load_step) "
                    f"failed its checksums: {'; '.join(problems)}. Load another step, or leave load_step "
                    "at -1 to load the newest checkpoint that verifies"
                )
            return step
        steps = sorted(checkpoint_steps(self.folder), reverse=True)
        bad = []
        for s in steps:
            path = self._create_checkpoint_id(s)
            problems = _all_problems(path)
            if problems is None:
                logger.info(
                    f"Checkpoint {path} has no {CHECKSUM_FILE} (saved without checksums); loading it unverified."
                )
            if not problems:
                if bad:
                    logger.warning(
                        f"Resuming from checkpoint {path} (step {s}), the newest that "
                        f"passes its checksums, instead of step {bad[0]}."
                    )
                return s
            bad.append(s)
            logger.warning(
                f"Checkpoint {path} (step {s}) is corrupted: {'; '.join(problems)}. "
                "Falling back to the previous complete checkpoint."
            )
        if bad:
            raise CorruptCheckpointError(
                f"no checkpoint in {self.folder} passes its checksums (steps {', '.join(map(str, bad))} "
                "are corrupted; see the warnings above). Restore a good copy, or start over in a new "
                "dump folder"
            )
        return -1
