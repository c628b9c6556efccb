"""Mixture-of-Recursions (Bae et al. 2025, arXiv 2507.10524): expert-choice routing of the
recurrence steps (`router = "expert_choice"`, docs/architecture.md "Mixture-of-Recursions").

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
block delta once, the paper's H + g f(H) (docs/architecture.md says why the rows use "block").
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

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .args import GRTModelArgs
from .blocks import BlockStack


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
