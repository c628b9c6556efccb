"""Source-Centered State Evolution (SCSE; Kim, Hayashi, Kamiya, Koyama, Iwasawa, Matsuo,
arXiv 2607.27656, eqs. 2-5 and its listing), as three parts of the one loop.

With e = h_pre, the prelude output (the paper has no prelude: there e is the embedding):

    h*    = e + anchor_scale * A e              the anchor, once per forward    (initial_state = "anchor")
    h_0   = e + initial_deviation_scale * B e   the initial state, Delta_0 = h_0 - h*
    for step in 1..r:
        Delta = h - h*                          the core's input                 (injection = "deviation")
        G     = core(Delta) - Delta             the core blocks' residual branches
        m_b   = 1{ ||Delta^(b)||_F^2 > eps }    per sequence b, over the call's tokens
        h     = h + m_b * s * G                 Delta <- Delta + m_b s G         (update = "deviation")

The state is kept in full coordinates, h = h* + Delta, so the readout (coda, norm, head),
per-step readouts, halting and the caches read h as for every other row. A and B are
bias-free Linear(d, d). The anchor is a one-step fixed point by construction: at Delta = 0
the mask is 0 and h stays h* bitwise. A zero-preserving core (llama blocks: RMSNorm and no
biases) also has G(0) = 0; GPT-2 blocks (biases, LayerNorm shifts) do not, and only the mask
holds their anchor (docs/methods.md). The steps read h* where the other rows read h_pre
(`Recurrence.start`), so the anchor is computed once, outside the compiled step.

The mask sums over the sequence positions of the call: in a cached decode step, the new
tokens'. It differs from the whole sequence's only for a sequence whose deviation is exactly
zero at some positions and not at others.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..blocks.init import trunc_normal_
from ..part import Bad, Part
from ..settings import setting

if TYPE_CHECKING:  # the args have this module's settings among their bases
    from ..args import GRTModelArgs


@dataclass
class SCSESettings:
    """SCSE's `[grt]` settings: a base class of `GRTModelArgs` (grt_titan/model/args.py)."""

    # h* = e + a A e, h_0 = e + b B e, Delta <- Delta + m s G(Delta).
    anchor_scale: float = setting(0.1, "SCSE: a, the anchor's scale in h* = e + a A e (default 0.1).", hf=True)
    initial_deviation_scale: float = setting(
        0.1,
        "SCSE: b, the initial state's scale in h_0 = e + b B e (default 0.1).",
        hf=True,
    )
    deviation_step_size: float = setting(
        0.5,
        "SCSE: s, the step's scale in Delta <- Delta + m s G(Delta) (default 0.5).",
        hf=True,
    )
    deviation_mask_eps: float = setting(
        1e-8,
        """SCSE: epsilon of the zero-deviation mask m = 1{||Delta||_F^2 > epsilon}, per sequence
        (default 1e-8).""",
        hf=True,
    )


SCSE_CHOICES = {"injection": "deviation", "update": "deviation", "initial_state": "anchor"}
# SCSE's own settings, set only with its parts.
SCSE_FIELDS = tuple(f.name for f in dataclasses.fields(SCSESettings))


class SourceAnchor(nn.Module):
    """The anchor h* = e + a A e and the initial state h_0 = e + b B e (A, B: Linear(d, d))."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.anchor_proj = nn.Linear(args.dim, args.dim, bias=False)
        self.init_delta_proj = nn.Linear(args.dim, args.dim, bias=False)
        self.anchor_scale = args.anchor_scale
        self.initial_deviation_scale = args.initial_deviation_scale

    def forward(self, h_pre: torch.Tensor) -> torch.Tensor:
        """The anchor h*."""
        return h_pre + self.anchor_scale * self.anchor_proj(h_pre)

    def initial_state(self, h_pre: torch.Tensor) -> torch.Tensor:
        """h_0."""
        return h_pre + self.initial_deviation_scale * self.init_delta_proj(h_pre)

    def init_weights(self) -> None:
        trunc_normal_(self.anchor_proj.weight, std=0.02)
        trunc_normal_(self.init_delta_proj.weight, std=0.02)


def deviation_step(h, delta, proposal, step_size: float, mask_eps: float) -> torch.Tensor:
    """h + m_b s (proposal - Delta), m_b = 1{||Delta^(b)||_F^2 > eps} per sequence b."""
    wide = delta.to(torch.promote_types(delta.dtype, torch.float32))  # bf16 sums in fp32
    energy = wide.pow(2).sum(dim=tuple(range(1, delta.dim())), keepdim=True)
    mask = (energy > mask_eps).to(h.dtype)
    return h + mask * (step_size * (proposal - delta))


class DeviationStep(nn.Module):
    """The update slot's module: `deviation_step` with the args' s and eps (no parameters)."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.step_size = args.deviation_step_size
        self.mask_eps = args.deviation_mask_eps

    def forward(self, h: torch.Tensor, delta: torch.Tensor, proposal: torch.Tensor) -> torch.Tensor:
        return deviation_step(h, delta, proposal, self.step_size, self.mask_eps)

    def init_weights(self) -> None:
        """Nothing to initialise (no parameters)."""


