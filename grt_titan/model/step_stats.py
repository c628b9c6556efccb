"""Per-step statistics of the recurrence (paper appendix E): one definition for the training
metrics (grt_titan/components/metrics.py) and `grt-titan analyze` (grt_titan/analysis/).

A recurrence step (a `StepRecord`: h_{i-1} = `state`, h_i = `new_state`, o_i = `proposal`,
g_i = `gate`) reduces to a row of float64 sums, computed on the record's device with no
host sync. Rows of the same step add up over batches, microbatches and ranks; `summarize`
turns summed rows into the statistics. The sums, in row order:

| sum               | value                                       | in       |
|-------------------|---------------------------------------------|----------|
| count             | number of gate values                       | training |
| gate, gate_sq     | sum g, sum g^2                              | training |
| copy              | #(g > COPY_THRESHOLD), copy-saturated       | training |
| write             | #(g < WRITE_THRESHOLD), write-saturated     | training |
| update_sq         | ||h_i - h_{i-1}||_F^2                       | training |
| proposal_delta_sq | ||o_i - h_{i-1}||_F^2                       | training |
| state_sq          | ||h_{i-1}||_F^2                             | analysis |
| tokens            | number of tokens (vectors of d values)      | analysis |
| update_norm       | sum over tokens of ||h_i - h_{i-1}||        | analysis |
| proposal_norm     | sum over tokens of ||o_i||                  | analysis |
| state_cosine      | sum over tokens of cos(h_i, h_{i-1})        | analysis |
| proposal_cosine   | sum over tokens of cos(o_i, h_{i-1})        | analysis |

Training computes the `TRAINING_SUMS` prefix only (`full=False`, 7 numbers per step): the
analysis sums cost several more passes over the states. The statistics (docs/observability.md has the paper's values):

| statistic        | from the sums                                     | paper    |
|------------------|---------------------------------------------------|----------|
| gate_mean / std  | over all gate values of the step                  | fig 10a  |
| gate_copy_frac   | copy / count                                      | fig 10b  |
| gate_write_frac  | write / count                                     | fig 10b  |
| update_ratio     | rho = sqrt(update_sq / proposal_delta_sq) (eq. 6) | fig 10c  |
| update_norm      | mean per-token ||h_i - h_{i-1}||                  | fig 11a  |
| proposal_norm    | mean per-token ||o_i||                            | fig 11a  |
| state_cosine     | mean per-token cos(h_i, h_{i-1})                  | fig 11b  |
| proposal_cosine  | mean per-token cos(o_i, h_{i-1})                  | fig 11b  |
| relative_update  | sqrt(update_sq / state_sq)                        | fig 14b  |

The analysis also keeps, per step, a histogram of the gate values over [0, 1]
(`gate_histogram`, `GATE_BINS` equal bins; counts add up like the sums) and reads quantiles
from it (`histogram_quantiles`, linear inside a bin: it lies between the two order statistics
around q, give or take one bin width, 1e-3; where those two are far apart, as in a small
sample, it can differ from `torch.quantile`'s interpolation by more than a bin):
figure 10a draws the 5-95 % and 25-75 % bands of g, which stay inside [0, 1] where
mean +- std need not.

Pure torch on plain tensors: a caller holding DTensors passes their local shards.
"""

from __future__ import annotations

import math

import torch

from .recurrence import StepRecord

COPY_THRESHOLD = 0.95  # g above: the step copies the state (paper figure 10b)
WRITE_THRESHOLD = 0.05  # g below: the step writes the proposal

TRAINING_SUMS = ("count", "gate", "gate_sq", "copy", "write", "update_sq", "proposal_delta_sq")
SUMS = TRAINING_SUMS + (
    "state_sq",
    "tokens",
    "update_norm",
    "proposal_norm",
    "state_cosine",
    "proposal_cosine",
)

TRAINING_STATISTICS = ("gate_mean", "gate_std", "gate_copy_frac", "gate_write_frac", "update_ratio")
STATISTICS = TRAINING_STATISTICS + (
    "update_norm",
    "proposal_norm",
    "state_cosine",
    "proposal_cosine",
    "relative_update",
)


GATE_BINS = 1000
GATE_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
"""Quantiles of g per step in `grt-titan analyze` (keys gate_q05, gate_q25, ...)."""


def quantile_key(q: float) -> str:
    return f"gate_q{round(100 * q):02d}"


@torch.no_grad()
def gate_histogram(gate: torch.Tensor) -> torch.Tensor:
    """Counts of the gate values in `GATE_BINS` equal bins over [0, 1] (float64, on the device)."""
    return torch.histc(gate.detach().float(), bins=GATE_BINS, min=0.0, max=1.0).to(torch.float64)


