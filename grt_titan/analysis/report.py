"""`analyze()`: score a model on validation batches and prompts, write the JSON and PNGs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from grt_titan import plots
from grt_titan.analysis.diagnostics import (
    STEP_DYNAMICS,
    DepthAnalysis,
    HaltingSweep,
    batches,
    gate_heatmap,
    require_recurrence,
)
from grt_titan.model.halting.rules import HALTING_RULES
from grt_titan.model.step_stats import GATE_QUANTILES, quantile_key

GATE_QUANTILE_KEYS = tuple(quantile_key(q) for q in GATE_QUANTILES)
# The per-step series of figure 10 (the gate) and figure 11 (+ 14b: the updates) in the JSON.
GATE_KEYS = ("gate_mean", "gate_std", *GATE_QUANTILE_KEYS, "gate_copy_frac", "gate_write_frac", "update_ratio")
UPDATE_KEYS = ("update_norm", "proposal_norm", "state_cosine", "proposal_cosine", "relative_update")

# Prompts of paper figure 8 (the two it names) plus two of the same kinds.
DEFAULT_PROMPTS = (
    "The old man sat by the",
    "def add(a, b):\n    return a +",
    "The capital of France is",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
)

PLOTS = {
    "early_exit": "fig3_early_exit.png",
    "convergence": "fig9_loss_kl.png",
    "gate": "fig10_gate.png",
    "updates": "fig11_updates.png",
    "gate_heatmaps": "fig8_gate_heatmap.png",
    "halting": "fig3_halting.png",
    "step_dynamics": "step_dynamics.png",
}
JSON_NAME = "analysis.json"
NOT_ASKED = "not asked (--halting-rules, --no-halting)"


def _progress(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="forward", dynamic_ncols=True)


def analyze(
    model: torch.nn.Module,
    tokenizer,
    dataset,
    out: str | Path,
    num_sequences: int = 32,
    batch_size: int = 4,
    max_depth: int | None = None,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    source: dict[str, Any] | None = None,
    progress: bool = True,
    halting_rules: Sequence[str] | None = None,
    halting_min_depth: int = 1,
) -> dict[str, Any]:
    """Write `analysis.json` and the PNGs of `PLOTS` into `out`; return the JSON dict.

    Args:
        model: A GRTModel (single device); put in eval mode here.
        dataset: A TokenSequenceDataset (its first `num_sequences` sequences are scored).
        max_depth: Deepest r scored (default R + 2, at least the eval depth); the maximum
            depth b of the halting sweep.
        prompts: Texts for the per-token gate heatmaps (figure 8).
        halting_rules: Rules of the halting sweep (default every rule of HALTING_RULES the
            model supports; empty: no sweep), one forward per batch and threshold.
        halting_min_depth: The sweep's minimum depth a.
    """
    model.eval()
    final_depth = require_recurrence(model).eval_recurrences
    max_depth = _max_depth(max_depth, model.model_args.num_recurrences, final_depth)
    num_sequences = min(num_sequences, len(dataset))
    if num_sequences < 1:
        raise ValueError("no validation sequences to score")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    acc = DepthAnalysis(max_depth=max_depth, final_depth=final_depth)
    sweep = _halting_sweep(model, halting_rules, halting_min_depth, max_depth)
    n_batches = math.ceil(num_sequences / batch_size)
    with _progress(n_batches * (1 + sweep.points) + len(prompts), progress, "analyze") as bar:
        _score_batches(model, dataset, num_sequences, batch_size, acc, sweep, bar)
        heatmaps = []
        for text in prompts:
            heatmaps.append(_prompt_heatmap(model, tokenizer, text, final_depth))
            bar.update(1)

    result = _result(model, dataset.seq_len, acc, sweep, heatmaps, source)
    for name, fig in _figures(result).items():
        plots.save(fig, out / PLOTS[name])
    (out / JSON_NAME).write_text(json.dumps(result, indent=1) + "\n")
    return result


# ---- the steps of analyze -------------------------------------------------------------


def _max_depth(max_depth: int | None, R: int, final_depth: int) -> int:
    """The deepest r scored: `max_depth`, by default R + 2 (at least the final depth)."""
    max_depth = max(R + 2, final_depth) if max_depth is None else max_depth
    if max_depth < max(final_depth, 1):
        raise ValueError(f"--max-depth {max_depth} must be >= the final (eval) depth {final_depth} and >= 1")
    return max_depth


def _halting_sweep(
    model: torch.nn.Module, halting_rules: Sequence[str] | None, min_depth: int, max_depth: int
) -> HaltingSweep:
    """The halting sweep of the asked rules; the others, and those the model cannot run,
    recorded as skipped with the reason."""
    asked = HALTING_RULES if halting_rules is None else tuple(halting_rules)
    sweep = HaltingSweep(min_depth=min_depth, max_depth=max_depth, rules=asked)
    sweep.skip(model)
    sweep.skipped.update({rule: NOT_ASKED for rule in HALTING_RULES if rule not in asked})
    return sweep


def _score_batches(model, dataset, num_sequences: int, batch_size: int, acc: DepthAnalysis, sweep: HaltingSweep, bar):
    """Score the first `num_sequences` validation sequences at every depth and under every
    halting threshold (one forward each, counted on `bar`)."""
    device = next(model.parameters()).device
    for inputs, labels in batches(dataset, num_sequences, batch_size):
        inputs, labels = inputs.to(device), labels.to(device)
        acc.add_batch(model, inputs, labels)
        bar.update(1)
        sweep.add_batch(model, inputs, labels)
        bar.update(sweep.points)


def _prompt_heatmap(model, tokenizer, text: str, final_depth: int) -> dict[str, Any]:
    """Figure 8's row of one prompt: its tokens and the gate's mean per token and step."""
    args = model.model_args
    ids = tokenizer.encode(text)[: args.max_seq_len]
    if not ids or max(ids) >= args.vocab_size:
        raise ValueError(f"prompt {text!r} encodes to no tokens or to ids >= the vocabulary size {args.vocab_size}")
    return {
        "text": text,
        "token_ids": ids,
        "tokens": [tokenizer.decode([i]) for i in ids],
        "gate_mean": gate_heatmap(model, ids, final_depth),
    }


def _result(
    model, seq_len: int, acc: DepthAnalysis, sweep: HaltingSweep, heatmaps: list, source: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON dict: the model, the data scored and one section per figure (`PLOTS`' keys)."""
    args, per = model.model_args, acc.result()
    R, final_depth = args.num_recurrences, acc.final_depth
    depths = list(range(acc.max_depth + 1))
    steps = list(range(1, acc.max_depth + 1))
    flops = [args.forward_flops_per_token(seq_len, r) for r in depths]
    layers = [args.n_prelude_layers + r * args.n_core_layers + args.n_coda_layers for r in depths]
    return {
        "model": {
            **(source or {}),
            "layout": f"{args.n_prelude_layers} + {args.n_core_layers}x{R} + {args.n_coda_layers}",
            "dim": args.dim,
            "num_recurrences": R,
            "final_depth": final_depth,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "data": {"sequences": acc.sequences, "seq_len": seq_len, "tokens": acc.tokens},
        "early_exit": {  # figure 3
            "depths": depths,
            "loss": per["loss"],
            "layer_depth": layers,
            "forward_flops_per_token": flops,
        },
        "convergence": {  # figure 9
            "depths": depths,
            "loss": per["loss"],
            "kl_to_final": per["kl_to_final"],
            "final_depth": final_depth,
        },
        "gate": {"steps": steps, **{k: per[k] for k in GATE_KEYS}},
        "updates": {"steps": steps, **{k: per[k] for k in UPDATE_KEYS}},
        "gate_heatmaps": {"depth": final_depth, "prompts": heatmaps},  # figure 8
        "halting": sweep.result(args, seq_len, fixed_loss=per["loss"]),  # figure 3's axes
        "step_dynamics": {"steps": steps, **{k: per[k] for k in STEP_DYNAMICS}},
        "plots": dict(PLOTS),
    }


def _figures(result: dict[str, Any]) -> dict[str, Any]:
    """Each figure of `PLOTS`, drawn from its section of the JSON dict."""
    R = result["model"]["num_recurrences"]
    title = f"{result['model']['layout']}, seq_len {result['data']['seq_len']}"
    early, convergence, halting = result["early_exit"], result["convergence"], result["halting"]
    gate, updates, dynamics = result["gate"], result["updates"], result["step_dynamics"]
    depths, loss, flops = early["depths"], early["loss"], early["forward_flops_per_token"]
    return {
        "early_exit": plots.early_exit_figure(depths, loss, flops, early["layer_depth"], R, title=title),
        "convergence": plots.convergence_figure(depths, loss, convergence["kl_to_final"], convergence["final_depth"]),
        "gate": plots.gate_figure(
            gate["steps"],
            gate["gate_mean"],
            {q: gate[quantile_key(q)] for q in GATE_QUANTILES},
            gate["gate_copy_frac"],
            gate["gate_write_frac"],
            gate["update_ratio"],
        ),
        "updates": plots.updates_figure(
            updates["steps"],
            updates["update_norm"],
            updates["proposal_norm"],
            updates["state_cosine"],
            updates["proposal_cosine"],
            updates["relative_update"],
        ),
        "gate_heatmaps": plots.gate_heatmap_figure(result["gate_heatmaps"]["prompts"]),
        "halting": plots.halting_figure(
            depths, loss, flops, R, halting["rules"], halting["min_depth"], halting["max_depth"], title=title
        ),
        "step_dynamics": plots.step_dynamics_figure(
            dynamics["steps"],
            dynamics["decision_margin"],
            dynamics["angle_degrees"],
            dynamics["radial_share"],
            R,
            anchor=dynamics["anchor_response"],
        ),
    }
