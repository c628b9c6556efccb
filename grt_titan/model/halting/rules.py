"""Per-token halting at evaluation: each token stops recurring when its rule says it has
converged (docs/generation.md, "Per-token halting"; the paper's first future direction).

A call gives a rule, a threshold x, a minimum depth a and a maximum depth b (which may exceed
R). After step s (a <= s <= b) a token halts when its rule says so: its state keeps h_s.

    state:   ||h_s - h_{s-1}|| / ||h_s|| < x      (relative state change)
    gate:    1 - mean(g_s) < x                     (the share of the state the step rewrote)
    kl:      KL(p_{s-1} || p_s) < x                (successive next-token distributions)
    entropy: |H(p_s) - H(p_{s-1})| < x
    argmax:  argmax p_s unchanged for x successive steps (x counts steps)
    learned: 1 - P_probe(done | h_s) < x           (a probe fitted to the model; below)

p_s is step s's readout (coda, final norm and LM head on h_s); p_0 is the uniform distribution,
with no argmax. For the first four x = 0 never halts (the fixed depth b) and x = inf halts every
token at a; for argmax x = 0 halts at a and x = inf never halts.

Later steps attend to a halted token's K/V of the last step it computed, in every core block:
the forward computes every token while any token still recurs, discards the halted ones'
results and substitutes their K/V at each core block's attention (a pre-hook on its
`inner_attention`, whatever the block style), and stops once every token has halted. The
readout rules (kl, entropy, argmax) read every step out: step s's coda attends to the other
tokens' coda K/V of step s (a halted token's: of its last step), and a token's logits are its
readout at the step it halted; the state rules read out h once after the loop, as the fixed
depth does. The exported model does the same with its cache (grt_titan/hf/remote/halting_grt.py,
whose copies of the functions below tests/hf/test_hf_copies.py keeps equal);
tests/hf/test_hf_halting.py holds the two to the same depths and logits.

The learned rule reads a probe (`HaltingProbe`) fitted to a trained,
frozen model (grt_titan/model/halting/probe.py) and passed with the call, as CALM's
learned early-exit classifier is fitted (Schuster et al. 2022, arXiv 2207.07061): its target at
step s is whether the readout's argmax at s is the last step's and stays so through every
later step (`consistency_targets`). An export takes the five above, and the learned one where
`grt-titan export-hf --halting-probe` wrote its probe into it (halting_grt.py's copy).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import nn

HALTING_RULES = ("state", "gate", "kl", "entropy", "argmax")
# The rules that read every step out (its next-token distribution): coda and LM head per step.
READOUT_RULES = ("kl", "entropy", "argmax")
# The rule that reads a fitted probe: an export takes it where it holds the probe (`--halting-probe`).
LEARNED_RULE = "learned"


@dataclass(frozen=True)
class Halting:
    """A call's halting: the rule, its threshold and the depth range [min_depth, max_depth]."""

    rule: str
    threshold: float
    min_depth: int
    max_depth: int


def halting_of_call(halting, halting_threshold, min_recurrences, max_depth: int) -> Halting | None:
    """The call's `Halting`, or None for a fixed depth; ValueError naming the argument."""
    if halting is None:
        for name, value in (("halting_threshold", halting_threshold), ("min_recurrences", min_recurrences)):
            if value is not None:
                raise ValueError(f"{name} = {value!r} needs halting = one of {HALTING_RULES}")
        return None
    if halting not in HALTING_RULES:
        raise ValueError(f"halting = {halting!r}; allowed: {HALTING_RULES} (or None: a fixed depth)")
    if halting_threshold is None:
        raise ValueError(f"halting = {halting!r} needs halting_threshold (>= 0; 0 never halts)")
    if isinstance(halting_threshold, bool) or not isinstance(halting_threshold, (int, float)):
        raise TypeError(f"halting_threshold must be a number, got {halting_threshold!r}")
    if math.isnan(halting_threshold) or halting_threshold < 0:
        meaning = (
            "the number of successive steps with the same argmax; 0 halts at min_recurrences, inf never halts"
            if halting == "argmax"
            else "0 never halts, inf halts at min_recurrences"
        )
        raise ValueError(f"halting_threshold = {halting_threshold}; allowed: >= 0 ({meaning})")
    min_depth = 1 if min_recurrences is None else min_recurrences
    if isinstance(min_depth, bool) or not isinstance(min_depth, int) or min_depth < 1:
        raise ValueError(f"min_recurrences = {min_recurrences!r}; allowed: an int >= 1")
    if min_depth > max_depth:
        raise ValueError(
            f"min_recurrences = {min_depth} > num_recurrences = {max_depth} (the maximum depth of a halting call)"
        )
    return Halting(halting, float(halting_threshold), min_depth, max_depth)


