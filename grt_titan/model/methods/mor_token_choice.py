"""Mixture-of-Recursions (Bae et al. 2025, arXiv 2507.10524, section 2.2.1): token-choice
routing of the recurrence steps (`router = "token_choice"`, docs/mor.md
"Token choice").

    p     = softmax(W h_0)                        one bias-free Linear(d, R) on the first state
    r_t   = 1 + argmax p_t                         top-1: token t's number of recursions
    g_t   = p_t[r_t - 1]                           its router probability (alpha = 1)
    for step i in 0..r-1:
        active = the tokens with r_t > i           per row, in causal order
        o      = core(h[active])                   the shared core on [B, k_max, d], rows padded
        h[active] <- h[active] + g (o - h[active]) the same delta update as expert choice
    aux = B S (router_balance_weight R sum_j P_j f_j + router_z_loss_weight mean_t logsumexp(W h_0)_t^2)

f_j is the share of the batch's tokens that chose depth j + 1, P_j the mean router
probability of depth j + 1. The decision is made once, on the prelude output, so a token's
depth does not depend on later tokens (unlike expert choice's top-k over the sequence).

Rows hold different numbers of active tokens: each row's active tokens are gathered in
causal order and padded at the end of the row to the batch's largest count k_max, with
states of inactive tokens of that row (distinct positions). Pads sit after every real token,
so causal attention keeps the real tokens from seeing them; their result is discarded (the
pad positions are written back unchanged). k_max is data-dependent (one host sync per step);
the token dimension is marked dynamic, so torch.compile builds one graph for every k.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..flops import routed_core_flops
from ..part import Bad, JobSettings, tensor_parallel_problems
from ..settings import setting
from .mor import RoutedOrder, check_routed

if TYPE_CHECKING:  # the args have this module's settings among their bases
    from ..args import GRTModelArgs


@dataclass
class TokenChoiceSettings:
    """MoR token choice's own `[grt]` settings. A base class of `GRTModelArgs`
    (grt_titan/model/args.py), whose `num_recurrences` the shares read."""

    router_balance_weight: float = setting(0.1, "MoR token choice: weight of the balancing loss R sum_j P_j f_j (0.1).")
    router_z_loss_weight: float = setting(
        0.0,
        "MoR token choice: weight of the router z-loss, mean logsumexp(logits)^2 (0: off).",
    )

    @property
    def token_choice_active_shares(self) -> tuple[float, ...]:
        """MoR token choice: share of the tokens step i updates under balanced routing (each
        depth 1..R chosen by S / R tokens), (R - i) / R: the FLOP convention."""
        R = self.num_recurrences
        return tuple((R - i) / R for i in range(R))


class TokenChoiceRouter(nn.Module):
    """One bias-free Linear(d, R) choosing each token's depth, and the routed loop."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.depth = nn.Linear(args.dim, args.num_recurrences, bias=False)
        self.num_recurrences = args.num_recurrences
        self.balance_weight = args.router_balance_weight
        self.z_loss_weight = args.router_z_loss_weight

    def init_weights(self) -> None:
        nn.init.normal_(self.depth.weight, std=0.02)  # as the expert-choice routers

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits [B, S, R] in float32, depths [B, S] in 1..R, weights g [B, S] in float32)."""
        logits = self.depth(h).float()
        probs = logits.softmax(dim=-1)
        weight, choice = probs.max(dim=-1)
        return logits, choice + 1, weight

    def aux_loss(self, logits: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """The balancing loss R sum_j P_j f_j (and the z-loss), as a sum over the B S tokens."""
        tokens = depths.numel()
        probs = logits.softmax(dim=-1).reshape(tokens, -1)
        share = F.one_hot(depths.reshape(-1) - 1, self.num_recurrences).float().mean(dim=0)  # f_j
        balance = self.num_recurrences * (probs.mean(dim=0) * share).sum()
        aux = self.balance_weight * balance * tokens
        if self.z_loss_weight > 0:
            aux = aux + self.z_loss_weight * logits.reshape(tokens, -1).logsumexp(dim=-1).square().sum()
        return aux

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
        mode or with both loss weights 0). `step` is routing.RoutedStep. Steps before
        `grad_from` run without autograd (the router itself always has its gradient).
        `observer(step, depth, state, new_state, gate, proposal)` sees every step (metrics)."""
        if depth > self.num_recurrences:
            raise ValueError(
                f"num_recurrences = {depth} is invalid for Mixture-of-Recursions (token choice): a "
                f"token chooses at most R = {self.num_recurrences} steps; use r <= {self.num_recurrences}"
            )
        if depth == 0:
            return h, None  # the prelude output: no step, no routing decision to score
        _, seq_len, dim = h.shape
        logits, depths, weights = self.route(h)
        with_aux = self.training and (self.balance_weight > 0 or self.z_loss_weight > 0)
        aux = self.aux_loss(logits, depths) if with_aux else None
        weights = weights.to(h.dtype)
        positions = torch.arange(seq_len, device=h.device)
        grad_enabled = torch.is_grad_enabled()
        for index in range(depth):
            active = depths > index  # [B, S]
            counts = active.sum(dim=1)  # [B]
            k_max = int(counts.max())  # data-dependent: one host sync per step
            if k_max == 0:
                break  # no token goes deeper (only when every token chose fewer steps)
            with torch.set_grad_enabled(grad_enabled and index >= grad_from):
                # Active tokens first, in causal order, then the row's other tokens as pads.
                order = torch.where(active, positions, positions + seq_len).argsort(dim=1)[:, :k_max]
                real = torch.arange(k_max, device=h.device) < counts.unsqueeze(1)  # [B, k_max]
                rows = order.unsqueeze(-1).expand(-1, -1, dim)
                h_sel = h.gather(1, rows)
                weight = torch.where(real, weights.gather(1, order), 0.0).unsqueeze(-1)  # g, 0 on pads
                # One compiled graph for every k (torch.compile; no effect in eager mode).
                torch._dynamo.maybe_mark_dynamic(h_sel, 1)
                torch._dynamo.maybe_mark_dynamic(weight, 1)
                new_sel, proposal = step(h_sel, weight, freqs_cis)
                # Pads go back unchanged: nothing computed on them reaches the state.
                new_h = h.scatter(1, rows, torch.where(real.unsqueeze(-1), new_sel, h_sel))
            if observer is not None:
                # The GRT's convention (h <- g h + (1 - g) o): 1 - g on active tokens, 1 elsewhere.
                with torch.no_grad():
                    kept_share = torch.ones_like(h).scatter(1, rows, (1 - weight).expand_as(h_sel))
                    observer(
                        index + 1,
                        depth,
                        h,
                        new_h,
                        kept_share,
                        h.scatter(1, rows, torch.where(real.unsqueeze(-1), proposal, h_sel)),
                    )
            h = new_h
        return h, aux


