"""The table of parts: every `Part` of the recurrence (grt_titan/model/part.py), each written
in its method module beside its math, in the order their rules are checked (docs/methods.md).

`GRTModelArgs.validate`, the start-up checks and the FLOP count iterate over this table, and
the recurrence fills each of its slots from it (grt_titan/model/part.py, `SLOTS`);
grt_titan/model/methods/table.py names the rows of the paper that choices of these parts make.
grt_titan/model/__init__.py hands it to the args (`GRTModelArgs.parts`), which cannot import it:
it lists recurrence.py's parts, and recurrence.py imports the args.
"""

from __future__ import annotations

from .depth_law import LAWS
from .methods import MODULES
from .part import Part
from .recurrence import GateUpdate, ProjInjection

PARTS: tuple[Part, ...] = (
    ProjInjection(),  # injection = "proj": W_proj (GRT, Poisson)
    GateUpdate(),  # update = "gate": the gate (GRT)
    *LAWS,  # depth_sampling: uniform (GRT), fixed
    *(part for module in MODULES for part in module.PARTS),  # each method's (grt_titan/model/methods/)
)
