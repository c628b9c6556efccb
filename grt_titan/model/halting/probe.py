"""Fitting the learned halting rule's probe (grt_titan/model/halting/rules.py, `HaltingProbe`) to a
trained model, which stays frozen: on the model's own readouts, no answer needed. The target at
step s is whether the readout's argmax at s is the one the last step gives and stays it
(`consistency_targets`), CALM's consistency oracle (Schuster et al. 2022, arXiv 2207.07061);
the loss is the binary cross-entropy over every step of the positions asked. docs/tasks.md, "A
learned halting rule", measures what it saves."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from .rules import LEARNED_RULE, HaltingProbe, consistency_targets


@torch.no_grad()
def step_states_and_targets(model, tokens: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the states after steps 1..depth `[depth, B, T, dim]`, the probe's targets `[depth, B, T]`)
    of an eval forward of `tokens` at `depth` steps."""
    h_pre = model.prelude(model.embed(tokens), model.freqs_cis)
    states = model.recurrence(h_pre, model.freqs_cis, depth, all_states=True).step_states
    vocab = model.model_args.vocab_size  # the padding columns are never a readout
    tops = torch.stack([model.logits_from_state(h)[..., :vocab].argmax(-1) for h in states])
    return torch.stack(states), consistency_targets(tops)


def fit_halting_probe(
    model,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor | None]],
    steps: int,
    depth: int | None = None,
    lr: float = 3e-3,
) -> tuple[HaltingProbe, list[tuple[int, float]]]:
    """(the fitted probe, its loss every 50 steps) after `steps` AdamW steps, one per
    `(tokens [B, T], positions [B, T] bool or None: every position)` of `batches`, on a frozen
    `model` read at `depth` steps (default its eval depth: the halting call's maximum depth, whose
    last step is the one the targets agree with). A model that refuses the learned rule (MoR's router chooses each
    token's steps itself) says so, in forward_with_halting's words, before any fitting."""
    if model.recurrence is None:
        raise ValueError("a halting probe needs a recurrent model; this one is dense (no core)")
    if steps < 1:
        raise ValueError(f"steps = {steps}; allowed: >= 1")
    was_training = model.training
    model.eval()
    depth = model.recurrence.resolve_depth(depth)  # eval mode: None is the eval depth
    probe = HaltingProbe(model.model_args.dim)
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr)
    log, fitted = [], 0
    for tokens, positions in batches:
        if fitted == 0:
            with torch.no_grad():
                model.forward_with_halting(tokens[:1, :1], LEARNED_RULE, 0.0, probe=probe)
        states, targets = step_states_and_targets(model, tokens, depth)
        with torch.enable_grad():  # whatever the caller's mode: the probe trains
            logits = probe(states)
            losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets.float(), reduction="none")
            loss = (losses if positions is None else losses[:, positions]).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        optimizer.step()
        fitted += 1
        if fitted % 50 == 0 or fitted == steps:
            log.append((fitted, round(loss.item(), 4)))
        if fitted == steps:
            break
    if fitted < steps:
        raise ValueError(f"batches ran out after {fitted} of {steps} steps")
    model.train(was_training)
    probe.eval()
    return probe, log


def save_halting_probe(probe: HaltingProbe, path: str | Path, fit: dict | None = None) -> Path:
    """Write `probe` (its width, weights and how it was fitted) where `grt-titan export-hf
    --halting-probe` reads it."""
    path = Path(path)
    torch.save({"dim": probe.dim, "state_dict": probe.state_dict(), "fit": fit or {}}, path)
    return path


def load_halting_probe(path: str | Path, dim: int) -> HaltingProbe:
    """The probe `save_halting_probe` wrote, for a model of width `dim`; ValueError naming the
    file where it is none, or fits another width."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--halting-probe {path}: no such file (eval-task --halting learned:X --out DIR writes one)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        probe = HaltingProbe(saved["dim"])
        probe.load_state_dict(saved["state_dict"])
    except Exception as e:  # a file that is no saved probe: torch's unpickling or a key error
        raise ValueError(f"--halting-probe {path}: not a halting probe that eval-task wrote ({e})") from e
    if probe.dim != dim:
        raise ValueError(f"--halting-probe {path} reads states of dim {probe.dim}; this model's dim is {dim}")
    return probe.eval()
