"""What a part of the recurrence is to the rest of the package: its rules, its start-up
problems and its FLOPs term, written beside its math in its own module (docs/methods.md).

A part is one choice of one `[grt]` key (`Part.key` = `Part.choice`): W_proj (injection =
"proj"), the gate (update = "gate"), the random initial state, each depth law, RRT's adapters,
Ouro's exit distribution, MoR's two routers. Its module subclasses `Part` and overrides only
what the part has; grt_titan/model/parts.py lists every part in one table, which
`GRTModelArgs.validate`, the start-up checks (grt_titan/config_checks.py) and the FLOP count
(grt_titan/model/flops.py) iterate over, and which the recurrence asks for the module of
each of its slots (`build_module`). Choices without a part (injection = "none", update =
"overwrite", ...) are the plain loop: no module, no rule, no cost.

And what a part's training readout returns (`TrainingOutput`).

A leaf (no grt_titan import): `GRTModelArgs` reads the table as `GRTModelArgs.parts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

# bad(field, value, allowed) -> the ValueError that names the field (GRTModelArgs.validate).
Bad = Callable[[str, Any, str], ValueError]


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


def build_module(args, key: str) -> Any:
    """The module of the active part of `key` (the recurrence's slots), None if it has none."""
    part = args.part(key)
    return None if part is None else part.build(args)
