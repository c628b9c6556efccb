"""Per-token halting at inference: each token stops recurring when its rule says it has
converged (docs/generation.md, "Per-token halting"; the paper's first future direction).

Remote code: imports torch only, exported next to modeling_grt.py, which imports it. The
rules and their checks are the training model's (grt_titan/model/halting/rules.py, whose
`forward_with_halting` evaluation path computes the same depths and logits; the functions marked
"Copied from" are its own, character for character).

A call chooses a rule, a threshold, a minimum depth a and a maximum depth b
(`num_recurrences`, which may exceed R). After step s (a <= s <= b) a token halts when its
rule says so: its state keeps h_s, and the token reads out at depth s.

| rule      | halts after step s when                                               |
|-----------|-----------------------------------------------------------------------|
| `state`   | ||h_s - h_{s-1}|| / ||h_s|| < x (relative state change)               |
| `gate`    | 1 - mean(g_s) < x: the share of the state the step rewrote (GRT's gate; g -> 1 copies) |
| `kl`      | KL(p_{s-1} || p_s) < x: successive steps' next-token distributions    |
| `entropy` | |H(p_s) - H(p_{s-1})| < x                                             |
| `argmax`  | the argmax of p_s has not changed for x successive steps (x counts steps) |
| `learned` | 1 - P(done | h_s) < x, P read by a probe fitted to the model after training (an export written with `--halting-probe`) |

p_s is step s's readout (coda, final norm, LM head), p_0 the uniform distribution (no argmax).
For the first four and `learned`, threshold 0 never halts (a measure is never below 0): every token runs b
steps, the fixed depth's forward exactly; an infinite threshold halts every token at a. For
argmax, 0 halts every token at a and inf never halts.

What later steps attend to for a halted token (the cache semantics, also without a cache):
its K/V of the last step it computed, in every core block, at every later step (Huginn's
"last computed entry"). A batched forward keeps computing every token of a step while any
token of the call still recurs (its result discarded for the halted ones) and substitutes
their K/V; it stops when every token has halted and fills the later steps' cache entries
with those K/V, so a cached decode equals the uncached forward (per_step). The compressed
strategies keep, for a halted token: `first` step 1's K/V, `last` its last computed step's,
`average` the mean over the b steps of what they attend to (its last computed K/V standing
in for the steps after it halted).

The readout rules (kl, entropy, argmax) read every step out: step s's coda attends to the
earlier tokens' coda K/V of step s (a halted token's: those of its last step), so their cache
keeps one coda K/V per step (as Ouro's per-token exit does), and a token's hidden state is its
readout at the step it halted. The state rules read h out once after the loop, as the fixed
depth does; at threshold 0 both are the fixed depth's forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

HALTING_RULES = ("state", "gate", "kl", "entropy", "argmax")
# The rules that read every step out (its next-token distribution): coda and LM head per step.
READOUT_RULES = ("kl", "entropy", "argmax")
# The rule that reads a fitted probe: an export holds one where `grt-titan export-hf
# --halting-probe FILE` wrote it (`model.halting_probe`, config.json's `halting_probe`).
LEARNED_RULE = "learned"


@dataclass(frozen=True)
class Halting:
    """A call's halting: the rule, its threshold and the depth range [min_depth, max_depth]."""

    rule: str
    threshold: float
    min_depth: int
    max_depth: int


# Copied from grt_titan.model.halting.rules.halting_of_call
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


# Copied from grt_titan.model.halting.rules.HaltingProbe
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


