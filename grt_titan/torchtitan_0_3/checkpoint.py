"""`GRTCheckpointManager`: torchtitan 0.3's CheckpointManager with grt_titan's checksums.

The same checksummed saves and verified loads as on torchtitan 0.2.2, from the same code
(grt_titan/components/checksums.py, `ChecksummedCheckpointing`): a CRC32 per shard file in
`grt_checksums.json`, committed before `.metadata`; before a load, the step 0.3 would load
is verified, a corrupted one is named (file, step) and the previous complete checkpoint is
loaded, and when none verifies, or `--checkpoint.load_step` names one that does not, the run
stops with `CorruptCheckpointError`. The format is one, so each host verifies the other's
checkpoints (docs/reliability.md, "Checkpoint checksums").

0.3's manager is a `Configurable`: `[checkpoint] checksums` is a field of its Config (the
recipe's `GRTTrainer.Config.checkpoint`), on the command line `--checkpoint.checksums` /
`--checkpoint.no-checksums`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.tools import filesystem

from grt_titan.components.checksums import ChecksummedCheckpointing


class GRTCheckpointManager(ChecksummedCheckpointing, CheckpointManager):
    """0.3's CheckpointManager plus checksums (`ChecksummedCheckpointing`) and the
    dataloader and trainer states that follow the checkpoint being loaded."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        checksums: bool = True
        """Save a CRC32 of every shard file with each checkpoint (inside DCP's commit) and
        verify them before loading: a corrupted checkpoint is named and the previous complete
        one is loaded instead. Costs one read of the written files at save and of the loaded
        ones at load (docs/results/cpu_speed.md, "Checkpoint checksums")."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.checksums = config.checksums
        if self.enable and self.checksums and filesystem.is_remote(self.folder):
            raise ValueError(
                f"[checkpoint] checksums = true needs a local checkpoint folder, not {self.folder}; "
                "allowed: a local [checkpoint] folder, or --checkpoint.no-checksums"
            )

    def _load(self, step: int = -1) -> bool:
        """0.3's load (checkpointing on) of the step that verifies (`verified_step`)."""
        if self.checksums and filesystem.isdir(self.folder):
            step = self.verified_step(step)
        return super()._load(step)
