"""`grt-titan import-hf`: an exported Hugging Face folder -> a torchtitan checkpoint.

    grt-titan import-hf --hf-dir exports/grt_debug \
        --out outputs/grt_ft/checkpoint/step-0 [--config train_configs/grt_debug.toml]

Writes a DCP model-only checkpoint (model FQNs at the top level, fp32), which torchtitan
loads as its step-0 checkpoint (`<dump>/<checkpoint.folder>/step-0`) or through
`[checkpoint] initial_load_path = <out>` with `initial_load_model_only = true`.
Export -> import is exact for float32 exports; the depth sampler's counter
(`recurrence.depth_sampler.draws`, never exported) starts at 0. With `vocab_multiple_of` > 1 the
embedding / LM head rows beyond vocab_size (not exported) are imported as zeros, so
export -> import -> export gives the same weights.

A stock GPT-2 / Llama / Qwen3 folder (config.json model_type "gpt2" / "llama" / "qwen3": what
export-hf writes for a dense model, or a transformers model of that architecture) imports as the
dense model (grt_titan/hf/stock_folders.py, the one reader of stock folders, which the retrofit uses
too); settings grt_titan's blocks cannot compute are refused by name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grt_titan.checkpoints.hf_weights import read_hf_weights
from grt_titan.checkpoints.load import model_from_state, native_state_from_hf, save_checkpoint
from grt_titan.model.args import GRTModelArgs
from grt_titan.run_reader import CheckpointError, OverridesParser, check_overrides_have_config, load_model_args
from grt_titan.runtime.atomic_dir import atomic_directory

from .config_map import model_args_from_hf_config
from .convert import ExportError
from .stock_folders import dense_args_from_stock_config, is_stock_config, stock_to_native_state_dict

# Fields that fix the weights' names and shapes: a --config must agree on them.
# `vocab_multiple_of` is not one: the HF weights have vocab_size rows whatever the padding,
# and the import pads them (zero rows) to the --config's (or the export's) padded_vocab_size.
ARCHITECTURE_FIELDS = (
    "block_style",
    "dim",
    "n_heads",
    "n_kv_heads",
    "vocab_size",
    "n_prelude_layers",
    "n_core_layers",
    "n_coda_layers",
    "gate_hidden_dim",
    "injection",
    "update",
    "step_adapter",
    "lora_rank",
    "objective",  # Ouro's exit gate is a weight
    "router",  # MoR's routers are weights
    "multiple_of",
    "ffn_dim_multiplier",
    "ffn_dim",  # a retrofitted source's explicit sizes (grt_titan/hf/retrofit.py)
    "attention_head_dim",
    "tie_word_embeddings",
)


def _check_against_config(
    hf_args: GRTModelArgs, config_file: str | Path, stock: bool = False, overrides: tuple[str, ...] | list[str] = ()
) -> GRTModelArgs:
    cfg_args, _ = load_model_args(config_file, overrides)
    fields = list(ARCHITECTURE_FIELDS)
    if stock:  # a stock config.json gives the MLP and head widths and the tying, not how the args spell them
        spellings = ("multiple_of", "ffn_dim_multiplier", "ffn_dim", "tie_word_embeddings", "attention_head_dim")
        fields = [f for f in fields if f not in spellings] + ["ffn_hidden_dim", "tie_embeddings", "head_dim"]
    if cfg_args.block_style == "gpt2":
        fields.append("max_seq_len")  # learned positions are weights
    diffs = [
        f"{f}: HF {getattr(hf_args, f)!r} vs config {getattr(cfg_args, f)!r}"
        for f in fields
        if getattr(hf_args, f) != getattr(cfg_args, f)
    ]
    if diffs:
        raise ExportError(f"{config_file} does not describe this model: " + "; ".join(diffs))
    return cfg_args


def import_hf(
    hf_dir: str | Path,
    out: str | Path,
    config_file: str | Path | None = None,
    overwrite: bool = False,
    overrides: tuple[str, ...] | list[str] = (),
) -> Path:
    """Convert the HF folder `hf_dir` into a torchtitan DCP checkpoint folder `out`."""
    check_overrides_have_config(config_file, overrides)
    hf_dir, out = Path(hf_dir), Path(out)
    if not (hf_dir / "config.json").is_file():
        raise ExportError(f"{hf_dir}: no config.json (not an exported Hugging Face folder)")
    if out.exists() and not overwrite:
        raise ExportError(f"output folder {out} already exists (pass --overwrite to replace it)")
    try:
        config = json.loads((hf_dir / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ExportError(f"{hf_dir / 'config.json'}: not valid JSON: {e}") from e
    stock = is_stock_config(config)
    args = dense_args_from_stock_config(config) if stock else model_args_from_hf_config(config)
    if config_file is not None:
        args = _check_against_config(args, config_file, stock, overrides)
    if stock:
        model = model_from_state(stock_to_native_state_dict(read_hf_weights(hf_dir), args), args)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # fp32, as native_state_from_hf
    else:
        state = native_state_from_hf(read_hf_weights(hf_dir), args)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out, overwrite) as tmp:
        save_checkpoint(tmp, state)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = OverridesParser(
        prog="grt-titan import-hf",
        description="Convert an exported GRT Hugging Face folder (or a stock GPT-2 / Llama / Qwen3 one, as a dense "
        "model) back to a torchtitan checkpoint.",
    )
    p.add_argument(
        "--hf-dir", required=True, help="folder written by grt-titan export-hf, or a stock GPT-2 / Llama / Qwen3 folder"
    )
    p.add_argument("--out", required=True, help="checkpoint folder to create, e.g. <dump>/checkpoint/step-0")
    p.add_argument(
        "--config",
        default=None,
        help="training TOML to check the model against (flavor and [grt] overrides; the run's command-line "
        "overrides may follow the other options), or a run's grt_run.json or dump folder",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = import_hf(args.hf_dir, args.out, args.config, overwrite=args.overwrite, overrides=args.overrides)
    except (CheckpointError, FileNotFoundError) as e:
        print(f"grt-titan import-hf: error: {e}", file=sys.stderr)
        return 1
    print(f"imported {args.hf_dir} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