def histogram_quantiles(counts: torch.Tensor, quantiles=GATE_QUANTILES) -> list[float]:
    """Quantiles of values in [0, 1] from their `gate_histogram` counts (summed over batches),
    linear inside the bin where the cumulative share crosses q."""
    counts = counts.detach().to(torch.float64).cpu()
    total = counts.sum().item()
    if total <= 0:
        return [math.nan] * len(quantiles)
    cum = torch.cumsum(counts, 0).tolist()
    bins = counts.numel()
    out = []
    for q in quantiles:
        target = q * total
        i = next(k for k, c in enumerate(cum) if c >= target)
        before = cum[i - 1] if i > 0 else 0.0
        inside = (target - before) / counts[i].item() if counts[i] > 0 else 0.0
        out.append(min(1.0, max(0.0, (i + inside) / bins)))
    return out


def _count(n: int, like: torch.Tensor) -> torch.Tensor:
    # A fill kernel on the device: no host-to-device copy, no sync.
    return torch.full((), float(n), dtype=torch.float64, device=like.device)


def _square_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dtype=torch.float32).to(torch.float64).square()


def _token_norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32)


def _cosine_sum(a: torch.Tensor, b: torch.Tensor, a_norm: torch.Tensor, b_norm: torch.Tensor) -> torch.Tensor:
    dot = (a.float() * b.float()).sum(-1)
    cos = dot / (a_norm * b_norm).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.sum(cos, dtype=torch.float64)


@torch.no_grad()
def step_row(record: StepRecord, full: bool = True) -> torch.Tensor:
    """The `SUMS` of one step of one batch (`full=False`: the `TRAINING_SUMS` prefix), as a
    float64 vector on the record's device."""
    h, h_new, o = (t.detach() for t in (record.state, record.new_state, record.proposal))
    f64 = torch.float64
    delta = h_new - h
    if record.gate is None:  # update = overwrite: g = 0 everywhere, every value a write
        zero = torch.zeros((), dtype=f64, device=h.device)
        gate_sums = [_count(h.numel(), h), zero, zero, zero, _count(h.numel(), h)]
    else:
        g = record.gate.detach()
        gate_sums = [
            _count(g.numel(), g),
            torch.sum(g, dtype=f64),
            torch.sum(g.float().square(), dtype=f64),
            torch.count_nonzero(g > COPY_THRESHOLD).to(f64),
            torch.count_nonzero(g < WRITE_THRESHOLD).to(f64),
        ]
    values = gate_sums + [_square_norm(delta), _square_norm(o - h)]
    if full:
        h_norm, new_norm, o_norm = _token_norms(h), _token_norms(h_new), _token_norms(o)
        values += [
            _square_norm(h),
            _count(h_norm.numel(), h),
            torch.sum(_token_norms(delta), dtype=f64),
            torch.sum(o_norm, dtype=f64),
            _cosine_sum(h_new, h, new_norm, h_norm),
            _cosine_sum(o, h, o_norm, h_norm),
        ]
    return torch.stack(values)


def summarize(rows: torch.Tensor) -> list[dict[str, float]]:
    """Statistics of steps 1, 2, ... from summed rows [steps, len(SUMS) or len(TRAINING_SUMS)]:
    `TRAINING_STATISTICS` or `STATISTICS` per step. Stops at the first step no forward
    reached (count 0). One host read of `rows`."""
    out = []
    for values in rows.tolist():
        s = dict(zip(SUMS, values))
        if s["count"] == 0:
            break
        mean = s["gate"] / s["count"]
        stats = {
            "gate_mean": mean,
            "gate_std": math.sqrt(max(s["gate_sq"] / s["count"] - mean * mean, 0.0)),
            "gate_copy_frac": s["copy"] / s["count"],
            "gate_write_frac": s["write"] / s["count"],
            "update_ratio": math.sqrt(s["update_sq"] / s["proposal_delta_sq"]) if s["proposal_delta_sq"] > 0 else 0.0,
        }
        if len(values) == len(SUMS):
            stats.update(
                {
                    "update_norm": s["update_norm"] / s["tokens"],
                    "proposal_norm": s["proposal_norm"] / s["tokens"],
                    "state_cosine": s["state_cosine"] / s["tokens"],
                    "proposal_cosine": s["proposal_cosine"] / s["tokens"],
                    "relative_update": math.sqrt(s["update_sq"] / s["state_sq"]) if s["state_sq"] > 0 else 0.0,
                }
            )
        out.append(stats)
    return out
