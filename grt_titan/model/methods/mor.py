"""Mixture-of-Recursions (Bae et al. 2025, arXiv 2507.10524): expert-choice routing of the
recurrence steps (`router = "expert_choice"`, docs/mor.md "Expert choice").

    for step i in 0..r-1:                         candidates: the tokens step i-1 kept (all at i = 0)
        logit = w_i . h[candidates]               one bias-free Linear(d, 1) per step
        keep  = top-k_i of logit, in causal order k_i = max(1, int(capacity_i * S))
        g     = sigmoid(logit[keep]) * alpha      alpha = router_scale (0.1)
        o     = core(h[keep])                     the shared core, causal attention among `keep`
        h[keep] <- h[keep] + g * (o - h[keep])    router_update = "delta": the block delta, added once
        h[keep] <- h[keep] + g * o                router_update = "block": the released code's update
    aux = router_aux_weight * sum_i BCE(logit, 1[keep]), each step's mean over its candidates

The released code adds `g * Block(x)` to `x`, and its `Block` already holds the residual, so a
selected token's state becomes (1 + g) h + g f(h): `router_update = "block"`, what the MoR rows
of train_configs/paper/ train. `"delta"` (the default, every run before the option) adds the
block delta once, the paper's H + g f(H) (docs/mor.md says why the rows use "block").
Top-k over the sequence is not causal (a token's selection depends on later tokens). In eval
mode `router_inference = "threshold"` replaces it by MoR's causal rule (the paper's BCE-trained
router predicts the top-k selection): a token goes on to step i if it was active at step i-1 and
sigmoid(logit_i) > 0.5 (logit_i > 0); the update and the attention among the step's active
tokens are the same. The number of active tokens then differs per row: that path runs one row
at a time, in eager mode (`_threshold_forward`). Training always uses top-k.

Every k_i is fixed by the capacities and the sequence length (no capacity warm-up), so shapes
are static per step; `RoutedStep` marks the token dimension dynamic, so torch.compile builds
one graph for all steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import BlockStack
from ..flops import routed_core_flops
from ..part import Bad, JobSettings, Part, tensor_parallel_problems
from ..settings import setting

if TYPE_CHECKING:  # the args have this module's settings among their bases
    from ..args import GRTModelArgs

# MoR in eval mode: top_k (as trained; not causal) or threshold (causal; what generation uses).
RouterInference = Literal["top_k", "threshold"]
# MoR expert choice, a routed token's update with router weight g: delta, h + g (core(h) - h)
# (the paper's H + g f(H)); block, h + g core(h) = (1 + g) h + g f(H) (the released code's
# `x + g * Block(x)`, its Block holding the residual). docs/mor.md says which the
# paper's rows use and why.
RouterUpdate = Literal["delta", "block"]


@dataclass
class MoRSettings:
    """Mixture-of-Recursions' `[grt]` settings, both routers' and expert choice's own. A base
    class of `GRTModelArgs` (grt_titan/model/args.py), whose `num_recurrences` the
    capacities read."""

    router_capacity: list[float] | None = setting(
        None,
        """MoR: share of the tokens each step keeps, one float per step, non-increasing, in (0, 1]
        (TOML `[1.0, 0.75, 0.5, 0.25]`, command line `--grt.router_capacity 1 0.75 0.5 0.25`);
        default (R - i) / R.""",
        hf=True,
    )
    router_scale: float = setting(
        0.1,
        "MoR: alpha; a selected token's update is scaled by sigmoid(router logit) x alpha (0.1).",
        hf=True,
    )
    router_aux_weight: float = setting(0.001, "MoR: weight of the router's BCE auxiliary loss (0.001).")
    router_inference: RouterInference = setting(
        "top_k",
        """MoR in eval mode (validation, `grt-titan analyze`): `top_k` (default) routes as in
        training, top-k of the sequence per step, so validation loss matches the training rule
        but is not causal; `threshold` sends a token on to step i while it was active at step
        i-1 and sigmoid(router logit) > 0.5, causal (what generation uses; eager only: refused
        with [compile] enable and validation on). Training always uses top_k
        (docs/mor.md, "MoR inference").""",
    )
    # The default is the update of every run made before the option existed, so their records,
    # checkpoints and exports load as trained; the MoR TOMLs of train_configs/paper/ set "block".
    router_update: RouterUpdate = setting(
        "delta",
        """MoR expert choice: a routed token's update with router weight g. `delta` (default):
        h + g (core(h) - h), the paper's H + g f(H); `block`: h + g core(h) = (1 + g) h + g f(h),
        the released code's `x + g * Block(x)` (its Block holds the residual), which the MoR TOMLs
        of train_configs/paper/ use (docs/mor.md, "Expert choice").""",
        hf=True,
    )

    @property
    def router_capacities(self) -> tuple[float, ...]:
        """MoR: share of the sequence step i keeps; `router_capacity`, else (R - i) / R."""
        R = self.num_recurrences
        if self.router_capacity is None:
            return tuple((R - i) / R for i in range(R))
        return tuple(float(c) for c in self.router_capacity)

    def router_tokens_kept(self, seq_len: int) -> list[int]:
        """MoR: k_i = max(1, int(capacity_i * S)) per step, as the released code computes it."""
        return [max(1, int(c * seq_len)) for c in self.router_capacities]


class RoutedStep(nn.Module):
    """The shared core on the routed tokens, with the router-weighted update
    (`router_update`: delta or block). No RNG."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        # MoR has no W_proj and no gate (injection = none, update = overwrite): the router's
        # weight g takes the gate's place, and only selected tokens are updated.
        self.core = BlockStack(args, args.n_core_layers, first_layer_id=args.n_prelude_layers)
        self.add_block = args.router_update == "block"  # token choice: always delta (validated)

    def forward(
        self, h_sel: torch.Tensor, weight: torch.Tensor, freqs_cis: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(updated h_sel, proposal o) for h_sel [B, k, d] (the kept tokens in causal order)
        and the router weight g [B, k, 1]. o is the proposal of the GRT's convention
        h <- (1 - g) h + g o that the step metrics read: the core output for delta, h + the
        core output for block (whose update h + g core(h) is that with o = h + core(h)).
        Returning it always keeps one compiled graph whether an observer looks or not."""
        out = self.core(h_sel, freqs_cis)
        if self.add_block:
            return h_sel + weight * out, h_sel + out
        return h_sel + weight * (out - h_sel), out

    def init_weights(self) -> None:
        self.core.init_weights()


class ExpertChoiceRouter(nn.Module):
    """One bias-free Linear(d, 1) per recurrence step, and the routed loop."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.steps = nn.ModuleList(nn.Linear(args.dim, 1, bias=False) for _ in range(args.num_recurrences))
        self.args = args
        self.scale = args.router_scale
        self.aux_weight = args.router_aux_weight
        # The eval-mode rule ("top_k" or "threshold"); an attribute, so a caller may switch it.
        self.inference = args.router_inference

    def init_weights(self) -> None:
        for linear in self.steps:
            nn.init.normal_(linear.weight, std=0.02)  # the released code's N(0, initializer_range)

    def forward(
        self,
        step: nn.Module,
        h: torch.Tensor,
        freqs_cis: torch.Tensor | None,
        depth: int,
        grad_from: int = 0,
        observer: Callable[..., None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h after `depth` routed steps and the auxiliary loss (a sum over tokens; None in eval
        mode or with router_aux_weight = 0). Steps before `grad_from` run without autograd.
        `observer(step, depth, state, new_state, gate, proposal)` sees every step (metrics)."""
        if depth > len(self.steps):
            raise ValueError(
                f"num_recurrences = {depth} is invalid for Mixture-of-Recursions: it has one router "
                f"per step; use r <= num_recurrences = {len(self.steps)}"
            )
        if not self.training and self.inference == "threshold":
            return self._threshold_forward(step, h, freqs_cis, depth, observer), None
        _, seq_len, dim = h.shape
        kept = self.args.router_tokens_kept(seq_len)
        with_aux = self.training and self.aux_weight > 0
        aux = h.new_zeros((), dtype=torch.float32) if with_aux else None
        positions = None  # [B, m] sequence positions of the candidates (None: every token)
        grad_enabled = torch.is_grad_enabled()
        for index in range(depth):
            with torch.set_grad_enabled(grad_enabled and index >= grad_from):
                candidates = h if positions is None else h.gather(1, _rows(positions, dim))
                logits = self.steps[index](candidates).squeeze(-1)  # [B, m]
                # Indices into the candidates, sorted so that the kept tokens stay causal.
                keep = logits.topk(kept[index], dim=1, sorted=False).indices.sort(dim=1).values
                if aux is not None:
                    target = torch.zeros_like(logits).scatter_(1, keep, 1.0)
                    bce = F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="sum")
                    # Mean over the step's candidates (as MoR), counted once per token of the batch.
                    aux = aux + bce * (seq_len / logits.shape[1])
                weight = (torch.sigmoid(logits.gather(1, keep)) * self.scale).unsqueeze(-1)  # g [B, k, 1]
                positions = keep if positions is None else positions.gather(1, keep)
                rows = _rows(positions, dim)
                h_sel = h.gather(1, rows)
                # One compiled graph for every k_i (torch.compile; no effect in eager mode): both
                # step inputs carry k, or the static one would specialize the other.
                torch._dynamo.maybe_mark_dynamic(h_sel, 1)
                torch._dynamo.maybe_mark_dynamic(weight, 1)
                new_sel, proposal = step(h_sel, weight, freqs_cis)
                new_h = h.scatter(1, rows, new_sel)
            if observer is not None:
                # In the GRT's convention (h <- g h + (1 - g) o): g = 1 - weight on the routed
                # tokens, 1 (copy) elsewhere; o = the core output there, h elsewhere.
                with torch.no_grad():
                    kept_share = torch.ones_like(h).scatter(1, rows, (1 - weight).expand_as(h_sel))
                    observer(index + 1, depth, h, new_h, kept_share, h.scatter(1, rows, proposal))
            h = new_h
        if aux is not None:
            aux = aux * self.aux_weight
        return h, aux

    def _threshold_forward(
        self,
        step: nn.Module,
        h: torch.Tensor,
        freqs_cis: torch.Tensor | None,
        depth: int,
        observer: Callable[..., None] | None = None,
    ) -> torch.Tensor:
        """Eval-mode causal routing: step i updates the tokens active at step i-1 whose
        logit_i > 0 (sigmoid > 0.5), each row on its own (its count is data-dependent); the
        core attends among the row's active tokens in causal order, as in the top-k path."""
        active = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device)  # [B, S]
        for index in range(depth):
            # Logits of every token; only those of the active ones are read.
            logits = self.steps[index](h).squeeze(-1)  # [B, S]
            active = active & (logits > 0)
            weight = (torch.sigmoid(logits) * self.scale).unsqueeze(-1)  # g [B, S, 1]
            new_h, proposal = h.clone(), h.clone()
            for row in range(h.shape[0]):
                positions = active[row].nonzero().squeeze(-1)  # causal order
                if positions.numel() == 0:
                    continue
                new_sel, row_proposal = step(h[row, positions][None], weight[row, positions][None], freqs_cis)
                new_h[row, positions] = new_sel[0]
                proposal[row, positions] = row_proposal[0]
            if observer is not None:
                with torch.no_grad():  # the GRT's convention, as in forward
                    kept_share = torch.where(active.unsqueeze(-1), 1 - weight, torch.ones_like(weight)).expand_as(h)
                    observer(index + 1, depth, h, new_h, kept_share, proposal)
            h = new_h
        return h


def _rows(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[B, k] sequence positions -> [B, k, d] gather/scatter indices."""
    return positions.unsqueeze(-1).expand(-1, -1, dim)


# What a routed recurrence (either router) needs of the other parts: (value, why).
ROUTED_PARTS = {
    "block_style": (
        "gpt2",
        "the routed core gathers tokens; llama blocks would need their RoPE positions gathered too",
    ),
    "depth_sampling": ("fixed", "one router and one capacity per step of a fixed depth R"),
    "injection": ("none", "MoR does not re-inject the prelude output"),
    "update": ("overwrite", "the router weight replaces the gate on routed tokens (router_update)"),
    "initial_state": ("prelude", "MoR starts from the prelude output"),
    "step_adapter": ("none", "MoR shares the core strictly"),
    "objective": ("final", "MoR's loss is CE at the last step plus the router's auxiliary loss"),
    "state_noise_std": (0.0, "MoR has no state noise"),
}


def check_routed(args: GRTModelArgs, bad: Bad) -> None:
    """MoR (either router) is prelude + core x R + coda with routed steps only: no
    re-injection, no gate, no noise, a fixed depth R (one router per step)."""
    for name, (value, why) in ROUTED_PARTS.items():
        if getattr(args, name) != value:
            raise bad(name, getattr(args, name), f"router = {args.router!r} needs {name} = {value!r} ({why})")
    if args.eval_recurrences is not None and args.eval_recurrences > args.num_recurrences:
        raise bad(
            "eval_recurrences",
            args.eval_recurrences,
            f"router = {args.router!r} has one router per step: at most num_recurrences = {args.num_recurrences}",
        )


class RoutedOrder(Part):
    """What both routers are to the loop: they fill its order slot, hold their module as
    `recurrence.router` and run the steps themselves over `RoutedStep`s, on the tokens they pick."""

    module_name = "router"
    runs_steps = True

    def build_step(self, args: GRTModelArgs) -> RoutedStep:
        return RoutedStep(args)

    def run_steps(self, loop: nn.Module, h: torch.Tensor, freqs_cis, depth: int, grad_from: int, observer):
        return loop.router(loop.step, h, freqs_cis, depth, grad_from=grad_from, observer=observer)


class ExpertChoice(RoutedOrder):
    """router = "expert_choice": the `ExpertChoiceRouter` above over `RoutedStep`s."""

    key, choice = "router", "expert_choice"
    per_step = True
    float8_skip = ("recurrence.router.",)  # Linear(d, 1) per step: a dot product per token

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.router_scale <= 0:
            raise bad("router_scale", args.router_scale, "must be > 0")
        if args.router_aux_weight < 0:
            raise bad("router_aux_weight", args.router_aux_weight, "must be >= 0")
        for name, default in (("router_inference", "top_k"), ("router_update", "delta")):
            if getattr(args, name) != default and args.router != self.choice:
                raise bad(
                    name,
                    getattr(args, name),
                    f"is used by router = 'expert_choice' only (router = {args.router!r}); allowed: {default!r}",
                )
        if args.router == self.choice:
            check_routed(args, bad)
            self._check_capacities(args, bad)

    def describe(self, args: GRTModelArgs) -> str:
        return (
            f"router `expert_choice` (MoR, update `{args.router_update}`): one router per step, so a call "
            'runs at most R steps; routes by threshold, causal; `router_inference="top_k"` for '
            "training's rule without cache"
        )

    def _check_capacities(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.router_capacity is None:
            return
        capacities = args.router_capacities
        if len(capacities) != args.num_recurrences:
            raise bad(
                "router_capacity",
                args.router_capacity,
                f"needs one capacity per step (num_recurrences = {args.num_recurrences}), got {len(capacities)}",
            )
        if not all(0.0 < c <= 1.0 for c in capacities):
            raise bad("router_capacity", args.router_capacity, "capacities must be in (0, 1]")
        if any(b > a for a, b in zip(capacities, capacities[1:])):
            raise bad(
                "router_capacity",
                args.router_capacity,
                "capacities must not increase (step i chooses among the tokens step i-1 kept)",
            )

    def job_problems(self, job: JobSettings, args: GRTModelArgs) -> list[str]:
        method = f"[grt] router = {args.router!r} (Mixture-of-Recursions)"
        problems = tensor_parallel_problems(
            job,
            "[parallelism] tensor_parallel_degree = {tp} is not supported with " + method + ": each "
            "step's top-k runs over the whole sequence, which sequence parallelism shards over "
            "the TP ranks; allowed: 1 (FSDP/HSDP/DDP only)",
        )
        if job.compiled and args.router_inference == "threshold" and job.validation:
            problems.append(
                f"[grt] router_inference = 'threshold' with {method} and [compile] enable: threshold "
                "routing runs each row's data-dependent number of active tokens eagerly, one row at a "
                "time, and is not compiled; allowed: router_inference = 'top_k' (the training rule) "
                "or [compile] enable = false"
            )
        for name, seq_len in job.seq_lens.items() if job.compiled else ():
            if seq_len >= 1 and min(args.router_tokens_kept(seq_len)) < 2:
                problems.append(
                    f"[grt] router_capacity = {args.router_capacity!r} keeps a single token at "
                    f"[{name}] seq_len = {seq_len} with {method} and [compile] enable: "
                    "torch.compile specializes a one-token step (one more graph per such step); "
                    "allowed: capacities with capacity x seq_len >= 2 for every step"
                )
        return problems

    def build(self, args: GRTModelArgs) -> ExpertChoiceRouter:
        return ExpertChoiceRouter(args)

    def routed_step_flops(self, args: GRTModelArgs, seq_len: int, depth: int) -> list[float]:
        """Step i runs the core on its k_i = max(1, int(capacity_i S)) kept tokens and its router
        on its m_i candidates (m_0 = S, m_i = k_{i-1}), (m_i / S) 2 d per token of the sequence."""
        kept = args.router_tokens_kept(seq_len)[:depth]
        routers = [(m / seq_len) * 2 * args.dim for m in [seq_len] + kept[:-1]]
        return routed_core_flops(args, seq_len, kept, routers)


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    ExpertChoice(),  # router = "expert_choice"
)
SETTINGS = MoRSettings
