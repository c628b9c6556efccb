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
from grt_titan.model.halting import HALTING_RULES
from grt_titan.model.step_stats import GATE_QUANTILES, quantile_key

GATE_QUANTILE_KEYS = tuple(quantile_key(q) for q in GATE_QUANTILES)

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
    recurrence = require_recurrence(model)
    args = model.model_args
    R = args.num_recurrences
    final_depth = recurrence.eval_recurrences
    max_depth = max(R + 2, final_depth) if max_depth is None else max_depth
    if max_depth < max(final_depth, 1):
        raise ValueError(f"--max-depth {max_depth} must be >= the final (eval) depth {final_depth} and >= 1")
    num_sequences = min(num_sequences, len(dataset))
    if num_sequences < 1:
        raise ValueError("no validation sequences to score")
    seq_len = dataset.seq_len
    device = next(model.parameters()).device
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    acc = DepthAnalysis(max_depth=max_depth, final_depth=final_depth)
    asked = HALTING_RULES if halting_rules is None else tuple(halting_rules)
    sweep = HaltingSweep(min_depth=halting_min_depth, max_depth=max_depth, rules=asked)
    sweep.skip(model)
    sweep.skipped.update({rule: NOT_ASKED for rule in HALTING_RULES if rule not in asked})
    n_batches = math.ceil(num_sequences / batch_size)
    with _progress(n_batches * (1 + sweep.points) + len(prompts), progress, "analyze") as bar:
        for inputs, labels in batches(dataset, num_sequences, batch_size):
            inputs, labels = inputs.to(device), labels.to(device)
            acc.add_batch(model, inputs, labels)
            bar.update(1)
            sweep.add_batch(model, inputs, labels)
            bar.update(sweep.points)
        heatmaps = []
        for text in prompts:
            ids = tokenizer.encode(text)[: args.max_seq_len]
            if not ids or max(ids) >= args.vocab_size:
                raise ValueError(
                    f"prompt {text!r} encodes to no tokens or to ids >= the vocabulary size {args.vocab_size}"
                )
            heatmaps.append(
                {
                    "text": text,
                    "token_ids": ids,
                    "tokens": [tokenizer.decode([i]) for i in ids],
                    "gate_mean": gate_heatmap(model, ids, final_depth),
                }
            )
            bar.update(1)

    per = acc.result()
    depths = list(range(max_depth + 1))
    steps = list(range(1, max_depth + 1))
    flops = [args.forward_flops_per_token(seq_len, r) for r in depths]
    layers = [args.n_prelude_layers + r * args.n_core_layers + args.n_coda_layers for r in depths]
    result: dict[str, Any] = {
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
        "gate": {
            "steps": steps,
            **{
                k: per[k]
                for k in (  # figure 10
                    "gate_mean",
                    "gate_std",
                    *GATE_QUANTILE_KEYS,
                    "gate_copy_frac",
                    "gate_write_frac",
                    "update_ratio",
                )
            },
        },
        "updates": {
            "steps": steps,
            **{
                k: per[k]
                for k in (  # figure 11 (+ 14b)
                    "update_norm",
                    "proposal_norm",
                    "state_cosine",
                    "proposal_cosine",
                    "relative_update",
                )
            },
        },
        "gate_heatmaps": {"depth": final_depth, "prompts": heatmaps},  # figure 8
        "halting": sweep.result(args, seq_len, fixed_loss=per["loss"]),  # figure 3's axes
        "step_dynamics": {"steps": steps, **{k: per[k] for k in STEP_DYNAMICS}},
        "plots": dict(PLOTS),
    }

    figures = {
        "early_exit": plots.early_exit_figure(
            depths, per["loss"], flops, layers, R, title=f"{result['model']['layout']}, seq_len {seq_len}"
        ),
        "convergence": plots.convergence_figure(depths, per["loss"], per["kl_to_final"], final_depth),
        "gate": plots.gate_figure(
            steps,
            per["gate_mean"],
            {q: per[quantile_key(q)] for q in GATE_QUANTILES},
            per["gate_copy_frac"],
            per["gate_write_frac"],
            per["update_ratio"],
        ),
        "updates": plots.updates_figure(
            steps,
            per["update_norm"],
            per["proposal_norm"],
            per["state_cosine"],
            per["proposal_cosine"],
            per["relative_update"],
        ),
        "gate_heatmaps": plots.gate_heatmap_figure(heatmaps),
        "halting": plots.halting_figure(
            depths,
            per["loss"],
            flops,
            R,
            result["halting"]["rules"],
            halting_min_depth,
            max_depth,
            title=f"{result['model']['layout']}, seq_len {seq_len}",
        ),
        "step_dynamics": plots.step_dynamics_figure(
            steps, per["decision_margin"], per["angle_degrees"], per["radial_share"], R
        ),
    }
    for name, fig in figures.items():
        plots.save(fig, out / PLOTS[name])
    (out / JSON_NAME).write_text(json.dumps(result, indent=1) + "\n")
    return result
