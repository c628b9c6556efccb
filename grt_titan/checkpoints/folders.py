"""A checkpoint folder: the files that mark a complete step, and its latest complete step.

- `checkpoint_steps` / `latest_complete_step`: THE definition of a checkpoint folder's
  latest complete step, torchtitan's (`CheckpointManager._find_load_step`): the largest N of
  a `step-N` holding DCP's `.metadata` (written last, by the commit) or the HF
  `model.safetensors.index.json` of a `last_save_in_hf` save; a half-written newer
  `step-N` never counts. A resume loads it (GRTCheckpointManager tries the older complete
  steps only when its checksums fail), `resume_problems` (grt_titan/checkpoints/start_load.py)
  inspects it, and `latest_step_folder` picks it for export-hf and analyze.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

METADATA_FILE = ".metadata"  # DCP's commit: written last, so a folder with it is complete
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# torchtitan's checkpoint entries besides the model's (CheckpointManager.states).
RESUME_STATES = ("train_state", "optimizer", "lr_scheduler", "dataloader")


# ---- the latest complete step ----------------------------------------------------------


def checkpoint_steps(folder: str | os.PathLike) -> list[int]:
    """The complete checkpoints of a checkpoint folder, as torchtitan's `_find_load_step`
    counts them: `step-N` with DCP's `.metadata` or an HF `model.safetensors.index.json`."""
    steps = []
    if not os.path.isdir(folder):
        return steps
    for name in os.listdir(folder):
        match = re.search(r"step-(\d+)", name)  # as _find_load_step
        path = os.path.join(folder, name)
        if match and (
            os.path.isfile(os.path.join(path, METADATA_FILE)) or os.path.isfile(os.path.join(path, INDEX_FILE))
        ):
            steps.append(int(match.group(1)))
    return steps


def latest_complete_step(folder: str | os.PathLike) -> int:
    """The step a resume loads (`[checkpoint] load_step = -1`): the largest complete one, -1
    for none (a half-written newer `step-N` is never loaded)."""
    return max(checkpoint_steps(folder), default=-1)


def step_folder(folder: str | os.PathLike, step: int) -> str:
    """`<folder>/step-N`, torchtitan's checkpoint id of a step."""
    return os.path.join(folder, f"step-{step}")


def latest_step_folder(path: Path) -> Path:
    """`path` itself (a step folder), or the latest complete step of a checkpoint folder."""
    step = latest_complete_step(path)
    return Path(step_folder(path, step)) if step != -1 else path
