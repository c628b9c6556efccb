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
update; figures 10, 11a-b, 14b); the training metrics log the first five, same definitions;
and the `STEP_DYNAMICS` of the same pass (decision margin, angle, radial share), which tell
why tokens halt where they do, with the anchor response (`anchor_response`): per step s,
||T_s(a; e) - a|| / ||e||, one step taken from the method's anchor a (the prelude output e;
SCSE's h*), the zero-deviation forcing bias of the SCSE paper (arXiv 2607.27656): 0 for SCSE
by construction, not for a method that re-injects its source at every step.

`HaltingSweep`: per-token halting (grt_titan/model/halting/rules.py) on the same batches, one
`forward_with_halting` per (rule, threshold) point: loss against the mean forward FLOPs per
token at the depths the tokens realised, the quality-compute curve next to figure 3's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.components.loss import IGNORE_INDEX

from grt_titan.model.flops import realised_flops_per_token
from grt_titan.model.halting.rules import HALTING_RULES, READOUT_RULES
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

STEP_DYNAMICS = ("decision_margin", "angle_degrees", "radial_share", "anchor_response")


def step_dynamics(logits: torch.Tensor, h: torch.Tensor, previous: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per-token sums over `[B, T]` of the `STEP_DYNAMICS` of one step h_{s-1} -> h_s (float64):

    - decision margin: top-1 minus top-2 logit of the step's readout (the real vocabulary,
      not the padding columns): how decided the prediction is;
    - angle: arccos cos(h_s, h_{s-1}) in degrees, how far the state turns in the step;
    - radial share: |<h_s - h_{s-1}, h_{s-1} / ||h_{s-1}||>| / ||h_s - h_{s-1}||, the share of
      the displacement along the state's own direction (1: the step only rescales h, 0: it
      only rotates h); a token whose state did not move counts 0.
    """
    top = logits[..., :vocab_size].double().topk(2, dim=-1).values
    margin = top[..., 0] - top[..., 1]
    h, previous = h.double(), previous.double()
    tiny = torch.finfo(torch.float64).tiny
    cosine = F.cosine_similarity(h, previous, dim=-1, eps=tiny).clamp(-1.0, 1.0)
    displacement = h - previous
    along = (displacement * previous).sum(-1).abs() / previous.norm(dim=-1).clamp_min(tiny)
    radial = along / displacement.norm(dim=-1).clamp_min(tiny)
    return torch.stack([margin.sum(), torch.rad2deg(torch.arccos(cosine)).sum(), radial.sum()])


def anchor_response(recurrence: Recurrence, h_pre: torch.Tensor, freqs_cis, steps: int) -> torch.Tensor:
    """Per step s = 1..`steps`, the sum over tokens of ||T_s(a; e) - a|| / ||e|| (float64): the
    step s taken from the anchor a (`Recurrence.start`'s source: e = h_pre, or SCSE's h*),
    whatever the state. NaN for a routed recurrence (MoR), whose steps take no source."""
    if recurrence.order.runs_steps:
        return torch.full((steps,), float("nan"), dtype=torch.float64)
    _, anchor = recurrence.start(h_pre, None)
    scale = h_pre.double().norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    # Without per-step adapters (RRT) every step is the same function of its inputs: one call.
    sums = []
    for index in range(steps if recurrence.step_indexed else 1):
        step_index = torch.tensor(index, device=h_pre.device) if recurrence.step_indexed else None
        moved = recurrence.step(anchor, anchor, freqs_cis, step_index=step_index)
        sums.append(((moved - anchor).double().norm(dim=-1) / scale).sum())
    return torch.stack(sums).expand(steps).cpu()


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
    dynamics_sums: torch.Tensor = field(init=False)
    tokens: int = 0
    scored_tokens: int = 0  # labels not ignored: the loss's denominator (completions of SFT data)
    sequences: int = 0

    def __post_init__(self):
        if not 0 <= self.final_depth <= self.max_depth:
            raise ValueError(f"final depth {self.final_depth} must be in [0, max depth {self.max_depth}]")
        self.loss_sum = torch.zeros(self.max_depth + 1, dtype=torch.float64)
        self.kl_sum = torch.zeros(self.max_depth + 1, dtype=torch.float64)
        self.step_sums = torch.zeros(self.max_depth, len(SUMS), dtype=torch.float64)
        self.gate_counts = torch.zeros(self.max_depth, GATE_BINS, dtype=torch.float64)
        self.dynamics_sums = torch.zeros(self.max_depth, len(STEP_DYNAMICS), dtype=torch.float64)

    @torch.no_grad()
    def add_batch(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        recurrence = require_recurrence(model)
        states: list[torch.Tensor] = []

        def observe(record: StepRecord) -> None:
            if record.index == 1:
                states.append(record.state)
            states.append(record.new_state)
            self.step_sums[record.index - 1] += step_row(record).cpu()
            # No gate (update = overwrite, SCSE's deviation): g = 0 everywhere, as step_row counts it.
            gate = torch.zeros_like(record.state) if record.gate is None else record.gate
            self.gate_counts[record.index - 1] += gate_histogram(gate).cpu()

        inputs_of_recurrence = []
        hook = recurrence.register_forward_pre_hook(lambda _, args: inputs_of_recurrence.append(args[:2]))
        previous, recurrence.observer = recurrence.observer, observe
        try:
            final_logits = model(inputs, num_recurrences=self.max_depth)
        finally:
            recurrence.observer = previous
            hook.remove()
        (h_pre, freqs_cis), steps = inputs_of_recurrence[0], self.max_depth
        self.dynamics_sums[:, -1] += anchor_response(recurrence, h_pre, freqs_cis, steps)
        assert len(states) == self.max_depth + 1, len(states)

        def readout(r: int) -> torch.Tensor:
            return final_logits if r == self.max_depth else model.logits_from_state(states[r])

        vocab_size = model.model_args.vocab_size
        ref_logits = readout(self.final_depth)
        ref = F.log_softmax(ref_logits.float(), dim=-1)
        p_ref = ref.exp()
        flat_labels = labels.reshape(-1)
        for r in range(self.max_depth + 1):
            logits = ref_logits if r == self.final_depth else readout(r)
            logp = ref if r == self.final_depth else F.log_softmax(logits.float(), dim=-1)
            self.loss_sum[r] += F.nll_loss(logp.reshape(-1, logp.shape[-1]), flat_labels, reduction="sum").item()
            # KL(p_final || p_r); exactly 0 at the final depth (same tensor).
            self.kl_sum[r] += (p_ref * (ref - logp)).sum().item()
            if r >= 1:
                self.dynamics_sums[r - 1, :-1] += step_dynamics(logits, states[r], states[r - 1], vocab_size).cpu()
        self.tokens += labels.numel()
        self.scored_tokens += int((labels != IGNORE_INDEX).sum())  # prompt/completion data: completions
        self.sequences += labels.shape[0]

    def result(self) -> dict[str, list[float]]:
        out = {
            "loss": (self.loss_sum / self.scored_tokens).tolist(),
            "kl_to_final": (self.kl_sum / self.tokens).tolist(),
        }
        steps = summarize(self.step_sums)
        out.update({key: [s[key] for s in steps] for key in STATISTICS})
        per_step = [histogram_quantiles(self.gate_counts[i]) for i in range(len(steps))]
        for j, q in enumerate(GATE_QUANTILES):
            out[quantile_key(q)] = [values[j] for values in per_step]
        dynamics = self.dynamics_sums / self.tokens
        out.update({key: dynamics[:, j].tolist() for j, key in enumerate(STEP_DYNAMICS)})
        return out


# Thresholds swept per halting rule (a point each, one forward per batch). The measure rules
# halt a token when their measure < x: 0 never halts (the fixed depth b), larger x halts
# earlier. 1-2-5 and 1-3 steps around where a trained model's measures fall: in the paper's
# appendix E the relative update falls from 0.32 to 0.11 over the steps and 1 - mean g is
# 0.11-0.18; the KL to the final step falls from 0.46 (r = 2) to 0.014 (r = 5). argmax halts
# after x successive steps with an unchanged argmax (step 1 has none): x = 0 halts at a, and
# x >= b - 1 runs every token to b.
HALTING_GRIDS: dict[str, tuple[float, ...]] = {
    "state": (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    "gate": (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    "kl": (0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
    "entropy": (0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
    "argmax": (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32),  # those < b
}
COUNT_RULES = ("argmax",)  # thresholds are step counts, not measures


def halting_thresholds(rule: str, max_depth: int) -> list[float]:
    """The thresholds swept for `rule` at maximum depth b = `max_depth`."""
    if rule not in HALTING_GRIDS:
        raise ValueError(f"halting rule {rule!r} has no threshold grid in HALTING_GRIDS")
    grid = HALTING_GRIDS[rule]
    return [n for n in grid if n < max_depth] if rule in COUNT_RULES else list(grid)


@torch.no_grad()
def halting_skip_reason(model: nn.Module, rule: str, threshold: float, min_depth: int, max_depth: int) -> str | None:
    """Why `rule` is left out for this model, or None. The gate rule needs a gate; a model
    that chooses each token's steps itself (MoR's router, Ouro's exit) refuses halting, which
    a one-token call finds out (the model's own ValueError, whatever the rule)."""
    if rule == "gate" and getattr(model.recurrence.step, "gate", None) is None:  # MoR: no attribute
        return f"no gate (update = {model.model_args.update!r})"
    device = next(model.parameters()).device
    try:
        model.forward_with_halting(
            torch.zeros(1, 1, dtype=torch.long, device=device),
            rule,
            threshold,
            min_recurrences=min_depth,
            num_recurrences=max_depth,
        )
    except ValueError as e:
        return str(e)
    return None


@dataclass
class HaltingSweep:
    """Per-token halting's quality-compute curve: for each rule and threshold, the loss summed
    over the batches' tokens (the weighting of `DepthAnalysis`'s loss) and how many tokens
    halted at each depth 0..b, from `model.forward_with_halting` (eval mode)."""

    min_depth: int
    max_depth: int
    rules: Sequence[str] = HALTING_RULES
    grids: dict[str, Sequence[float]] | None = None  # thresholds per rule; default halting_thresholds
    thresholds: dict[str, list[float]] = field(init=False)
    loss_sum: dict[str, list[float]] = field(init=False)
    depth_counts: dict[str, torch.Tensor] = field(init=False)
    skipped: dict[str, str] = field(default_factory=dict)
    tokens: int = 0
    scored_tokens: int = 0

    def __post_init__(self):
        if not 1 <= self.min_depth <= self.max_depth:
            raise ValueError(f"halting min depth {self.min_depth} must be in [1, max depth {self.max_depth}]")
        self.rules = list(self.rules)
        unknown = [rule for rule in self.rules if rule not in HALTING_RULES]
        if unknown:
            raise ValueError(f"halting rules {unknown}; allowed: {HALTING_RULES}")
        grids = self.grids or {}
        self.thresholds = {
            rule: list(grids[rule]) if rule in grids else halting_thresholds(rule, self.max_depth)
            for rule in self.rules
        }
        self.loss_sum = {rule: [0.0] * len(self.thresholds[rule]) for rule in self.rules}
        self.depth_counts = {
            rule: torch.zeros(len(self.thresholds[rule]), self.max_depth + 1, dtype=torch.long) for rule in self.rules
        }

    @property
    def points(self) -> int:
        """Forwards per batch: one per (rule, threshold) point."""
        return sum(len(self.thresholds[rule]) for rule in self.rules)

    def skip(self, model: nn.Module) -> None:
        """Leave out the rules this model cannot halt by (before the first batch)."""
        for rule in list(self.rules):
            reason = halting_skip_reason(model, rule, self.thresholds[rule][0], self.min_depth, self.max_depth)
            if reason is not None:
                self.skipped[rule] = reason
                self.rules.remove(rule)

    @torch.no_grad()
    def add_batch(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        flat_labels = labels.reshape(-1)
        for rule in self.rules:
            for i, threshold in enumerate(self.thresholds[rule]):
                logits, depths = model.forward_with_halting(
                    inputs, rule, threshold, min_recurrences=self.min_depth, num_recurrences=self.max_depth
                )
                logp = F.log_softmax(logits.float(), dim=-1)
                loss = F.nll_loss(logp.reshape(-1, logp.shape[-1]), flat_labels, reduction="sum")
                self.loss_sum[rule][i] += loss.item()
                self.depth_counts[rule][i] += torch.bincount(depths.reshape(-1), minlength=self.max_depth + 1).cpu()
        self.tokens += labels.numel()
        self.scored_tokens += int((labels != IGNORE_INDEX).sum())

    def result(self, args, seq_len: int, fixed_loss: Sequence[float] | None = None) -> dict:
        """{min_depth, max_depth, rules: {rule: {thresholds, loss, mean_depth,
        forward_flops_per_token[, fixed_depth_flops_per_token]}}, skipped: {rule: reason}}.

        `fixed_loss` (the loss at fixed depths 0, 1, ..., as `DepthAnalysis` gives it) adds,
        per point, the forward FLOPs early exit at a fixed depth needs for the point's loss
        (`fixed_depth_flops_at`): what halting per token buys over a smaller r for every token."""
        fixed_flops = (
            None if fixed_loss is None else [args.forward_flops_per_token(seq_len, r) for r in range(len(fixed_loss))]
        )
        rules = {}
        for rule in self.rules:
            counts = [Counter({d: int(n) for d, n in enumerate(row) if n}) for row in self.depth_counts[rule]]
            loss = [total / self.scored_tokens for total in self.loss_sum[rule]]
            rules[rule] = {
                "thresholds": list(self.thresholds[rule]),
                "loss": loss,
                "mean_depth": [sum(d * n for d, n in c.items()) / self.tokens for c in counts],
                # The readout rules also pay a readout (coda and head) at each earlier step.
                "forward_flops_per_token": [
                    realised_flops_per_token(args, seq_len, c.elements(), rule in READOUT_RULES) for c in counts
                ],
            }
            if fixed_flops is not None:
                rules[rule]["fixed_depth_flops_per_token"] = [
                    fixed_depth_flops_at(x, fixed_loss, fixed_flops) for x in loss
                ]
        return {"min_depth": self.min_depth, "max_depth": self.max_depth, "rules": rules, "skipped": dict(self.skipped)}


def fixed_depth_flops_at(loss: float, fixed_loss: Sequence[float], fixed_flops: Sequence[float]) -> float | None:
    """The forward FLOPs per token early exit at a fixed depth needs to reach `loss` (figure 3's
    curve): the first depth r whose loss is <= `loss`, linearly interpolated in FLOPs with
    r - 1 (running a share of the tokens at r - 1 and the rest at r reaches the losses in
    between). None when no fixed depth reaches it."""
    for r, (at_r, cost) in enumerate(zip(fixed_loss, fixed_flops)):
        if at_r <= loss:
            if r == 0:
                return cost
            share = (fixed_loss[r - 1] - loss) / (fixed_loss[r - 1] - at_r)
            return fixed_flops[r - 1] + share * (cost - fixed_flops[r - 1])
    return None


def best_against_fixed_depth(curve: dict) -> int | None:
    """Index of the rule's swept point with the smallest forward FLOPs relative to the fixed
    depth at its loss (`HaltingSweep.result` with `fixed_loss`); None if no fixed depth
    reaches any point's loss."""
    ratios = {
        i: cost / fixed
        for i, (cost, fixed) in enumerate(zip(curve["forward_flops_per_token"], curve["fixed_depth_flops_per_token"]))
        if fixed is not None
    }
    return min(ratios, key=ratios.get) if ratios else None


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
