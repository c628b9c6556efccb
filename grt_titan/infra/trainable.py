"""Train only what you name: `[training] trainable` (docs/training.md, "Training a subset").

A retrofit's recurrent parts can be trained over a frozen source (arXiv 2608.11233 trains a
6M-parameter adapter over frozen base weights), and a frozen parameter must stay bitwise
what it was. Freezing is `requires_grad = False`, set after the TP plan (whose replicated and
sequence-parallel parameters are new Parameters) and before AC, FSDP2 or DDP wrap the model:
FSDP2 shards frozen and trainable parameters in one module and reduces only the
gradients that exist, DDP skips frozen ones, and torchtitan's optimizer container takes only
parameters that require grad, so the optimizer, its weight decay and its checkpointed state
hold the trainable ones alone. The model checkpoint and the export still hold every weight.

Each entry of the list is an fnmatch pattern over the model's parameter names
(`recurrence.step.gate.*`), or one of the shorthands below. A parameter is trainable when any
of its names matches (a tied head's `output.weight` names the embedding too).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn

from grt_titan.model.model import build_meta_model

ALL = "*"
KEY = "[training] trainable"
CORE = "recurrence.step.core."
ADAPTERS = "recurrence.step.adapters."

# shorthand -> the test on a parameter name (docs/training.md's table says what each trains)
SHORTHANDS = {
    "recurrent": lambda name: name.startswith("recurrence."),  # W_proj, the gate, the core, ...
    "parts": lambda name: name.startswith("recurrence.") and not name.startswith((CORE, ADAPTERS)),
    "adapter": lambda name: name.startswith(ADAPTERS),  # RRT's per-step LoRA adapters
}

NOTHING_TO_NAME = {
    "recurrent": "this model has no recurrence (a dense model)",
    "parts": "this model's recurrence has nothing outside its core (no W_proj, gate, anchor or router)",
    "adapter": 'this model has no per-step adapters: set [grt] step_adapter = "lora" (with depth_sampling = "fixed")',
}


def _names(model: nn.Module) -> dict[nn.Parameter, list[str]]:
    """Every parameter with all of its names (a tied weight has two)."""
    names: dict[nn.Parameter, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(param, []).append(name)
    return names


def _matches(entry: str, name: str) -> bool:
    if entry in SHORTHANDS:
        return SHORTHANDS[entry](name)
    return fnmatchcase(name, entry)


def configured_entries(job_config) -> list[str] | None:
    """`[training] trainable`, or None for the default (every parameter trains)."""
    entries = getattr(job_config.training, "trainable", [ALL])
    return None if entries == [ALL] else entries


def trainable_problems(model: nn.Module, entries: list[str]) -> list[str]:
    """One line per entry that cannot be meant: an empty list, an entry matching nothing."""
    if not entries:
        return [f"{KEY} = [] freezes every parameter; allowed: patterns or shorthands that name some ({_help()})"]
    names = [n for ns in _names(model).values() for n in ns]
    problems = []
    for entry in entries:
        if any(_matches(entry, n) for n in names):
            continue
        if entry in NOTHING_TO_NAME:
            why = NOTHING_TO_NAME[entry]
        else:
            firsts = (_first(names, part) for part in ("tok_embeddings.", "prelude.", "recurrence.", "coda."))
            examples = ", ".join(repr(n) for n in firsts if n)
            why = f"no parameter's name matches it (names look like {examples})"
        problems.append(f"{KEY} entry {entry!r} matches nothing: {why}; allowed: fnmatch patterns or {_help()}")
    return problems


def job_trainable_problems(job_config, args) -> list[str]:
    """`[training] trainable` checked at start-up, on the flavor's model built on the meta
    device (the real one is built after the checks); [] for the default."""
    entries = configured_entries(job_config)
    return [] if entries is None else trainable_problems(build_meta_model(args), entries)


def _first(names: list[str], prefix: str) -> str | None:
    return next((n for n in names if n.startswith(prefix)), None)


def _help() -> str:
    return "the shorthands " + ", ".join(SHORTHANDS)


def freeze_untrained(model: nn.Module, entries: list[str]) -> tuple[int, int]:
    """Set `requires_grad = False` on every parameter no entry names; (trainable, all) element
    counts. Call after the TP plan and before AC, FSDP2 or DDP wrap the model."""
    problems = trainable_problems(model, entries)
    if problems:  # the start-up check reports these first; a direct caller gets them here
        raise ValueError("; ".join(problems))
    trained = total = 0
    for param, names in _names(model).items():
        keep = any(_matches(e, n) for e in entries for n in names)
        param.requires_grad_(keep)
        total += param.numel()
        trained += param.numel() if keep else 0
    return trained, total