def _check_together(args: GRTModelArgs, bad: Bad) -> None:
    """The three SCSE choices go together, and its fields are set only with them."""
    chosen = {key: getattr(args, key) == choice for key, choice in SCSE_CHOICES.items()}
    if any(chosen.values()) and not all(chosen.values()):
        key = next(key for key, on in chosen.items() if not on)
        together = ", ".join(f"{k} = {v!r}" for k, v in SCSE_CHOICES.items())
        raise bad(key, getattr(args, key), f"SCSE's parts go together: {together}")
    if not any(chosen.values()):
        defaults = SCSESettings()
        for name in SCSE_FIELDS:
            if getattr(args, name) != getattr(defaults, name):
                raise bad(
                    name,
                    getattr(args, name),
                    "it is an SCSE setting and needs update = 'deviation' (with injection = 'deviation', initial_state = 'anchor')",
                )


class DeviationInjection(Part):
    """injection = "deviation": the core reads Delta = h - h* (SCSE; no W_proj)."""

    key, choice = "injection", "deviation"

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        _check_together(args, bad)

    def core_input(self, step: nn.Module, state: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return state - source  # the steps' source is the anchor h*

    def describe(self, args: GRTModelArgs) -> str:
        return "each step's input is the deviation from the anchor, Delta = h - h* (SCSE)"


class DeviationUpdate(Part):
    """update = "deviation": h <- h + m_b s (core(Delta) - Delta) (SCSE)."""

    key, choice, module_name = "update", "deviation", "deviation"

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.deviation_step_size <= 0:
            raise bad("deviation_step_size", args.deviation_step_size, "must be > 0")
        if args.deviation_mask_eps < 0:
            raise bad("deviation_mask_eps", args.deviation_mask_eps, "must be >= 0")
        if args.update == self.choice and args.router != "none":
            raise bad("router", args.router, "cannot be combined with update = 'deviation' (one method per run)")

    def build(self, args: GRTModelArgs) -> DeviationStep:
        return DeviationStep(args)

    def update(self, step, state, source, core_input, proposal, gate_noise):
        return step.deviation(state, core_input, proposal), None

    def describe(self, args: GRTModelArgs) -> str:
        return (
            f"each step writes h <- h + m s (core(Delta) - Delta) with s = {args.deviation_step_size:g} and m = 0 "
            f"for a sequence whose deviation is zero (||Delta||^2 <= {args.deviation_mask_eps:g}): the anchor "
            "is a fixed point (SCSE)"
        )


class AnchorInitialState(Part):
    """initial_state = "anchor": h* = e + a A e and h_0 = e + b B e (SCSE)."""

    key, choice, module_name = "initial_state", "anchor", "anchor"

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        for name in ("anchor_scale", "initial_deviation_scale"):
            if getattr(args, name) < 0:
                raise bad(name, getattr(args, name), "must be >= 0")

    def build(self, args: GRTModelArgs) -> SourceAnchor:
        return SourceAnchor(args)

    def initial_state(self, loop: nn.Module, h_pre: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return loop.anchor.initial_state(h_pre)

    def source(self, loop: nn.Module, h_pre: torch.Tensor) -> torch.Tensor:
        return loop.anchor(h_pre)

    def describe(self, args: GRTModelArgs) -> str:
        return (
            f"anchor h* = e + {args.anchor_scale:g} A e and initial state h_0 = e + "
            f"{args.initial_deviation_scale:g} B e from the prelude output e (SCSE)"
        )

    def extra_flops(self, args: GRTModelArgs, seq_len: int, depth: float, training: bool) -> float:
        """A and B once per forward: 2 d^2 FLOPs each per token."""
        return 4.0 * args.dim * args.dim


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    DeviationInjection(),  # injection = "deviation"
    DeviationUpdate(),  # update = "deviation"
    AnchorInitialState(),  # initial_state = "anchor"
)
SETTINGS = SCSESettings
