"""What a part of the recurrence is to the rest of the package: its rules, its start-up
problems, its FLOPs term and what it does in its slot of the loop, written beside its math in
its own module (docs/methods.md).

A part is one choice of one `[grt]` key (`Part.key` = `Part.choice`): W_proj (injection =
"proj"), the gate (update = "gate"), each depth law, and the comparison methods' parts in
grt_titan/model/methods/. Its module subclasses `Part` and overrides only what the part has;
grt_titan/model/part_table.py lists every part in one table, which `GRTModelArgs.validate`, the
start-up checks (grt_titan/config_checks.py) and the FLOP count (grt_titan/model/flops.py)
iterate over.

The recurrence (grt_titan/model/recurrence.py) has slots, each filled by the part of one key
(`SLOTS`), and calls each slot's hooks: `core_input` (the injection), `update`, `step_adapters`,
`initial_state` and `source`, `build_step` and `run_steps` (the order of the steps). The base
`Part` is the plain loop's choice of every key (`PLAIN`: injection "none", update "overwrite",
initial_state "prelude", no adapters, every token through every step): no module, no rule, no
cost. A part with a module names it (`module_name`): the owner holds it under that name, which
is its checkpoint keys (recurrence.step.proj.*, recurrence.anchor.*).

And what a part's training readout returns (`TrainingOutput`).

A leaf (no grt_titan import): `GRTModelArgs` reads the table as `GRTModelArgs.parts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import torch

if TYPE_CHECKING:
    from torch import nn

# bad(field, value, allowed) -> the ValueError that names the field (GRTModelArgs.validate).
Bad = Callable[[str, Any, str], ValueError]


IGNORE_INDEX = -100  # torchtitan's (both hosts) and torch's default: a label that is not scored


# What a training forward returns when the method's loss is more than CE on the final logits.
# GRT, dense and most baselines return plain logits. A method with per-step supervision (Ouro's
# exit distribution, per-step targets) or an auxiliary loss (MoR's router) returns a
# `TrainingOutput` in training mode; grt_titan.components.loss turns it into the training loss.
# Eval-mode forwards always return plain logits, so torchtitan's validator, generation and the HF
# export see one type.
class TrainingOutput(NamedTuple):
    """A NamedTuple, so FSDP and torch.compile see its tensors (pytree-flattened).

    Loss = sum_t sum_tokens step_weights[t] * CE(step_logits[t], target_t) + aux_loss_sum, or,
    without step_logits, sum_tokens CE(logits) + aux_loss_sum. target_t is the batch's labels,
    or with step_labels (per-step supervision) their column t - 1 while there is one. Every term is a SUM over tokens, as
    torchtitan's cross-entropy is: the trainer divides by the global token count.
    """

    # Per-step supervision reads out the scored positions alone: zeros elsewhere, in both.
    logits: torch.Tensor  # [B, S, V] the readout an eval forward would return
    step_logits: torch.Tensor | None = None  # [T, B, S, V] one readout per recurrence step
    step_weights: torch.Tensor | None = None  # [T, B, S] weight of each step's loss per token
    aux_loss_sum: torch.Tensor | None = None  # scalar, already summed over tokens
    step_labels: torch.Tensor | None = None  # [B, S, K] step t's target in column t - 1 (the batch's)


@dataclass(frozen=True)
class JobSettings:
    """What the parts' start-up rules read of a job config, as plain values: no method module
    reads torchtitan's JobConfig (grt_titan/config_checks.py builds this from it)."""

    tensor_parallel_degree: int
    compiled: bool  # [compile] enable, with "model" among its components
    validation: bool  # [validation] enable
    seq_lens: dict[str, int]  # "training" -> its seq_len, and "validation" when enabled


