"""GRT model math (single device). Parallel plans live in grt_titan/infra/."""

from .args import GRTModelArgs
from .flavors import grt_flavors
from .model import GRTModel
from .part_table import PARTS
from .recurrence import DepthSampler, Gate, Recurrence, RecurrenceOutput, RecurrenceStep

# The table of parts, handed to the args here: they validate with it and name the active
# parts, and cannot import it themselves (it lists the GRT's own parts, recurrence.py's, whose
# module imports the args).
GRTModelArgs.parts = PARTS

__all__ = [
    "DepthSampler",
    "Gate",
    "GRTModel",
    "GRTModelArgs",
    "PARTS",
    "Recurrence",
    "RecurrenceOutput",
    "RecurrenceStep",
    "grt_flavors",
]
