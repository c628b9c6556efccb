"""What torchtitan's own trainer (`-m torchtitan.train`) would silently skip, refused at
start-up by name (docs/reliability.md): `[fault_tolerance]`, which only
`GRTFaultTolerantTrainer` runs (fault_tolerance.py), and `[checkpoint] initial_load_path`
with checkpointing off, which only `GRTCheckpointManager` loads (checkpoint.py).
`python -m grt_titan.train` runs both: its `GRTTrainer` marks its start
(trainer.py's `grt_trainer_is_starting`), which is how the checks tell it from torchtitan's.

A module apart from trainer.py and fault_tolerance.py: those import torchtitan.train (large,
and torchtitan 0.2.2's alone), which these import only when the job uses what they guard.
grt_titan/config_checks.py runs them last, in its order.
"""

from __future__ import annotations

import torch.distributed as dist

from grt_titan.checkpoints.start_load import initial_load_source
from grt_titan.sections import fault_tolerance_enabled


def plain_trainer_runs() -> bool:
    """Whether torchtitan's own trainer runs this job: its process group is up (a trainer
    builds it before the checks run) and the Trainer.__init__ running is not a GRTTrainer's."""
    from grt_titan.components.trainer import grt_trainer_is_starting  # here: torchtitan.train is a large import

    return dist.is_initialized() and not grt_trainer_is_starting()


def plain_trainer_initial_load_problems(job_config) -> list[str]:
    """torchtitan's own trainer skips `initial_load_path` with checkpointing off (grt_titan's
    loads it): refused there rather than a silent start from random weights."""
    c = job_config.checkpoint
    path, key = initial_load_source(c, job_config.model.hf_assets_path)
    if c.enable or path is None:
        return []
    if plain_trainer_runs():
        return [
            f"{key} = {path!r} is not loaded by torchtitan's own "
            "-m torchtitan.train with [checkpoint] enable = false (it would train from random weights); "
            "allowed: python -m grt_titan.train (loads it and saves nothing), or [checkpoint] enable = true"
        ]
    return []


def plain_trainer_fault_tolerance_problems(job_config) -> list[str]:
    """torchtitan's own trainer ignores `[fault_tolerance]`: refused there rather than a run
    that trains unprotected while its config says it is protected."""
    if not fault_tolerance_enabled(job_config):
        return []
    if plain_trainer_runs():
        return [
            "[fault_tolerance] enable = true is ignored by torchtitan's own -m torchtitan.train (it would train "
            "without torchft's quorum); allowed: python -m grt_titan.train, or [fault_tolerance] enable = false"
        ]
    return []
