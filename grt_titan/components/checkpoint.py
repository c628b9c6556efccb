"""torchtitan's CheckpointManager with checksummed saves and verified loads (docs/reliability.md).

Why: a checkpoint shard corrupted on disk loads without a word in DCP; training then runs on
wrong weights or stops later with an error that points at the data. Here:

- Save: every rank computes the CRC32 of the shard files it wrote (`ChecksumFileSystemWriter.
  write_data`); the coordinator writes them to `grt_checksums.json` inside DCP's commit,
  i.e. in `finish` before `.metadata` (which DCP renames into place last). A checkpoint
  whose `.metadata` exists therefore always has its checksums; a half-written one still
  never counts as complete. A stale `.metadata` of an earlier save of the same step is
  removed first, so an overwrite killed half-way is incomplete too.
- Load (`GRTCheckpointManager.load`): the step torchtitan would load is verified first
  (the ranks split the files, one all-gather of the verdicts). A mismatch is named (file,
  step) in a warning and the next older complete checkpoint is tried; when none verifies
  the run stops. A checkpoint without checksums (older, or saved with `[checkpoint]
  checksums = false`) loads unverified, with a log line saying so.

The spec's state-dict adapter is here too (`ShardedGRTStateDictAdapter`): the model's HF
key map (grt_titan/model/state_dict_adapter.py, plain tensors) on the sharded state dict
the CheckpointManager hands it.

Also the layout-independent resume of the data position: `dcp_load` tells the dataloader
which of its state formats the checkpoint holds (`select_saved_state`), so checkpoints with
torchtitan's per-rank dataloader keys still load at their own degree.

And `[checkpoint] initial_load_path` whenever the run has nothing of its own to resume
(`load_initial`): torchtitan reads it only with checkpointing on and no checkpoint folder, so
a trial run with `--checkpoint.no-enable` (or a folder holding only a half-written step)
started from random weights without a word. It is loaded as torchtitan loads it, with its
`initial_load_*` settings; with checkpointing off nothing is saved. A start-up line names
what was loaded (a `grt-titan retrofit`'s source and layers, `initial_load_line`).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor, Replicate
from torch.futures import Future
from torchtitan.components.checkpoint import AsyncMode, CheckpointManager
from torchtitan.protocols.state_dict_adapter import StateDictAdapter
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import GarbageCollection

from grt_titan.checkpoint_io import (
    METADATA_FILE,
    checkpoint_steps,
    initial_load_applies,
    initial_load_line,
    initial_load_source,
)
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.state_dict_adapter import GRTStateDictAdapter
from grt_titan.sections import fault_tolerance_enabled

CHECKSUM_FILE = "grt_checksums.json"
CHECKSUM_FORMAT = "grt_titan.checkpoint_checksums"
_CHECKSUM_INDEX = MetadataIndex("__grt_titan_checksums__")  # travels in the write results only
_CHUNK = 16 << 20


def checkpoint_subfolder(job_config) -> str:
    """The run's checkpoint folder below its dump folder: `[checkpoint] folder`, and under
    fault tolerance each replica group's own `replica_<id>` in it (components/fault_tolerance.py):
    its checkpoints, and the files kept beside them (the loss-spike log)."""
    folder = job_config.checkpoint.folder
    if not fault_tolerance_enabled(job_config):
        return folder
    return os.path.join(folder, f"replica_{job_config.fault_tolerance.replica_id}")


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


class GRTCheckpointManager(CheckpointManager):
    """torchtitan's CheckpointManager plus checksums (`[checkpoint] checksums`), a
    dataloader state whose format follows the checkpoint being loaded, and an
    `[checkpoint] initial_load_path` that is loaded whenever the run has nothing of its own
    to resume (`initial_load_applies`): with checkpointing off too, saving nothing."""

    def __init__(
        self,
        dataloader,
        model_parts,
        optimizers,
        lr_schedulers,
        states,
        checkpoint_config,
        sd_adapter,
        base_folder: str = "",
        ft_manager=None,
        *,
        checksums: bool = True,
    ):
        super().__init__(
            dataloader,
            model_parts,
            optimizers,
            lr_schedulers,
            states,
            checkpoint_config,
            sd_adapter,
            base_folder,
            ft_manager,
        )
        self.checksums = checksums
        if not self.enable:
            # torchtitan's __init__ returns before its load settings when checkpointing is
            # off; `load_initial` reads them (save() still saves nothing: `_should_save`).
            c = checkpoint_config
            self.initial_load_path = c.initial_load_path
            self.initial_load_model_only = c.initial_load_model_only
            self.initial_load_in_hf = c.initial_load_in_hf
            self.initial_load_in_hf_quantized = c.initial_load_in_hf_quantized
            self.exclude_from_loading = c.exclude_from_loading
            self.sd_adapter = sd_adapter

    def dcp_save(self, state_dict, checkpoint_id, async_mode, enable_garbage_collection=False, to_hf=False):
        if to_hf or not self.checksums:
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        writer = ChecksumFileSystemWriter(checkpoint_id)
        # torchtitan's dcp_save with our storage writer (it always passes None for DCP saves).
        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg)
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

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

    def dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized) -> None:
        if not from_hf:
            saved = set(FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata)
            for name, value in state_dict.items():
                select = getattr(value, "select_saved_state", None)
                if select is not None:
                    select({k.split(".", 1)[1] for k in saved if k.startswith(name + ".")})
        super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)

    @torch.no_grad()
    def load(self, step: int = -1) -> bool:
        folder = self.folder if self.enable else None
        if initial_load_applies(self.initial_load_source()[0], self.enable, folder, step):
            return self.load_initial()
        if self.enable and self.checksums and os.path.isdir(self.folder):
            step = self.verified_step(step)
        return super().load(step)

    def load_initial(self) -> bool:
        """Load `[checkpoint] initial_load_path` as torchtitan's `load` does for a run without
        a checkpoint folder (its `initial_load_model_only` / `initial_load_in_hf` /
        `initial_load_in_hf_quantized`, through `_states_to_load` and `dcp_load`), also when
        torchtitan would skip it: checkpointing off, or a folder with no complete step. The
        start-up check (`initial_load_problems`) has made sure the path is a checkpoint."""
        path, key = self.initial_load_source()
        if not self.enable:
            logger.info(
                f"[checkpoint] enable = false: loading {key} {path} all the same "
                "(torchtitan would skip it); this run saves no checkpoint"
            )
        elif os.path.isdir(self.folder):
            logger.warning(
                f"Checkpoint folder {self.folder} holds no complete checkpoint to resume from; "
                f"loading {key} {path} instead of starting from random weights."
            )
        if self.enable_ft_dataloader_checkpoints:
            self._ft_load()
        if self.initial_load_in_hf:  # torchtitan's lines from here on (naming the key that gave the path)
            logger.info(f"loading from HF safetensors from {key}: {path}")
        logger.info(f"Loading the checkpoint from {path}.")
        begin = time.monotonic()
        states = self._states_to_load(self.initial_load_model_only)
        self.dcp_load(
            states,
            checkpoint_id=path,
            from_hf=self.initial_load_in_hf,
            from_quantized=self.initial_load_in_hf_quantized,
        )
        GarbageCollection.collect("GC collection for checkpoint loading.")
        logger.info(f"Finished loading the checkpoint in {time.monotonic() - begin:.2f} seconds.")
        logger.info(initial_load_line(path, key))
        return True

    def initial_load_source(self) -> tuple[str | None, str]:
        """`initial_load_source` of this manager's settings: its initial_load_path, or the
        adapter's hf_assets_path under `initial_load_in_hf` (torchtitan's fallback)."""
        hf_assets_path = getattr(getattr(self, "sd_adapter", None), "hf_assets_path", None)
        return initial_load_source(self, hf_assets_path) if hasattr(self, "initial_load_path") else (None, "")

    def verified_step(self, step: int) -> int:
        """`step` (an explicit `load_step`) if it verifies, else raise; for -1 the newest
        complete step (grt_titan.checkpoint_io.checkpoint_steps) that verifies, warning about
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
                "--job.dump_folder"
            )
        return -1


