"""Mixture-of-Recursions (Bae et al. 2025, arXiv 2507.10524): expert-choice routing of the
recurrence steps (`router = "expert_choice"`, docs/architecture.md "Mixture-of-Recursions").

    for step i in 0..r-1:                         candidates: the tokens step i-1 kept (all at i = 0)
        logit = w_i . h[candidates]               one bias-free Linear(d, 1) per step
        keep  = top-k_i of logit, in causal order k_i = max(1, int(capacity_i * S))
        g     = sigmoid(logit[keep]) * alpha      alpha = router_scale (0.1)
        o     = core(h[keep])                     the shared core, causal attention among `keep`
        h[keep] <- h[keep] + g * (o - h[keep])    the router-weighted block delta, added once
    aux = router_aux_weight * sum_i BCE(logit, 1[keep]), each step's mean over its candidates

The released code adds `g * Block(x)` to `x`, and its `Block` already holds the residual, so a
selected token's state is scaled by (1 + g); we add the delta once (the paper's H + g f(H)).
Every k_i is fixed by the capacities and the sequence length (no capacity warm-up), so shapes
are static per step; `RoutedStep` marks the token dimension dynamic, so torch.compile builds
one graph for all steps.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .args import GRTModelArgs
from .blocks import BlockStack


class RoutedStep(nn.Module):
    """The shared core on the routed tokens, with the router-weighted delta update. No RNG."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        # MoR has no W_proj and no gate (injection = none, update = overwrite): the router's
        # weight g takes the gate's place, and only selected tokens are updated.
        self.core = BlockStack(args, args.n_core_layers, first_layer_id=args.n_prelude_layers)

    def forward(
        self, h_sel: torch.Tensor, weight: torch.Tensor, freqs_cis: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(updated h_sel, core output o) for h_sel [B, k, d] (the kept tokens in causal
        order) and the router weight g [B, k, 1]. o is kept for backward anyway; returning it
        always keeps one compiled graph whether an observer looks or not."""
        proposal = self.core(h_sel, freqs_cis)
        return h_sel + weight * (proposal - h_sel), proposal

    def init_weights(self) -> None:
        self.core.init_weights()


class ExpertChoiceRouter(nn.Module):
    """One bias-free Linear(d, 1) per recurrence step, and the routed loop."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.steps = nn.ModuleList(
            nn.Linear(args.dim, 1, bias=False) for _ in range(args.num_recurrences)
        )
        self.args = args
        self.scale = args.router_scale
        self.aux_weight = args.router_aux_weight

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


def _rows(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[B, k] sequence positions -> [B, k, d] gather/scatter indices."""
    return positions.unsqueeze(-1).expand(-1, -1, dim)