# Copied from grt_titan.model.halting.rules.halting_measure
def halting_measure(rule: str, h: torch.Tensor, previous: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """The state rule's measure `[B, T]` after a step (fp32): below the threshold halts."""
    if rule == "state":
        change = (h.float() - previous.float()).norm(dim=-1)
        return change / h.float().norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    return 1.0 - gate.float().mean(dim=-1)  # "gate"


# Copied from grt_titan.model.halting.rules.readout_measure
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


# Copied from grt_titan.model.halting.rules.halts
def halts(rule: str, measure: torch.Tensor, threshold: float) -> torch.Tensor:
    """Where the rule halts `[B, T]`: argmax counts unchanged steps up to the threshold; the
    other rules' measures fall below it."""
    return measure >= threshold if rule == "argmax" else measure < threshold


# Copied from grt_titan.model.halting.rules.never_halts
def never_halts(rule: str) -> float:
    """The rule's threshold at which no token halts: every token runs the call's maximum depth
    under the rule's own cache layout (a context prefilled at full depth, then decoded with the
    rule: docs/generation.md, "Per-token halting")."""
    return math.inf if rule == "argmax" else 0.0


def halting_steps(model, h, h_pre, call, record, halting: Halting, keep, head=None):
    """(h after the call's steps, each token's depth `[B, T]`, the readout or None): the plain
    loop (the slots of injection, step adapter and update), each token halting by `halting`'s
    rule. A readout rule reads every step out (coda with its step's cache slots, final norm,
    `head` for the logits) and returns each token's normed coda output at the step it halted,
    each coda block's output there and its logits (`(hidden, per_block, logits)`).

    `keep` `[B, T]` (False for padding) or None: padding never runs (its depth stays 0), so it
    never holds the loop running."""
    inject, adapt, update = (model.slots[key] for key in ("injection", "step_adapter", "update"))
    batch, seqlen = h.shape[:2]
    running = torch.ones(batch, seqlen, dtype=torch.bool, device=h.device)
    if keep is not None:
        running &= keep.to(device=h.device, dtype=torch.bool)
    depths = torch.zeros(batch, seqlen, dtype=torch.long, device=h.device)
    frozen: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}  # block -> the K/V later steps see
    every_step = record.keep_states  # analysis outputs: one state per step, b of them
    reads_out = halting.rule in READOUT_RULES
    readout, per_block, logits, memory = None, None, None, None

    def kv(kind: str, block: int, step: int):
        to_cache = call.kv(kind, block, step)

        def update_kv(k, v):
            if (kind, block) in frozen:  # halted tokens: their last computed K/V
                computing = running[:, None, :, None]
                kept_k, kept_v = frozen[kind, block]
                k, v = torch.where(computing, k, kept_k), torch.where(computing, v, kept_v)
            frozen[kind, block] = (k, v)
            return (k, v) if to_cache is None else to_cache(k, v)

        return update_kv

    def keep_running(new, old):  # a token's readout: that of the last step it ran
        return new if old is None else torch.where(running[..., None], new, old)

    step = 0
    while step < call.depth and (every_step or bool(running.any())):
        o = inject.core_input(model, h, h_pre)
        for j, block in enumerate(model.core):
            o = block(o, call.rope, call.core_mask, kv("core", j, step), adapt.core_lora(model, step, j))
        h_new, gate = update.update(model, h, h_pre, o)
        h_new = torch.where(running[..., None], h_new, h)
        depths += running
        if reads_out:
            x, outputs = h_new, []
            for j, block in enumerate(model.coda):
                x = block(x, call.rope, call.mask, kv("coda", j, step))
                outputs.append(x)
            x = model.norm(x)
            if record.hidden_states is not None:  # each coda block's output, for output_hidden_states
                per_block = [keep_running(new, old) for new, old in zip(outputs, per_block or [None] * len(outputs))]
            readout = keep_running(x, readout)
            step_logits = head(x)
            logits = keep_running(step_logits, logits)
            measure, memory = readout_measure(halting.rule, step_logits, memory)
        elif halting.rule == LEARNED_RULE:
            measure = 1.0 - torch.sigmoid(model.halting_probe(h_new))
        else:
            measure = halting_measure(halting.rule, h_new, h, gate)
        if step + 1 >= halting.min_depth:
            running = running & ~halts(halting.rule, measure, halting.threshold)
        h = h_new
        record.step(h, o, gate)
        step += 1
    if call.cache is not None:  # every token halted: the later steps' entries are their last K/V
        for later in range(step, call.depth):
            for (kind, j), (k, v) in frozen.items():
                call.cache.update_kv(k, v, kind, j, later, call.cache_slots)
    return h, depths, None if readout is None else (readout, per_block or [], logits)
