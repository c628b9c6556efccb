"""`grt-titan export-hf`: a torchtitan checkpoint step folder -> a Hugging Face folder.

    grt-titan export-hf --checkpoint outputs/grt_debug/checkpoint \
        --config train_configs/grt_debug.toml --out exports/grt_debug

The checkpoint is a step folder or a `checkpoint/` folder (its latest step). The config gives
the flavor and `[grt]` overrides (the architecture): a training TOML, or the run record
`<dump_folder>/grt_run.json` (or the dump folder) that either torchtitan host writes, read by
grt_titan/run_reader.py. The checkpoint may be a DCP step folder (full or model-only) or the
HF-named safetensors that `[checkpoint] last_save_in_hf = true` writes. See docs/hf_export.md.

`--format`: `auto` (default) writes a dense model (no core) as the stock transformers class
of its block style (GPT2LMHeadModel / LlamaForCausalLM / Qwen3ForCausalLM,
grt_titan/hf/stock_folders.py) and a recurrent one as model_type "grt" (remote code); `stock` and
`grt` force one (`stock` refuses a model without a stock form in one line). A dense model
that `auto` cannot write as stock falls back to "grt" with a note on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from grt_titan.checkpoints.folders import latest_step_folder
from grt_titan.checkpoints.load import load_checkpoint
from grt_titan.model.halting.probe import load_halting_probe
from grt_titan.run_reader import CheckpointError, OverridesParser, RunView, load_model_args
from grt_titan.tokenizer import resolve_tokenizer_source

from .convert import DEFAULT_MAX_SHARD_SIZE, ExportError, check_exportable, write_hf_folder
from .stock_folders import STOCK_CLASSES, check_stock_exportable, stock_export_problems, write_stock_folder

EXPORT_FORMATS = ("auto", "stock", "grt")


def tensorboard_scalar(checkpoint: Path, view: RunView, tag: str, step: int | None) -> tuple[int, float] | None:
    """(step, value) of the last `tag` scalar at or before `step` in the run's TensorBoard logs
    (`<dump>/<save_tb_folder>`, the dump being the checkpoint's grandparent or the TOML's)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return None
    dump_candidates = [checkpoint.parent.parent, Path(view.job.dump_folder)]
    best: tuple[int, float] | None = None
    for dump in dump_candidates:
        tb_root = dump / view.metrics.save_tb_folder
        if not tb_root.is_dir():
            continue
        run_dirs = {p.parent for p in tb_root.rglob("events.out.tfevents.*")}
        for run in sorted(run_dirs):
            try:
                acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
                acc.Reload()
                if tag not in acc.Tags().get("scalars", []):
                    continue
                for event in acc.Scalars(tag):
                    if step is not None and event.step > step:
                        continue
                    if best is None or event.step >= best[0]:
                        best = (event.step, float(event.value))
            except Exception:  # noqa: BLE001  best effort: the card then says "unknown"
                continue
        if best is not None:
            break
    return best


def training_tokens(checkpoint: Path, view: RunView, facts: dict[str, Any]) -> tuple[int | None, str]:
    """Tokens trained on up to the checkpoint's step, and where the number comes from.

    In order: torchtitan's logged `n_tokens_seen` at that step (summed over data-parallel
    ranks); step x `[training] global_batch_size` x `seq_len` when the TOML fixes the global
    batch; the count in the checkpoint's `train_state` (data-parallel rank 0's tokens, what
    torchtitan saves).
    """
    step = facts.get("step")
    if step is not None:
        logged = tensorboard_scalar(checkpoint, view, "n_tokens_seen", step)
        if logged is not None and logged[0] == step:
            return int(logged[1]), "n_tokens_seen in the run's TensorBoard log"
        training = view.training
        if training.global_batch_size > 0:
            return (
                step * training.global_batch_size * training.seq_len,
                "steps x global_batch_size x seq_len of the config",
            )
    if facts.get("tokens_seen") is not None:
        return facts["tokens_seen"], "train_state of the checkpoint: data-parallel rank 0's tokens"
    return None, f"no n_tokens_seen logged at step {step}, global batch not fixed in the config"