class Part:
    """One choice of one `[grt]` key; the base is a part with no module, rule or cost."""

    key: str = ""  # the GRTModelArgs field that selects the part
    choice: Any = None  # the value of that field that does
    per_step: bool = False  # holds a module per step up to R: no depth above R (GRTModelArgs.extrapolates)
    per_step_what: str = ""  # what it holds per step, for the messages ("adapter")
    reads_every_step: bool = False  # every step is read out through coda, norm and head (Ouro)
    float8_skip: tuple[str, ...] = ()  # names (prefixes) of its linears that float8 leaves alone

    def active(self, args) -> bool:
        """The recurrent `args` select this part (a dense model has none)."""
        return args.is_recurrent and getattr(args, self.key) == self.choice

    def validate(self, args, bad: Bad) -> None:
        """Raise `bad(...)` for the first problem of the part's fields in `args`, whether the
        part is active or not (a field of an unselected part that is set is one). A dense
        model's parts are not checked."""
        if args.is_recurrent:
            self.check(args, bad)

    def check(self, args, bad: Bad) -> None:
        """The part's rules on a recurrent model (`validate`)."""

    def job_problems(self, job: JobSettings, args) -> list[str]:
        """What the active part cannot run with, one message per problem naming the TOML key
        and what is allowed."""
        return []

    def build(self, args) -> Any:
        """The module of the active part (an nn.Module), None for a part without one."""
        return None

    # ---- Its slot in the loop (grt_titan/model/recurrence.py); the base is the plain loop ----

    module_name: str | None = None  # the owner's attribute that holds `build`'s module

    def attach(self, owner: "nn.Module", args) -> None:
        """Build the part's module into `owner` (the step or the loop) under `module_name`."""
        module = self.build(args)
        if module is not None:
            owner.add_module(self.module_name, module)

    def init_weights(self, owner: "nn.Module") -> None:
        """Initialise the module `attach` gave `owner` (its own `init_weights`)."""
        if self.module_name is not None:
            getattr(owner, self.module_name).init_weights()

    def core_input(self, step: "nn.Module", state: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """injection: the core's input from the (noisy) state and the source (eq. 2)."""
        return state

    def update(
        self,
        step: "nn.Module",
        state: torch.Tensor,
        source: torch.Tensor,
        core_input: torch.Tensor,
        proposal: torch.Tensor,
        gate_noise: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """update: (the new state, the gate g or None) from the core's output (eq. 4)."""
        return proposal, None

    def step_adapters(self, step: "nn.Module", step_index: torch.Tensor | None) -> Any:
        """step_adapter: the changes to the core's weights at step `step_index` (None: none)."""
        return None

    def initial_state(self, loop: "nn.Module", h_pre: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """initial_state: h_0. A distinct tensor, not h_pre itself: a compiled step guards on
        its inputs aliasing, and step 1 would otherwise compile a second graph."""
        return h_pre.clone()

    def source(self, loop: "nn.Module", h_pre: torch.Tensor) -> torch.Tensor:
        """initial_state: what the steps read where the equations say h_pre."""
        return h_pre

    # The order of the steps: every token through each step (the plain loop), or a part that
    # runs the steps itself on the tokens it picks.
    runs_steps: bool = False

    def build_step(self, args) -> "nn.Module | None":
        """The step module of a part that runs the steps (None: the plain `RecurrenceStep`)."""
        return None

    def run_steps(self, loop: "nn.Module", h: torch.Tensor, freqs_cis, depth: int, grad_from: int, observer):
        """(h_r, the auxiliary loss or None) of `depth` steps run by the part (`runs_steps`)."""
        raise NotImplementedError(f"{type(self).__name__} does not run the steps")

    def step_params(self, args) -> int:
        """Matmul weights one recurrence step applies besides the core's blocks (eq. 1 counts
        2 FLOPs per weight and token)."""
        return 0

    def routed_step_flops(self, args, seq_len: int, depth: int) -> list[float] | None:
        """Forward FLOPs per token of each of the `depth` steps when the part routes the steps
        (they replace the plain steps of eq. 1); None for a part that does not."""
        return None

    def extra_flops(self, args, seq_len: int, depth: float, training: bool) -> float:
        """Forward FLOPs per token the part adds once per forward at depth r."""
        return 0.0

    def describe(self, args) -> str:
        """What the active part does in `args`, one Markdown phrase for the exported model's
        card (grt_titan/hf/model_card.py); empty for a part the layout line already says."""
        return ""


def tensor_parallel_problems(job: JobSettings, message: str) -> list[str]:
    """`message` with `{tp}` the degree, for a part that cannot run tensor parallel, when the
    job is (degree > 1); else no problem."""
    tp = job.tensor_parallel_degree
    return [message.format(tp=tp)] if tp > 1 else []


# The plain loop's part of every key: what a slot holds when no part of the table is active.
PLAIN = Part()

# The slots of the loop and the `[grt]` key whose part fills each; the recurrence asks for
# slots, not keys, so it names no method.
SLOTS = {
    "injection": "injection",  # the core's input from h and the source (eq. 2)
    "update": "update",  # the new state from h and the core's output (eq. 4)
    "adapters": "step_adapter",  # per-step changes to the core's weights
    "start": "initial_state",  # h_0 and the source the steps read
    "order": "router",  # which tokens each step updates
    "readout": "objective",  # how the steps are read out in training
}


def slot(args, name: str) -> Part:
    """The part that fills slot `name` (`SLOTS`) in `args`: the active part of its key, else PLAIN."""
    return args.part(SLOTS[name]) or PLAIN
