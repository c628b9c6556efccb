"""`grt-titan analyze`: the paper's appendix-E figures for your checkpoint.

    grt-titan analyze outputs/grt_debug/checkpoint/step-60 \
        --config train_configs/grt_debug.toml --data grt_default --out analysis/grt_debug
    grt-titan analyze exports/grt_debug --data data/my_corpus --out analysis/grt_debug

Writes analysis.json and fig3_early_exit.png, fig9_loss_kl.png, fig10_gate.png,
fig11_updates.png, fig8_gate_heatmap.png, fig3_halting.png (per-token halting's
quality-compute curves), step_dynamics.png (docs/observability.md explains each).
"""

from __future__ import annotations

import argparse
import sys

from grt_titan.analysis.diagnostics import best_against_fixed_depth
from grt_titan.analysis.report import DEFAULT_PROMPTS, JSON_NAME, NOT_ASKED, PLOTS
from grt_titan.model.halting.rules import HALTING_RULES
from grt_titan.run_reader import OverridesParser


def build_parser() -> argparse.ArgumentParser:
    p = OverridesParser(
        prog="grt-titan analyze",
        description="Per-recurrence-step diagnostics of a trained GRT (paper figures 3, 8-11) "
        "and per-token halting's quality-compute curves.",
    )
    p.add_argument(
        "model",
        help="checkpoint step folder (or its checkpoint/ parent: latest step) "
        "with --config, or an exported Hugging Face folder",
    )
    p.add_argument(
        "--config",
        help="training TOML (flavor, [grt] overrides, tokenizer, dataset; the run's command-line overrides may "
        "follow the other options), or a run's grt_run.json or dump folder",
    )
    p.add_argument(
        "--data",
        help="prepared dataset folder (`grt-titan prepare`) or 'grt_default'; "
        "default: the config's [validation] dataset, else grt_default",
    )
    p.add_argument("--split", default="val", help="split to score (default: val)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--num-sequences", type=int, default=32, help="sequences scored (default 32)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, help="default: the config's validation seq_len, else min(1024, max_seq_len)")
    p.add_argument("--max-depth", type=int, help="deepest r scored (default R + 2)")
    p.add_argument(
        "--prompt",
        action="append",
        dest="prompts",
        help="prompt for the gate heatmap (repeatable; default: four example prompts)",
    )
    halting = p.add_mutually_exclusive_group()
    halting.add_argument(
        "--halting-rules",
        nargs="+",
        choices=HALTING_RULES,
        help="rules of the per-token halting sweep (default: all the model supports; "
        "one forward per batch and threshold)",
    )
    halting.add_argument("--no-halting", action="store_true", help="no per-token halting sweep")
    p.add_argument("--halting-min-depth", type=int, default=1, help="minimum depth a of the halting sweep (default 1)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from grt_titan.analysis.load import load_model
    from grt_titan.analysis.report import analyze
    from grt_titan.data.config import DataConfig
    from grt_titan.data.loader import TokenSequenceDataset, data_config, open_dataset_split

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        loaded = load_model(args.model, args.config, device=device, overrides=args.overrides)
        job_config = loaded.job_config
        data_cfg = data_config(job_config) if job_config is not None else DataConfig()
        dataset_name, dataset_path = args.data, None
        if dataset_name is None and job_config is not None:
            dataset_name, dataset_path = job_config.validation.dataset, job_config.validation.dataset_path
        dataset_name = dataset_name or "grt_default"
        seq_len = args.seq_len or (
            job_config.validation.seq_len if job_config is not None else min(1024, loaded.args.max_seq_len)
        )
        stream = open_dataset_split(dataset_name, dataset_path, args.split, loaded.tokenizer, data_cfg, "analyze")
        dataset = TokenSequenceDataset(stream, seq_len, dp_rank=0, dp_world_size=1, seed=0, shuffle=False)
        result = analyze(
            loaded.model,
            loaded.tokenizer,
            dataset,
            args.out,
            num_sequences=args.num_sequences,
            batch_size=args.batch_size,
            max_depth=args.max_depth,
            prompts=args.prompts or DEFAULT_PROMPTS,
            source=loaded.source,
            progress=not args.no_progress,
            halting_rules=() if args.no_halting else args.halting_rules,
            halting_min_depth=args.halting_min_depth,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"grt-titan analyze: error: {e}", file=sys.stderr)
        return 2
    losses = result["early_exit"]["loss"]
    print("loss by depth r: " + "  ".join(f"{r}: {v:.4f}" for r, v in enumerate(losses)))
    for rule, curve in result["halting"]["rules"].items():
        i = best_against_fixed_depth(curve)
        if i is None:
            print(f"halting {rule!r}: no swept point reaches the loss of a fixed depth")
            continue
        ratio = curve["forward_flops_per_token"][i] / curve["fixed_depth_flops_per_token"][i]
        print(
            f"halting {rule!r}: at best {ratio:.3f}x the forward FLOPs of a fixed depth at the same loss "
            f"(threshold {curve['thresholds'][i]:g}: loss {curve['loss'][i]:.4f}, mean depth {curve['mean_depth'][i]:.2f})"
        )
    for rule, reason in result["halting"]["skipped"].items():
        if reason != NOT_ASKED:
            print(f"halting sweep: no {rule!r} rule: {reason}")
    print(f"wrote {args.out}/{JSON_NAME} and " + ", ".join(PLOTS.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
