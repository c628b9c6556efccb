"""torchtitan 0.3's entry to grt_titan: `--module grt_titan --config NAME`.

    torchrun --nproc_per_node=2 -m torchtitan.train --module grt_titan --config grt_debug

NAME is a preset of train_configs/: `grt_debug`, `grt_large`, `dense_large`, ... (a file's
name without `.toml`), the paper suite's rows as `paper_<row>` (train_configs/paper/<row>.toml).
Each function builds grt_titan's `Trainer.Config` from that TOML, the file torchtitan 0.2.2
reads, so one recipe per scale serves both hosts (grt_titan/torchtitan_0_3/recipe.py).
Importing this module checks the host's versions and points torchtitan at CPU/gloo where no
accelerator exists.
"""

from __future__ import annotations

from grt_titan.torchtitan_0_3.host import check_host, enable_cpu_training
from grt_titan.torchtitan_0_3.presets import presets, unknown_preset

check_host()
enable_cpu_training()


def preset(name: str):
    """The `GRTTrainer.Config` of the preset `name`."""
    from grt_titan.torchtitan_0_3.recipe import trainer_config

    known = presets()
    if name not in known:
        raise ValueError(unknown_preset(name))
    return trainer_config(known[name])


def __getattr__(name: str):
    """torchtitan looks `--config NAME` up as an attribute of this module."""
    if name.startswith("_") or name not in presets():
        raise AttributeError(name)
    return lambda: preset(name)


def __dir__() -> list[str]:
    return sorted([*globals(), *presets()])
