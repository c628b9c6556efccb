"""Per-step supervision (`[grt] step_supervision = true`): every recurrence step is read out
in training and trained toward the record's target for that step (docs/tasks.md).

A multi-step task's record lists its intermediate results (`steps`: f(x), f(f(x)), ...), and
prepare writes one target stream per step (grt_titan/data/records.py). At training depth r,

    loss = (1 / r) sum_{t=1..r} sum_tokens CE(readout(h_t), target_t)

where readout is the coda, the final norm and the LM head (`GRTModel.logits_from_state`),
target_t the record's step-t target for t up to its depth, and the final answer after it,
so a state that has arrived learns to stay. Tokens outside the completion have no target at
any step. This is the intermediate-step supervision of the recurrent retrofit (arXiv
2608.11233: loop t learns f^t(x)); Ouro's per-step readouts (methods/ouro.py) weigh
one target by a learned exit distribution instead. Evaluation is the plain final readout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..blocks.rows import at_rows
from ..flops import readout_flops_per_token
from ..part import IGNORE_INDEX, Bad, Part, TrainingOutput
from ..settings import setting

if TYPE_CHECKING:  # the args have this module's settings among their bases
    from ..args import GRTModelArgs


@dataclass
class StepSupervisionSettings:
    """Per-step supervision's `[grt]` settings besides its key: a base class of `GRTModelArgs`
    (grt_titan/model/args.py)."""

    step_supervision_steps: int = setting(
        0,
        """With step_supervision: per-step supervision for the first N optimizer steps, then the
        final answer alone for the rest of the run (the outcome-only annealing of arXiv 2608.11233);
        0 (default): per-step supervision throughout (docs/tasks.md).""",
    )


def step_supervised_readout(model: nn.Module, states: list[torch.Tensor], step_labels: torch.Tensor | None):
    """The `TrainingOutput` of a training forward of `model` (a GRTModel) whose steps left
    `states` h_1..h_r: every step's logits [r, B, S, V], equal weights 1/r, and the batch's
    step targets [B, S, K] (grt_titan/components/loss.py pairs step t with column t - 1).

    Only the positions with a target are scored, so only there do the coda's last attention
    queries and feed-forward, the norm and the head run (`scored_rows`, blocks/rows.py); the
    logits elsewhere are zeros, never scored."""
    steps = len(states)
    batch = states[0].shape[0]
    # One [r * B, S, d] batch through coda, norm and head, as Ouro's readout does.
    flat = torch.cat(states, dim=0)
    rows = scored_rows(step_labels, states[0], steps)
    if rows is None:
        logits = model.logits_from_state(flat)
    else:
        # The batch's size follows r: a compiled coda block traces it symbolic from its first
        # call, not once per r (as `at_rows` marks the rows' sizes).
        torch._dynamo.maybe_mark_dynamic(flat, 0)
        scored = model.logits_from_state(flat, at_rows(rows, *flat.shape[:2]))
        logits = scored.new_zeros(flat.shape[0] * flat.shape[1], scored.shape[-1]).index_copy(0, rows, scored)
        logits = logits.unflatten(0, flat.shape[:2])
    # The step logits and the last step's are tensors of their own, not views of that batch: FSDP
    # warns of a module that returns views (an in-place op on one would skip its backward hook).
    step_logits = logits.unflatten(0, (steps, batch)).clone()
    weights = torch.full(step_logits.shape[:3], 1.0 / steps, device=step_logits.device)
    return TrainingOutput(
        step_logits[-1].clone(), step_logits=step_logits, step_weights=weights, step_labels=step_labels
    )


def scored_rows(step_labels: torch.Tensor | None, state: torch.Tensor, steps: int) -> torch.Tensor | None:
    """Flat indices into the [steps * B * S] positions of the concatenated states at which some
    step has a target (the loader's step labels are ignored exactly where the labels are), or
    None where the readout runs on every position: no step labels, or a state that is not the
    whole batch (tensor parallel: a DTensor, known by its `full_tensor`, as methods/ouro.py
    does without importing torch.distributed; or this rank's slice of the sequence)."""
    if step_labels is None or hasattr(state, "full_tensor") or state.shape[:2] != step_labels.shape[:2]:
        return None
    rows = (step_labels != IGNORE_INDEX).any(-1).flatten().nonzero().squeeze(1)
    positions = step_labels.shape[0] * step_labels.shape[1]
    return (rows + positions * torch.arange(steps, device=rows.device)[:, None]).flatten()


class StepSupervision(Part):
    """step_supervision = true: every step read out in training toward its own target."""

    key, choice = "step_supervision", True

    def validate(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.step_supervision and not args.is_recurrent:
            raise bad(
                "step_supervision", True, "needs a recurrent flavor (n_core_layers >= 1); allowed for dense: false"
            )
        super().validate(args, bad)

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.step_supervision_steps < 0:
            raise bad("step_supervision_steps", args.step_supervision_steps, "must be >= 0 (0: the whole run)")
        if not args.step_supervision:
            if args.step_supervision_steps:
                raise bad(
                    "step_supervision_steps",
                    args.step_supervision_steps,
                    "needs step_supervision = true (it ends per-step supervision after that many steps)",
                )
            return
        for key, plain in (("objective", "final"), ("router", "none")):
            if getattr(args, key) != plain:
                raise bad(
                    "step_supervision",
                    True,
                    f"cannot be combined with {key} = {getattr(args, key)!r} (its own per-step loss); "
                    f"allowed: {key} = {plain!r}, or step_supervision = false",
                )

    def extra_flops(self, args: GRTModelArgs, seq_len: int, depth: float, training: bool) -> float:
        """Training reads steps 1..r-1 out as well: (r - 1) x (coda + LM head). Eval: none."""
        return max(depth - 1, 0) * readout_flops_per_token(args, seq_len) if training else 0.0


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    StepSupervision(),  # step_supervision = true
)
SETTINGS = StepSupervisionSettings