def resolve_format(args, fmt: str = "auto") -> str:
    """What `--format fmt` writes for `args`, "stock" or "grt" (module docstring)."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"format = {fmt!r}; allowed: {list(EXPORT_FORMATS)}")
    if fmt == "stock":
        check_stock_exportable(args)
        return "stock"
    if fmt == "grt" or args.is_recurrent:
        return "grt"
    problems = stock_export_problems(args)
    if problems:
        print(
            "grt-titan export-hf: note: this dense model has no stock transformers form ("
            + "; ".join(problems)
            + "); exporting as model_type 'grt' (trust_remote_code), as --format grt would",
            file=sys.stderr,
        )
        return "grt"
    return "stock"


def export_checkpoint(
    checkpoint: str | Path,
    config_file: str | Path,
    out: str | Path,
    dtype: str = "float32",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    tokenizer_path: str | Path | None = None,
    validation_loss: float | None = None,
    validation_step: int | None = None,
    overwrite: bool = False,
    verify: bool = True,
    fmt: str = "auto",
    overrides: tuple[str, ...] | list[str] = (),
    halting_probe: str | Path | None = None,
) -> Path:
    """Export `checkpoint` (a step folder, or a checkpoint folder: its latest step), trained
    with `config_file` (a TOML with the run's command-line `overrides`, or the run's record or
    dump folder), to the HF folder `out` (parent folders are created); `fmt`: `--format`;
    `halting_probe`: a probe file eval-task wrote, held by the export (`--halting-probe`)."""
    checkpoint = latest_step_folder(Path(checkpoint))
    out = Path(out)
    if out.exists() and not overwrite:  # fail before the (slow) checkpoint read
        raise ExportError(f"output folder {out} already exists (pass --overwrite to replace it)")
    args, view = load_model_args(config_file, overrides)
    fmt = resolve_format(args, fmt)  # before the (slow) checkpoint read
    if fmt == "grt":
        check_exportable(args)
    probe = None
    if halting_probe is not None:
        if fmt != "grt":
            raise ExportError(f"--halting-probe {halting_probe}: a stock (dense) export has no recurrence to halt")
        try:
            probe = load_halting_probe(halting_probe, args.dim)
        except ValueError as e:
            raise ExportError(str(e)) from e
    if tokenizer_path is None:
        tokenizer_path = resolve_tokenizer_source(getattr(view.model, "hf_assets_path", None))
    native, facts = load_checkpoint(checkpoint, args)
    if validation_loss is None:
        found = tensorboard_scalar(checkpoint, view, "validation_metrics/loss", facts.get("step"))
        if found is not None:
            validation_step, validation_loss = found
    tokens, tokens_source = training_tokens(checkpoint, view, facts)
    card: dict[str, Any] = {
        "flavor": view.model.flavor,
        "config_file": portable_path(config_file),
        "source_checkpoint": portable_path(checkpoint),
        "step": facts.get("step"),
        "tokens_seen": tokens,
        "tokens_source": tokens_source,
        "validation_loss": validation_loss,
        "validation_step": validation_step,
    }
    out.parent.mkdir(parents=True, exist_ok=True)  # as import-hf: `--out exports/x` just works
    common = {"dtype": dtype, "max_shard_size": max_shard_size, "tokenizer_path": tokenizer_path, "card": card}
    common |= {"overwrite": overwrite, "verify": verify and dtype == "float32"}
    if fmt == "stock":
        return write_stock_folder(out, native, args, **common)
    return write_hf_folder(out, native, args, **common, halting_probe=probe)


def portable_path(path: str | Path) -> str:
    """`path` as the card may show it: relative to the working directory, never absolute
    (a published card carries no machine's paths); outside it, the last two parts."""
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return Path(*p.parts[-2:]).as_posix() if len(p.parts) > 2 else p.name


def build_parser() -> argparse.ArgumentParser:
    p = OverridesParser(
        prog="grt-titan export-hf",
        description="Export a torchtitan GRT checkpoint to a Hugging Face folder (AutoModelForCausalLM: "
        "with trust_remote_code=True for a recurrent model; a dense one as stock GPT-2 / Llama / Qwen3).",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint step folder, e.g. <dump>/checkpoint/step-N, or <dump>/checkpoint (latest step)",
    )
    p.add_argument(
        "--config",
        required=True,
        help="the training TOML (flavor and [grt] overrides; the run's command-line overrides may follow "
        "the other options), or the run's <dump_folder>/grt_run.json or dump folder (what the run built)",
    )
    p.add_argument("--out", required=True, help="output folder (created; must not exist)")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument(
        "--max-shard-size",
        default=DEFAULT_MAX_SHARD_SIZE,
        help="split the weights into shards above this size (default 5GB)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help=".tiktoken rank file or Hugging Face tokenizer folder (default: the run's hf_assets_path, else shipped GPT-2)",
    )
    p.add_argument(
        "--validation-loss",
        type=float,
        default=None,
        help="for the model card (default: read from the run's TensorBoard logs)",
    )
    p.add_argument(
        "--validation-step",
        type=int,
        default=None,
        help="the step --validation-loss was measured at, for the model card",
    )
    p.add_argument(
        "--format",
        default="auto",
        choices=EXPORT_FORMATS,
        help="stock: GPT2LMHeadModel / LlamaForCausalLM / Qwen3ForCausalLM (dense models only); grt: model_type 'grt' with "
        "remote code; auto (default): stock for a dense model, grt for a recurrent one",
    )
    p.add_argument(
        "--halting-probe",
        default=None,
        metavar="FILE",
        help="the learned halting rule's probe (halting_probe.pt, written by eval-task --halting learned:X --out DIR): "
        "the export holds it and takes halting='learned'",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the fp32 logit check of the written folder against the checkpoint",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # exporting never needs the hub
    try:
        out = export_checkpoint(
            args.checkpoint,
            args.config,
            args.out,
            dtype=args.dtype,
            max_shard_size=args.max_shard_size,
            tokenizer_path=args.tokenizer,
            validation_loss=args.validation_loss,
            validation_step=args.validation_step,
            overwrite=args.overwrite,
            verify=not args.no_verify,
            fmt=args.format,
            overrides=args.overrides,
            halting_probe=args.halting_probe,
        )
    except (CheckpointError, FileNotFoundError) as e:
        print(f"grt-titan export-hf: error: {e}", file=sys.stderr)
        return 1
    config = json.loads((out / "config.json").read_text())
    stock = f" (stock {STOCK_CLASSES[config['model_type']]})" if config.get("model_type") in STOCK_CLASSES else ""
    print(f"exported {latest_step_folder(Path(args.checkpoint))} -> {out}{stock}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