class ShardedGRTStateDictAdapter(GRTStateDictAdapter, StateDictAdapter):
    """The spec's `state_dict_adapter`: GRTStateDictAdapter on the DTensors torchtitan's
    CheckpointManager hands it (`last_save_in_hf`, `initial_load_in_hf`).

    torchtitan's StateDictAdapter is a base here, not in model/ (which is host-neutral): it
    gives `get_hf_storage_reader`, which CheckpointManager calls for `initial_load_in_hf`.
    Its `__init__` is not run (GRTStateDictAdapter's sets the same attributes, and reads
    no index from a tokenizer file).

    The key map is the model's; what sharding adds is the padded vocabulary
    (`vocab_multiple_of`): `to_hf` of a weight sharded over the vocabulary comes back
    replicated (DTensor's narrow gathers it), and `from_hf` re-shards the padded weight as
    `to_hf` saw it. Here and not in model/, which imports nothing from torch.distributed.
    """

    def __init__(self, model_args: GRTModelArgs, hf_assets_path: str | None):
        super().__init__(model_args, hf_assets_path)
        # (mesh, placements) of the padded DTensors `to_hf` trimmed, for `from_hf` to restore.
        self._vocab_layouts: dict[str, tuple[Any, tuple]] = {}

    def _trim_vocab(self, key: str, value: Any) -> Any:
        if isinstance(value, DTensor) and self._padding_applies(value, self.padded_vocab_size):
            self._vocab_layouts[key] = (value.device_mesh, tuple(value.placements))
        return super()._trim_vocab(key, value)

    def _pad_vocab(self, key: str, value: Any) -> Any:
        if not isinstance(value, DTensor) or not self._padding_applies(value, self.vocab_size):
            return super()._pad_vocab(key, value)
        mesh, placements = self._vocab_layouts.get(key, (value.device_mesh, tuple(value.placements)))
        padded = super()._pad_vocab(key, value.full_tensor())
        # Replicated -> the native sharding: a local split, no communication.
        replicated = DTensor.from_local(padded, mesh, [Replicate()] * mesh.ndim, run_check=False)
        return replicated.redistribute(mesh, placements)
