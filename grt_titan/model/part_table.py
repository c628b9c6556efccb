"""The table of parts: every `Part` of the recurrence (grt_titan/model/part.py), each written
in its method module beside its math, in the order their rules are checked (docs/methods.md).

`GRTModelArgs.validate`, the start-up checks and the FLOP count iterate over this table, and
the recurrence fills each of its slots from it (grt_titan/model/part.py, `SLOTS`);
grt_titan/model/methods/table.py names the rows of the paper that choices of these parts make.
grt_titan/model/__init__.py hands it to the args (`GRTModelArgs.parts`), which are a leaf and
cannot import the method modules.
"""

from __future__ import annotations

from .depth_law import LAWS
from .methods.mor import ExpertChoice
from .methods.mor_token_choice import TokenChoice
from .methods.ouro import ExitDistribution
from .methods.poisson import HeavyTailPoisson, RandomInitialState
from .methods.rrt import LoraAdapters
from .methods.scse import AnchorInitialState, DeviationInjection, DeviationUpdate
from .methods.step_supervision import StepSupervision
from .part import Part
from .recurrence import GateUpdate, ProjInjection

PARTS: tuple[Part, ...] = (
    ProjInjection(),  # injection = "proj": W_proj (GRT, Poisson)
    GateUpdate(),  # update = "gate": the gate (GRT)
    RandomInitialState(),  # initial_state = "random" (heavy-tail Poisson)
    DeviationInjection(),  # injection = "deviation" (SCSE)
    DeviationUpdate(),  # update = "deviation" (SCSE)
    AnchorInitialState(),  # initial_state = "anchor" (SCSE)
    *LAWS,  # depth_sampling: uniform (GRT), fixed
    HeavyTailPoisson(),  # depth_sampling = "poisson_lognormal" (heavy-tail Poisson)
    LoraAdapters(),  # step_adapter = "lora" (RRT)
    ExitDistribution(),  # objective = "exit_distribution" (Ouro)
    StepSupervision(),  # step_supervision = true (per-step targets)
    ExpertChoice(),  # router = "expert_choice" (MoR)
    TokenChoice(),  # router = "token_choice" (MoR, token choice)
)