class TokenChoice(RoutedOrder):
    """router = "token_choice": the `TokenChoiceRouter` above over routing.RoutedStep; its own
    loss weights, none of expert choice's fields."""

    key, choice = "router", "token_choice"
    per_step = True
    float8_skip = ("recurrence.router.",)  # Linear(d, R): R outputs
    OWN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenChoiceSettings))
    # Expert choice's fields, which token choice leaves unset, and why.
    EXPERT_CHOICE_FIELDS = (
        ("router_capacity", "each token chooses its own depth"),
        ("router_scale", "the weight is the softmax probability itself (alpha = 1)"),
        ("router_aux_weight", "token choice's auxiliary loss is router_balance_weight"),
    )

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(args)}
        for name in self.OWN_FIELDS:
            if getattr(args, name) < 0:
                raise bad(name, getattr(args, name), "must be >= 0")
        if args.router != self.choice:
            for name in self.OWN_FIELDS:
                if getattr(args, name) != defaults[name]:
                    raise bad(
                        name, getattr(args, name), f"is used by router = 'token_choice' only (router = {args.router!r})"
                    )
            return
        for name, why in self.EXPERT_CHOICE_FIELDS:
            if getattr(args, name) != defaults[name]:
                raise bad(
                    name,
                    getattr(args, name),
                    f"is used by router = 'expert_choice' only ({why}); leave it unset with router = 'token_choice'",
                )
        check_routed(args, bad)

    def describe(self, args: GRTModelArgs) -> str:
        return (
            "router `token_choice` (MoR): each token chooses its depth, one router for all steps that "
            "outputs R scores, so a call runs at most R steps"
        )

    def job_problems(self, job: JobSettings, args: GRTModelArgs) -> list[str]:
        return tensor_parallel_problems(
            job,
            "[parallelism] tensor_parallel_degree = {tp} is not supported with [grt] router = "
            "'token_choice' (Mixture-of-Recursions): each step gathers a row's active tokens from "
            "the whole sequence, which sequence parallelism shards over the TP ranks; allowed: 1 "
            "(FSDP/HSDP/DDP only)",
        )

    def build(self, args: GRTModelArgs) -> TokenChoiceRouter:
        return TokenChoiceRouter(args)

    def routed_step_flops(self, args: GRTModelArgs, seq_len: int, depth: int) -> list[float]:
        """Balanced routing (each depth chosen by S / R tokens): step i runs the core on the
        k_i = S (R - i) / R tokens that chose a depth > i (pads not counted); no router in a step."""
        kept = [share * seq_len for share in args.token_choice_active_shares[:depth]]
        return routed_core_flops(args, seq_len, kept, [0.0] * len(kept))

    def extra_flops(self, args: GRTModelArgs, seq_len: int, depth: float, training: bool) -> float:
        """The router Linear(d, R) once on every token, before the steps (none at r = 0)."""
        return 2 * args.dim * args.num_recurrences if round(depth) > 0 else 0


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    TokenChoice(),  # router = "token_choice"
)
SETTINGS = TokenChoiceSettings
