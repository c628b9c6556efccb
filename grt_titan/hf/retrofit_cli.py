"""`grt-titan retrofit`: the command (docs/retrofit.md).

    grt-titan retrofit SRC --out DIR [--prelude P] [--core A:B] [--coda C] [--recurrences R] [--init INIT]
    grt-titan retrofit SRC --plan [--data NAME|PATH] [--tokens N] [--plan-json FILE]

The retrofit itself is grt_titan/hf/retrofit.py; `--plan`'s measurement grt_titan/hf/retrofit_plan.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from grt_titan.run_reader import CheckpointError

from .retrofit import (
    DEFAULT_INIT,
    DEFAULT_RECURRENCES,
    GATE_CLOSED_BIAS,
    RETROFIT_INITS,
    RetrofitError,
    plan_layers,
    write_retrofit,
)
from .retrofit_plan import DEFAULT_TOKENS, run_plan
from .stock_folders import n_dense_layers, read_stock_config, source_args


def _core_range(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    if not sep or not a.strip().lstrip("-").isdigit() or not b.strip().lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"--core {text!r}: expected A:B (source layers A..B-1)")
    return int(a), int(b)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grt-titan retrofit",
        description="Split a pretrained GPT-2 / Llama / Qwen3 Hugging Face folder into a GRT that starts at the source.",
    )
    p.add_argument("src", help="local Hugging Face model folder (config.json, safetensors, tokenizer.json)")
    p.add_argument("--out", help="folder to create: model/, model_args.json, train.toml, retrofit.json")
    p.add_argument("--prelude", type=int, default=None, help="P: source layers 0..P-1 form the prelude")
    p.add_argument("--core", type=_core_range, default=None, help="A:B: source layers A..B-1 form the shared core")
    p.add_argument("--coda", type=int, default=None, help="C: the last C source layers form the coda")
    p.add_argument(
        "--recurrences",
        type=int,
        default=DEFAULT_RECURRENCES,
        help=f"R, [grt] num_recurrences (default {DEFAULT_RECURRENCES})",
    )
    p.add_argument(
        "--init",
        choices=list(RETROFIT_INITS),
        default=DEFAULT_INIT,
        help="W_proj and the gate at the start: " + "; ".join(f"{k}: {v}" for k, v in RETROFIT_INITS.items()),
    )
    p.add_argument("--min-recurrences", type=int, default=None, help="r_min, [grt] min_recurrences (default 1)")
    p.add_argument("--state-noise-std", type=float, default=None, help="[grt] state_noise_std (default 0.1)")
    p.add_argument("--gate-noise-std", type=float, default=None, help="[grt] gate_noise_std (default 0.1)")
    p.add_argument(
        "--vocab-multiple-of",
        type=int,
        default=None,
        help="[grt] vocab_multiple_of: pad the embedding / head rows (zero rows) for even TP shards",
    )
    p.add_argument(
        "--gate-bias",
        type=float,
        default=GATE_CLOSED_BIAS,
        help=f"B: the closed gate's bias -B (default {GATE_CLOSED_BIAS:g})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the gate's first layer (its only random weights)")
    p.add_argument(
        "--task-recipe",
        action="store_true",
        help="also write task.toml: per-step supervision on a chat-rendered multi-step task, then answers alone",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    plan = p.add_argument_group("--plan: measure candidate splits, write nothing")
    plan.add_argument("--plan", action="store_true", help="print each candidate split's loss at r = 1..R")
    plan.add_argument(
        "--data", default="grt_default", help="grt_default or a `grt-titan prepare` folder (its val split)"
    )
    plan.add_argument(
        "--tokens", type=int, default=DEFAULT_TOKENS, help=f"tokens of the sample (default {DEFAULT_TOKENS})"
    )
    plan.add_argument(
        "--heal-steps",
        type=int,
        default=0,
        help="train each candidate this many steps (one sequence each, of the data's train split) and score it again",
    )
    plan.add_argument("--plan-json", default=None, help="also write the table as JSON to this file")
    return p


def _grt_options(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "num_recurrences": a.recurrences,
        "min_recurrences": a.min_recurrences,
        "state_noise_std": a.state_noise_std,
        "gate_noise_std": a.gate_noise_std,
        "vocab_multiple_of": a.vocab_multiple_of,
    }


def _plan(a: argparse.Namespace) -> None:
    if a.out is not None:
        raise RetrofitError(f"--plan writes nothing, so --out {a.out} is not used; drop --out (or --plan to retrofit)")
    given = None
    if (a.prelude, a.core, a.coda) != (None, None, None):
        source = source_args(read_stock_config(Path(a.src)))
        plan = plan_layers(n_dense_layers(source), a.prelude, a.core, a.coda)
        given = (len(plan.prelude), (plan.core[0], plan.core[-1] + 1), len(plan.coda))
    run_plan(
        a.src,
        given,
        data=a.data,
        tokens=a.tokens,
        init=a.init,
        plan_json=a.plan_json,
        heal_steps=a.heal_steps,
        **_grt_options(a),
    )


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.plan and a.task_recipe:
            raise RetrofitError("--task-recipe writes task.toml beside a retrofit's --out; --plan writes nothing")
        if a.plan:
            _plan(a)
            return 0
        if a.out is None:
            raise RetrofitError("--out is required (the folder to create), unless --plan measures splits")
        if a.plan_json is not None:
            raise RetrofitError(f"--plan-json {a.plan_json} is written by --plan only; add --plan")
        if a.heal_steps:
            raise RetrofitError(f"--heal-steps {a.heal_steps} heals --plan's candidates only; add --plan")
        out = write_retrofit(
            a.src,
            a.out,
            prelude=a.prelude,
            core=a.core,
            coda=a.coda,
            overwrite=a.overwrite,
            seed=a.seed,
            gate_bias=a.gate_bias,
            init=a.init,
            task_recipe=a.task_recipe,
            **_grt_options(a),
        )
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"grt-titan retrofit: error: {e}", file=sys.stderr)
        return 1
    recipe = f", task recipe: {out / 'task.toml'}" if a.task_recipe else ""
    print(f"retrofitted {a.src} -> {out} (train: {out / 'train.toml'}{recipe})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
