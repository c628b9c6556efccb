"""What torchtitan 0.3 needs of its host, checked in one line, and its CPU/gloo switch."""

from __future__ import annotations

import sys
from importlib import metadata

# torchtitan 0.3.0 needs Python >= 3.11 (its wheel's metadata) and, in practice, torch >= 2.14:
# on 2.13 its FSDP fails ("When dp_mesh_dims is provided, all parameters must be DTensors").
MIN_PYTHON = (3, 11)
MIN_TORCH = (2, 14)
HOST_SERIES = (0, 3)


class HostError(RuntimeError):
    """A torchtitan, torch or Python that this adapter cannot run on (not an ImportError:
    torchtitan 0.3's `--module` resolution swallows those and names another cause)."""


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def host_problem(python: tuple[int, int], torch_version: str, torchtitan_version: str) -> str | None:
    """The one line that says why these versions cannot run grt_titan on torchtitan 0.3."""
    if _release(torchtitan_version) != HOST_SERIES:
        return (
            f"grt_titan.config_registry is the torchtitan 0.3 adapter, but torchtitan {torchtitan_version} "
            "is installed; on 0.2.2 run `-m torchtitan.train --job.config_file train_configs/<preset>.toml`"
        )
    if python < MIN_PYTHON:
        return f"torchtitan 0.3 needs Python >= 3.11; this is Python {python[0]}.{python[1]}"
    if _release(torch_version) < MIN_TORCH:
        return f"torchtitan 0.3 needs torch >= 2.14 (its FSDP fails on older torch); this is torch {torch_version}"
    return None


def check_host() -> None:
    """Raise HostError naming the first version that does not fit."""
    import torch

    problem = host_problem(sys.version_info[:2], torch.__version__, metadata.version("torchtitan"))
    if problem is not None:
        raise HostError(problem)


def enable_cpu_training() -> None:
    """Point torchtitan 0.3 at CPU/gloo where no accelerator exists (a no-op elsewhere).

    0.3 keeps 0.2.2's device globals and memory monitor, so grt_titan/runtime/cpu_support.py's switch
    serves it unchanged; applied when the config module is imported, so plain
    `-m torchtitan.train --module grt_titan` trains on CPU with no launcher of ours. The
    other two things 0.3 needs on CPU are ours already: the GRT's blocks use SDPA, never
    FlexAttention (no backward on CPU), and our FSDP reduces by SUM on gloo (model.py)."""
    from grt_titan.runtime.cpu_support import enable_cpu_training as switch

    switch()
