"""Drop-in for `python -m torchtitan.train` (same CLI, torchtitan 0.2.2's main and train loop).

It runs torchtitan's Trainer as `GRTTrainer` (grt_titan/components/trainer.py), which adds
checksummed checkpoints, layout-independent data resume of old checkpoints and the
loss-spike rewind (docs/reliability.md). Without an accelerator it first switches
torchtitan to CPU/gloo (grt_titan/runtime/cpu_support.py), for tests, CI and laptops:

    torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file train_configs/grt_debug.toml
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

# torchrun exports TORCH_NCCL_ASYNC_ERROR_HANDLING=1 to every worker unless it is set;
# torchtitan then sets 3 (skip cleanup, for the flight recorder) and warns on every rank
# that it overrode a value that was set. The outcome is 3 either way; unsetting torchrun's
# default first keeps a warning the user cannot act on off the console. Any other value
# (the user's) is left to torchtitan and its warning.
_TORCHRUN_NCCL_DEFAULT = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")

# torchdata's StatefulDataLoader calls torch.set_vital, deprecated in torch 2.13: a warning
# per dataloader and rank about library code, nothing a user can change.
_LIBRARY_DEPRECATIONS = (r"'set_vital' is deprecated",)


def quiet_torchrun_defaults() -> None:
    """Keep warnings about defaults and library internals, not about the run, off the console."""
    name, torchrun_value = _TORCHRUN_NCCL_DEFAULT
    if os.environ.get(name) == torchrun_value:
        del os.environ[name]
    for message in _LIBRARY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


# Set to 1 to keep every rank's INFO logs (by default only rank 0 logs below WARNING).
LOG_ALL_RANKS_ENV = "GRT_LOG_ALL_RANKS"


def quiet_other_ranks() -> None:
    """Keep INFO logging on rank 0 only; other ranks log WARNING and above.

    torchrun hands every rank the same console, so each of torchtitan's INFO lines would
    print once per rank; rank 0's are the run's. Other ranks' warnings and errors still
    show. Call after torchtitan's `init_logger`, which sets the root logger and its stdout
    handler to INFO. `GRT_LOG_ALL_RANKS=1` leaves every rank at INFO.
    """
    if int(os.environ.get("RANK", "0")) == 0 or os.environ.get(LOG_ALL_RANKS_ENV, "0") not in ("", "0"):
        return
    root = logging.getLogger()  # torchtitan's `logger`
    root.setLevel(logging.WARNING)
    for handler in root.handlers:  # child loggers with their own INFO level propagate here
        handler.setLevel(max(handler.level, logging.WARNING))


def trainer_for(config, trainer_class: type | None = None) -> type:
    """GRTTrainer, or its fault-tolerant form when `[fault_tolerance] enable` is set
    (grt_titan/components/fault_tolerance.py); a given class must match the config."""
    from grt_titan.components.trainer import GRTTrainer
    from grt_titan.sections import fault_tolerance_enabled

    if not fault_tolerance_enabled(config):
        return trainer_class or GRTTrainer
    from grt_titan.components.fault_tolerance import GRTFaultTolerantTrainer

    if trainer_class is None:
        return GRTFaultTolerantTrainer
    if not issubclass(trainer_class, GRTFaultTolerantTrainer):
        raise ValueError(
            f"[fault_tolerance] enable = true, but the trainer {trainer_class.__name__} does not join torchft's "
            "quorum; allowed: a subclass of grt_titan.components.fault_tolerance.GRTFaultTolerantTrainer"
        )
    return trainer_class


def refuse_other_hosts() -> None:
    """This launcher runs torchtitan 0.2.2's main; on 0.3 it says, in one line, what to run."""
    from importlib.metadata import version

    installed = version("torchtitan")
    if not installed.startswith("0.2"):
        raise SystemExit(
            f"grt_titan.train is the launcher of torchtitan 0.2.2, and torchtitan {installed} is installed: "
            "run `torchrun ... -m torchtitan.train --module grt_titan --config <preset>` (docs/training.md)"
        )


def main(argv: list[str] | None = None, trainer_class: type | None = None) -> None:
    """torchtitan.train.main (0.2.2) with `GRTTrainer` (or a subclass) and the arguments
    `argv`, by default this process's command line as it is now. torchtitan's main parses
    `ConfigManager().parse_args()`, whose default `sys.argv[1:]` is bound when torchtitan is
    imported, so a process that imported it first (a launcher that forks jobs) could not
    pass a job its arguments; here they are passed explicitly. The rest is torchtitan's."""
    from grt_titan.runtime.cpu_support import enable_cpu_training

    refuse_other_hosts()
    quiet_torchrun_defaults()
    enable_cpu_training()
    import torch
    import torchtitan
    from torchtitan.tools.logging import init_logger, logger

    import grt_titan.spec  # noqa: F401  registers the `grt` train spec (the teacher's builder too)
    from grt_titan.job_config import GRTConfigManager

    init_logger()
    quiet_other_ranks()
    logger.info("torchtitan version: %s (0.0.0 means __version__ is not defined correctly).", torchtitan.__version__)
    config = GRTConfigManager().parse_args(sys.argv[1:] if argv is None else list(argv))
    trainer = None
    try:
        trainer = trainer_for(config, trainer_class)(config)
        if config.comm.mode == "local_tensor":  # torchtitan: the model is not initialised there
            logger.info("Local tensor mode enabled - skipping training execution")
            return
        if config.checkpoint.create_seed_checkpoint:
            assert int(os.environ["WORLD_SIZE"]) == 1, (
                "Must create seed checkpoint using a single device, to disable sharding."
            )
            assert config.checkpoint.enable, "Must enable checkpointing when creating a seed checkpoint."
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            trainer.train()
    except Exception:
        if trainer:
            trainer.close()
        raise
    else:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        logger.info("Process group destroyed")


if __name__ == "__main__":
    main()
