"""The numbers behind the paper's appendix-E figures, for one GRT and a set of batches.

One forward per batch at the deepest depth asked for (default R + 2) captures the state
after every step through `Recurrence.observer`; in eval mode a step does not depend on
the total depth, so the state after r steps is exactly the state a depth-r forward hands
to the coda. Each captured state then goes through `GRTModel.logits_from_state` (coda,
final norm, LM head), giving the loss at every r from one core pass (tests check it
against `model(tokens, num_recurrences=r)`).

| key            | value                                                          | paper     |
|----------------|----------------------------------------------------------------|-----------|
| loss[r]        | mean next-token cross-entropy at depth r (r = 0: prelude only) | fig 3, 9a |
| kl_to_final[r] | mean over tokens of KL(p_final || p_r), final = eval depth     | fig 9b    |
| gate_q05..q95  | per step: quantiles of g (5, 25, 50, 75, 95 %), from a histogram | fig 10a   |

plus, per recurrence step i, the `STATISTICS` of grt_titan/model/step_stats.py (gate mean,
std and saturation shares, update ratio rho, update / proposal norms and cosines, relative
update; figures 10, 11a-b, 14b); the training metrics log the first five, same definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from grt_titan.model.recurrence import Recurrence, StepRecord, find_recurrence
from grt_titan.model.step_stats import (
    GATE_BINS,
    GATE_QUANTILES,
    STATISTICS,
    SUMS,
    gate_histogram,
    histogram_quantiles,
    quantile_key,
    step_row,
    summarize,
)


def require_recurrence(model: nn.Module) -> Recurrence:
    recurrence = find_recurrence([model])
    if recurrence is None:
        raise ValueError("this model has no recurrence (a dense flavor): nothing to analyze per step")
    return recurrence


@dataclass
class DepthAnalysis:
    """Accumulates `analyze_batch` over batches; `result()` gives the per-r / per-step lists."""

    max_depth: int
    final_depth: int
    loss_sum: torch.Tensor = field(init=False)
    kl_sum: torch.Tensor = field(init=False)
    step_sums: torch.Tensor = field(init=False)
    gate_counts: torch.Tensor = field(init=False)
    tokens: int = 0
    sequences: int = 0

    def __post_init__(self):
        if not 0 <= self.final_depth <= self.max_depth:
            raise ValueError(f"final depth {self.final_depth} must be in [0, max depth {self.max_depth}]")
        self.loss_sum = torch.zeros(self.max_depth + 1, dtype=torch.float64)
        self.kl_sum = torch.zeros(self.max_depth + 1, dtype=torch.float64)
        self.step_sums = torch.zeros(self.max_depth, len(SUMS), dtype=torch.float64)
        self.gate_counts = torch.zeros(self.max_depth, GATE_BINS, dtype=torch.float64)

    @torch.no_grad()
    def add_batch(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        recurrence = require_recurrence(model)
        states: list[torch.Tensor] = []

        def observe(record: StepRecord) -> None:
            if record.index == 1:
                states.append(record.state)
            states.append(record.new_state)
            self.step_sums[record.index - 1] += step_row(record).cpu()
            self.gate_counts[record.index - 1] += gate_histogram(record.gate).cpu()

        previous, recurrence.observer = recurrence.observer, observe
        try:
            final_logits = model(inputs, num_recurrences=self.max_depth)
        finally:
            recurrence.observer = previous
        assert len(states) == self.max_depth + 1, len(states)

        def log_probs(r: int) -> torch.Tensor:
            logits = final_logits if r == self.max_depth else model.logits_from_state(states[r])
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
        steps = summarize(self.step_sums)
        out.update({key: [s[key] for s in steps] for key in STATISTICS})
        per_step = [histogram_quantiles(self.gate_counts[i]) for i in range(len(steps))]
        for j, q in enumerate(GATE_QUANTILES):
            out[quantile_key(q)] = [values[j] for values in per_step]
        return out


@torch.no_grad()
def gate_heatmap(model: nn.Module, token_ids: list[int], depth: int) -> list[list[float]]:
    """Figure 8: [step][token] mean over features of g, for one prompt at depth `depth`."""
    recurrence = require_recurrence(model)
    rows: list[list[float]] = []

    def observe(record: StepRecord) -> None:
        gate = torch.zeros_like(record.state) if record.gate is None else record.gate  # overwrite: g = 0
        rows.append(gate.detach().float().mean(dim=-1)[0].tolist())

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
