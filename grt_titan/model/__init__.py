"""GRT model math (single device). Parallel plans live in grt_titan/infra/."""

from .args import GRTModelArgs
from .flavors import grt_flavors
from .model import GRTModel
from .parts import PARTS  # installs the table of parts as GRTModelArgs.parts
from .recurrence import DepthSampler, Gate, Recurrence, RecurrenceOutput, RecurrenceStep

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
