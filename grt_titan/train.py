"""Drop-in for `python -m torchtitan.train` (same CLI, torchtitan's own main and train loop).

It runs torchtitan's Trainer as `GRTTrainer` (grt_titan/components/trainer.py), which adds
checksummed checkpoints, layout-independent data resume of old checkpoints and the
loss-spike rewind (docs/reliability.md). Without an accelerator it first switches
torchtitan to CPU/gloo (grt_titan/cpu_support.py), for tests, CI and laptops:

    torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file train_configs/grt_debug.toml
"""

from __future__ import annotations

import os
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


def main() -> None:
    from grt_titan.cpu_support import enable_cpu_training

    quiet_torchrun_defaults()
    enable_cpu_training()
    import grt_titan  # noqa: F401  registers the `grt` train spec
    from torchtitan.train import main as torchtitan_main

    from grt_titan.components.trainer import GRTTrainer

    torchtitan_main(GRTTrainer)


if __name__ == "__main__":
    main()
