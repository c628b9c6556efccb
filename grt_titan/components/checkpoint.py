"""torchtitan 0.2.2's CheckpointManager with checksummed saves and verified loads (docs/reliability.md).

The checksums are host-neutral (grt_titan/components/checksums.py: the writer, the
verification and `ChecksummedCheckpointing`, which torchtitan 0.3's manager shares). Here,
0.2.2's side: `GRTCheckpointManager.load` verifies the step torchtitan would load before
loading it (a corrupted one is named and the next older complete checkpoint loaded; when
none verifies the run stops).

The spec's state-dict adapter is here too (`ShardedGRTStateDictAdapter`): the model's HF
key map (grt_titan/model/state_dict_adapter.py, plain tensors) on the sharded state dict
the CheckpointManager hands it.

Also the layout-independent resume of the data position: `dcp_load` (the shared half's)
tells the dataloader which of its state formats the checkpoint holds (`select_saved_state`),
so checkpoints with torchtitan's per-rank dataloader keys still load at their own degree.

And `[checkpoint] initial_load_path` whenever the run has nothing of its own to resume
(`load_initial`): torchtitan reads it only with checkpointing on and no checkpoint folder, so
a trial run with `--checkpoint.no-enable` (or a folder holding only a half-written step)
started from random weights without a word. It is loaded as torchtitan loads it, with its
`initial_load_*` settings; with checkpointing off nothing is saved. A start-up line names
what was loaded (a `grt-titan retrofit`'s source and layers, `initial_load_line`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.protocols.state_dict_adapter import StateDictAdapter
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import GarbageCollection

from grt_titan.checkpoints.start_load import initial_load_applies, initial_load_line, initial_load_source
from grt_titan.components.checksums import ChecksummedCheckpointing
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.state_dict_adapter import GRTStateDictAdapter
from grt_titan.sections import fault_tolerance_enabled


def checkpoint_subfolder(job_config) -> str:
    """The run's checkpoint folder below its dump folder: `[checkpoint] folder`, and under
    fault tolerance each replica group's own `replica_<id>` in it (components/fault_tolerance.py):
    its checkpoints, and the files kept beside them (the loss-spike log)."""
    folder = job_config.checkpoint.folder
    if not fault_tolerance_enabled(job_config):
        return folder
    return os.path.join(folder, f"replica_{job_config.fault_tolerance.replica_id}")


class GRTCheckpointManager(ChecksummedCheckpointing, CheckpointManager):
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
