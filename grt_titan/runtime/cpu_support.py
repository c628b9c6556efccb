"""The CPU-support shim: run torchtitan 0.2.2's own Trainer on a CPU-only machine.

Why it exists: torchtitan 0.2.2 fixes its device type when `torchtitan.tools.utils` is
first imported (`_get_available_device_type() or "cuda"`), and several modules copy that
value with `from ... import device_type, device_module`. On a machine without an
accelerator the trainer would then call `torch.cuda`. `custom_import` runs too late to
change it, so `grt_titan.train` calls `enable_cpu_training()` before the trainer starts.

What it changes, only in torchtitan's modules and only when no accelerator exists:
- `device_type` -> "cpu" and `device_module` -> a view of `torch.cpu` whose
  `current_device()` returns the index 0 (torch.cpu returns the string "cpu", which
  `barrier(device_ids=[...])` in `set_pg_timeouts` rejects);
- `build_device_memory_monitor` -> a monitor reporting this process's peak RSS
  (torch.cpu has no memory_stats / get_device_properties);
- `get_peak_flops` -> NaN for the CPU "device": torchtitan would look for a GPU with
  lspci and fall back to an A100's peak, warning twice per rank (MFU on CPU is reported
  as not applicable by the spec's metrics processor);
- torch's warnings about what a CPU mesh lacks (`CPU_MESH_WARNINGS`), printed by every rank
  and not actionable; docs/training.md states those limits once.
It can be removed once torchtitan selects the device at run time.
"""

from __future__ import annotations

import resource
import sys
import types
import warnings

import torch

_ENABLED = False

# torch warnings a CPU/gloo run meets on every rank; what they mean is in docs/training.md
# ("CPU support"): DTensor's RNG is not offset-tracked on a CPU mesh (sharded random init
# repeats per shard: parity runs start from a seed checkpoint), and torchtitan's
# `set_pg_timeouts` cannot change the timeout of mesh groups that have no gloo backend yet.
CPU_MESH_WARNINGS = (
    r"DTensor random operators may not have complete support on cpu device mesh",
    r"DTensor manual_seed\(\) may not have complete support on cpu device mesh",
    r"Set timeout is now only supported for either nccl or gloo",
)


def accelerator_available() -> bool:
    return torch.accelerator.is_available()


class _CpuDeviceModule(types.SimpleNamespace):
    """`torch.cpu` with an integer `current_device()`, as torchtitan expects of a device module."""

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device) -> None:
        return None


class RssMemoryMonitor:
    """torchtitan's DeviceMemoryMonitor interface, backed by the process's peak RSS."""

    def __init__(self) -> None:
        import os

        self.device_name = "cpu"
        self.device_capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.device_capacity_gib = self.device_capacity / 2**30

    def _peak_bytes(self) -> int:
        # ru_maxrss is in KiB on Linux.
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def get_peak_stats(self):
        from torchtitan.components.metrics import DeviceMemStats

        peak_gib = self._peak_bytes() / 2**30
        pct = 100 * self._peak_bytes() / self.device_capacity
        return DeviceMemStats(peak_gib, pct, peak_gib, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        return None  # peak RSS cannot be reset; it is the high-water mark of the run


def _cpu_peak_flops(get_peak_flops):
    def peak_flops(device_name: str) -> float:
        return float("nan") if device_name == "cpu" else get_peak_flops(device_name)

    return peak_flops


def enable_cpu_training() -> None:
    """Point torchtitan at CPU/gloo. A no-op where an accelerator exists."""
    global _ENABLED
    if _ENABLED or accelerator_available():
        return
    import torchtitan.components.metrics as metrics
    import torchtitan.tools.utils as tt_utils

    cpu_module = _CpuDeviceModule()
    old_type, old_module = tt_utils.device_type, tt_utils.device_module
    # Rebind the copies made by `from torchtitan.tools.utils import device_type, ...`.
    for name, module in list(sys.modules.items()):
        if not name.startswith("torchtitan") or module is None:
            continue
        names = vars(module)
        if names.get("device_type") == old_type:
            module.device_type = "cpu"
        if names.get("device_module") is old_module:
            module.device_module = cpu_module
    metrics.build_device_memory_monitor = RssMemoryMonitor
    tt_utils.get_peak_flops = _cpu_peak_flops(tt_utils.get_peak_flops)
    for message in CPU_MESH_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    _ENABLED = True