class HaltingProbe(nn.Module):
    """The learned rule's probe: from a token's state h_s, the logit of "step s's readout is
    already the answer the last step gives, and stays it". CALM's classifier is linear; this one
    has a hidden layer, so that it can weigh what the state holds of the problem (its depth, the
    steps taken) together (docs/tasks.md, "A learned halting rule")."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits `[..., T]` of done, from states `[..., T, dim]` (fp32)."""
        return self.net(h.float()).squeeze(-1)


def consistency_targets(step_tokens: torch.Tensor) -> torch.Tensor:
    """The probe's targets `[S, B, T]` (bool) from each step's readout argmax `[S, B, T]` (steps
    1..S): True where step s's token is the last step's and no step after s changes it."""
    same = (step_tokens == step_tokens[-1]).int()
    return same.flip(0).cummin(0).values.flip(0).bool()


def learned_halting_of_call(probe, halting_threshold, min_recurrences, max_depth: int, dim: int) -> Halting:
    """The learned rule's `Halting`; ValueError naming the argument. Its threshold reads as the
    state rules' do (1 - P(done) below it halts: 0 never halts, inf halts at min_recurrences)."""
    if not isinstance(probe, HaltingProbe):
        raise ValueError(
            f"halting = {LEARNED_RULE!r} needs probe = a HaltingProbe fitted to this model "
            f"(grt_titan.model.halting.probe.fit_halting_probe), got {type(probe).__name__}"
        )
    if probe.dim != dim:
        raise ValueError(f"probe reads states of dim {probe.dim}; this model's dim is {dim}: fit one to this model")
    if halting_threshold is None:
        raise ValueError(f"halting = {LEARNED_RULE!r} needs halting_threshold (>= 0; 0 never halts)")
    plan = halting_of_call("state", halting_threshold, min_recurrences, max_depth)  # the same number checks
    return replace(plan, rule=LEARNED_RULE)


