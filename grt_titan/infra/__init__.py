"""Parallel plans of the GRT (TP, AC, compile, FSDP/HSDP, DDP)."""

from .parallelize import parallelize_grt

__all__ = ["parallelize_grt"]
