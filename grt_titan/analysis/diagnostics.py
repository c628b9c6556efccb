"""The numbers behind the paper's appendix-E figures, for one GRT and a set of batches.

One forward per batch at the deepest depth asked for (default R + 2) captures the state
after every step through `Recurrence.observer`; in eval mode a step does not depend on
the total depth, so the state after r steps is exactly the state a depth-r forward hands
to the coda. Each captured state then goes through the coda and LM head, giving the loss
at every r from one core pass (tests check it against `model(tokens, num_recurrences=r)`).

Definitions (h_{i-1}: state before step i, o_i: core output, g_i: gate, h_i: state after;
norms are L2 over the feature dimension per token, or Frobenius over all tokens):

| key               | value                                                         | paper   |
|-------------------|---------------------------------------------------------------|---------|
| loss[r]           | mean next-token cross-entropy at depth r (r = 0: prelude only)| fig 3, 9a |
| kl_to_final[r]    | mean over tokens of KL(p_final || p_r), final = eval depth    | fig 9b  |
| gate_mean / std   | over all gate values of step i                                | fig 10a |
| gate_copy_frac    | share of g > 0.95                                             | fig 10b |
| gate_write_frac   | share of g < 0.05                                             | fig 10b |
| update_ratio      | rho = ||h_i - h_{i-1}||_F / ||o_i - h_{i-1}||_F (eq. 6)       | fig 10c |
| update_norm       | mean per-token ||h_i - h_{i-1}||                              | fig 11a |
| proposal_norm     | mean per-token ||o_i||                                        | fig 11a |
| state_cosine      | mean per-token cos(h_i, h_{i-1})                              | fig 11b |
| proposal_cosine   | mean per-token cos(o_i, h_{i-1})                              | fig 11b |
| relative_update   | ||h_i - h_{i-1}||_F / ||h_{i-1}||_F                           | fig 14b |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from grt_titan.components.metrics import COPY_THRESHOLD, WRITE_THRESHOLD, find_recurrence
from grt_titan.model.recurrence import Recurrence, StepRecord

# Per-step sums, in this order (see StepSums.add).
_SUMS = (
    "count", "gate", "gate_sq", "copy", "write",
    "update_sq", "proposal_delta_sq", "state_sq",
    "tokens", "update_norm", "proposal_norm", "state_cosine", "proposal_cosine",
)


def require_recurrence(model: nn.Module) -> Recurrence:
    recurrence = find_recurrence([model])
    if recurrence is None:
        raise ValueError("this model has no recurrence (a dense flavor): nothing to analyze per step")
    return recurrence


def coda_logits(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """What GRTModel.forward does after the recurrence: coda, final norm, LM head."""
    return model.output(model.norm(model.coda(h, model.freqs_cis)))


@torch.no_grad()
def step_sums(record: StepRecord) -> torch.Tensor:
    """The `_SUMS` of one step of one batch, as a float64 vector."""
    h, h_new, o, g = (t.detach().float() for t in (record.state, record.new_state, record.proposal, record.gate))
    delta = h_new - h
    eps = torch.finfo(torch.float32).tiny
    h_norm = h.norm(dim=-1)
    tokens = h_norm.numel()
    values = [
        g.numel(), g.sum(), g.square().sum(),
        (g > COPY_THRESHOLD).sum(), (g < WRITE_THRESHOLD).sum(),
        delta.square().sum(), (o - h).square().sum(), h.square().sum(),
        tokens, delta.norm(dim=-1).sum(), o.norm(dim=-1).sum(),
        ((h_new * h).sum(-1) / (h_new.norm(dim=-1) * h_norm).clamp_min(eps)).sum(),
        ((o * h).sum(-1) / (o.norm(dim=-1) * h_norm).clamp_min(eps)).sum(),
    ]
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


def summarize_steps(sums: torch.Tensor) -> dict[str, list[float]]:
    """Per-step statistics (lists indexed by step - 1) from the summed `_SUMS` rows."""
    out: dict[str, list[float]] = {k: [] for k in (
        "gate_mean", "gate_std", "gate_copy_frac", "gate_write_frac", "update_ratio",
        "update_norm", "proposal_norm", "state_cosine", "proposal_cosine", "relative_update",
    )}
    for row in sums.tolist():
        s = dict(zip(_SUMS, row))
        mean = s["gate"] / s["count"]
        out["gate_mean"].append(mean)
        out["gate_std"].append(math.sqrt(max(s["gate_sq"] / s["count"] - mean * mean, 0.0)))
        out["gate_copy_frac"].append(s["copy"] / s["count"])
        out["gate_write_frac"].append(s["write"] / s["count"])
        out["update_ratio"].append(math.sqrt(s["update_sq"] / s["proposal_delta_sq"]) if s["proposal_delta_sq"] else 0.0)
        out["update_norm"].append(s["update_norm"] / s["tokens"])
        out["proposal_norm"].append(s["proposal_norm"] / s["tokens"])
        out["state_cosine"].append(s["state_cosine"] / s["tokens"])
        out["proposal_cosine"].append(s["proposal_cosine"] / s["tokens"])
        out["relative_update"].append(math.sqrt(s["update_sq"] / s["state_sq"]) if s["state_sq"] else 0.0)
    return out


@dataclass
class DepthAnalysis:
    """Accumulates `analyze_batch` over batches; `result()` gives the per-r / per-step lists."""

    max_depth: int
    final_depth: int
    loss_sum: torch.Tensor = field(init=False)
    kl_sum: torch.Tensor = field(init=False)
    step_sums: torch.Tensor = field(init=False)
    tokens: int = 0
    sequences: int = 0

    def __post_init__(self):
        if not 0 <= self.final_depth <= self.max_depth:
            raise ValueError(f"final depth {self.final_depth} must be in [0, max depth {self.max_depth}]")
        self.loss_sum = torch.zeros(self.max_depth + 1, dtype=torch.float64)
        self.kl_sum = torch.zeros(self.max_depth + 1, dtype=torch.float64)
        self.step_sums = torch.zeros(self.max_depth, len(_SUMS), dtype=torch.float64)

    @torch.no_grad()
    def add_batch(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        recurrence = require_recurrence(model)
        states: list[torch.Tensor] = []

        def observe(record: StepRecord) -> None:
            if record.index == 1:
                states.append(record.state)
            states.append(record.new_state)
            self.step_sums[record.index - 1] += step_sums(record)

        previous, recurrence.observer = recurrence.observer, observe
        try:
            final_logits = model(inputs, num_recurrences=self.max_depth)
        finally:
            recurrence.observer = previous
        assert len(states) == self.max_depth + 1, len(states)

        def log_probs(r: int) -> torch.Tensor:
            logits = final_logits if r == self.max_depth else coda_logits(model, states[r])
            return F.log_softmax(logits.float(), dim=-1)

        ref = log_probs(self.final_depth)
        p_ref = ref.exp()
        flat_labels = labels.reshape(-1)
        for r in range(self.max_depth + 1):
            logp = ref if r == self.final_depth else log_probs(r)
            self.loss_sum[r] += F.nll_loss(logp.reshape(-1, logp.shape[-1]), flat_labels, reduction="sum").item()
            # KL(p_final || p_r); exactly 0 at the final depth (same tensor).
            self.kl_sum[r] += (p_ref * (ref - logp)).sum().item()
        self.tokens += labels.numel()
        self.sequences += labels.shape[0]

    def result(self) -> dict[str, list[float]]:
        out = {
            "loss": (self.loss_sum / self.tokens).tolist(),
            "kl_to_final": (self.kl_sum / self.tokens).tolist(),
        }
        out.update(summarize_steps(self.step_sums))
        return out


@torch.no_grad()
def gate_heatmap(model: nn.Module, token_ids: list[int], depth: int) -> list[list[float]]:
    """Figure 8: [step][token] mean over features of g, for one prompt at depth `depth`."""
    recurrence = require_recurrence(model)
    rows: list[list[float]] = []

    def observe(record: StepRecord) -> None:
        rows.append(record.gate.detach().float().mean(dim=-1)[0].tolist())

    device = next(model.parameters()).device
    previous, recurrence.observer = recurrence.observer, observe
    try:
        model(torch.tensor([token_ids], device=device), num_recurrences=depth)
    finally:
        recurrence.observer = previous
    return rows


def batches(dataset, num_sequences: int, batch_size: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """The first `num_sequences` samples of a TokenSequenceDataset, stacked in batches."""
    for start in range(0, num_sequences, batch_size):
        items = [dataset[k] for k in range(start, min(start + batch_size, num_sequences))]
        yield torch.stack([x["input"] for x, _ in items]), torch.stack([y for _, y in items])