def halting_measure(rule: str, h: torch.Tensor, previous: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """The state rule's measure `[B, T]` after a step (fp32): below the threshold halts."""
    if rule == "state":
        change = (h.float() - previous.float()).norm(dim=-1)
        return change / h.float().norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    return 1.0 - gate.float().mean(dim=-1)  # "gate"


def readout_measure(rule: str, logits: torch.Tensor, memory):
    """(the readout rule's measure `[B, T]` after step s, the memory step s + 1 compares with)
    from step s's next-token logits `[B, T, V]`; `memory` None at step 1 (p_0 uniform)."""
    if rule == "argmax":
        top = logits.argmax(dim=-1)
        if memory is None:  # p_0 has no argmax: no step is unchanged yet
            count = torch.zeros_like(top)
        else:
            count = torch.where(top == memory[0], memory[1] + 1, torch.zeros_like(top))
        return count.float(), (top, count)
    log_p = torch.log_softmax(logits.float(), dim=-1)
    if rule == "kl":
        if memory is None:  # KL(uniform || p_1)
            memory = torch.full_like(log_p[..., :1], -math.log(log_p.shape[-1]))
        return (memory.exp() * (memory - log_p)).sum(dim=-1), log_p
    entropy = -(log_p.exp() * log_p).sum(dim=-1)  # "entropy"
    previous = math.log(log_p.shape[-1]) if memory is None else memory
    return (entropy - previous).abs(), entropy


def halts(rule: str, measure: torch.Tensor, threshold: float) -> torch.Tensor:
    """Where the rule halts `[B, T]`: argmax counts unchanged steps up to the threshold; the
    other rules' measures fall below it."""
    return measure >= threshold if rule == "argmax" else measure < threshold


def never_halts(rule: str) -> float:
    """The rule's threshold at which no token halts: every token runs the call's maximum depth
    under the rule's own cache layout (a context prefilled at full depth, then decoded with the
    rule: docs/generation.md, "Per-token halting")."""
    return math.inf if rule == "argmax" else 0.0


class HaltedTokensKeepTheirKV:
    """While `active(core_blocks)` is entered, each core block's attention sees, for a token
    not in `running` (`[B, T]`, read at every call), the K/V it saw at that block's previous
    call."""

    def __init__(self, running: torch.Tensor):
        self.running = running
        self.frozen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _hook(self, index: int):
        def substitute(module, args):
            q, k, v = args[:3]
            if index in self.frozen:
                computing = self.running[:, None, :, None]
                kept_k, kept_v = self.frozen[index]
                k, v = torch.where(computing, k, kept_k), torch.where(computing, v, kept_v)
            self.frozen[index] = (k, v)
            return (q, k, v, *args[3:])

        return substitute

    @contextmanager
    def active(self, core_blocks: list[nn.Module]):
        # The attention core of each block, whatever wraps it (AC's CheckpointWrapper, compile).
        cores = [next(m for name, m in b.named_modules() if name.endswith("inner_attention")) for b in core_blocks]
        handles = [core.register_forward_pre_hook(self._hook(i)) for i, core in enumerate(cores)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


def halting_recurrence(
    recurrence,
    h_pre: torch.Tensor,
    freqs_cis,
    halting: Halting,
    readout=None,
    vocab_size=None,
    probe=None,
    may_halt: torch.Tensor | None = None,
):
    """(the state, each token's depth `[B, T]`, each token's logits at the step it halted or
    None): the eval loop of `recurrence` (no noise) up to `halting.max_depth` steps, each token
    halting by its rule. A readout rule reads every step out through `readout` (a model whose
    `coda.layers` and `logits_from_state` give the logits; their first `vocab_size` columns are
    the vocabulary's); the state rules and the learned rule (its `probe` on each step's state)
    return no logits. `may_halt` (`[B, T]` bool, None: every token): the tokens the rule may
    halt; the others run every step to the maximum depth, so that the tokens reading them see
    their K/V of each step (a prompt prefilled at full depth, as Huginn's is)."""
    step = recurrence.step
    h, source = recurrence.start(h_pre, None)
    depths = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)
    kv = HaltedTokensKeepTheirKV(torch.ones(h.shape[:2], dtype=torch.bool, device=h.device))
    if may_halt is not None:
        may_halt = may_halt.to(device=h.device, dtype=torch.bool).expand(h.shape[:2])
    reads_out = halting.rule in READOUT_RULES
    blocks = list(step.core.layers.values()) + (list(readout.coda.layers.values()) if reads_out else [])
    logits, memory = None, None
    with kv.active(blocks):
        index = 0
        while index < halting.max_depth and bool(kv.running.any()):
            step_index = torch.tensor(index, device=h.device) if recurrence.step_indexed else None
            new_h, gate, _ = step(h, source, freqs_cis, None, None, return_parts=True, step_index=step_index)
            new_h = torch.where(kv.running[..., None], new_h, h)
            depths += kv.running
            if reads_out:  # step s's readout; a token's logits are those of the step it halts at
                step_logits = readout.logits_from_state(new_h)
                logits = step_logits if logits is None else torch.where(kv.running[..., None], step_logits, logits)
                measure, memory = readout_measure(halting.rule, step_logits[..., :vocab_size], memory)
            elif halting.rule == LEARNED_RULE:
                measure = 1.0 - torch.sigmoid(probe(new_h))
            else:
                measure = halting_measure(halting.rule, new_h, h, gate)
            if index + 1 >= halting.min_depth:
                stop = halts(halting.rule, measure, halting.threshold)
                kv.running = kv.running & ~(stop if may_halt is None else stop & may_halt)
            h = new_h
            index += 1
    return h, depths, logits
