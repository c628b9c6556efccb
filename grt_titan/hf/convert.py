"""GRTModelArgs <-> GRTConfig, and writing / reading an exported Hugging Face folder.

An exported folder holds: config.json (model_type "grt", auto_map), the remote code
(`REMOTE_CODE_FILES`: the files of grt_titan/hf/remote/, configuration_grt.py, modeling_grt.py
and the files it imports), model.safetensors (or model-0000i-of-0000N.safetensors + index
above `max_shard_size`), generation_config.json, the tokenizer files (a Hugging Face tokenizer
folder's, or GPT-2's derived from tiktoken ranks: tokenizer_files.py) and README.md (model card).
It is written into a temporary sibling folder and renamed into place only when complete,
so a failure never leaves a partial output folder.

Vocabulary padding (`vocab_multiple_of`): the folder holds the true vocabulary. config.json's
vocab_size is the tokenizer's, embed_tokens / lm_head have vocab_size rows (the adapter drops
the padded rows), and the padding multiple is kept in `training_settings` so that import
pads the rows back (with zeros) for training.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from grt_titan.checkpoints.folders import INDEX_FILE, SINGLE_FILE
from grt_titan.checkpoints.hf_weights import HALTING_PROBE_PREFIX, check_hf_keys, check_native_shapes, read_hf_weights
from grt_titan.checkpoints.load import model_from_state
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.state_dict_adapter import TRAINING_ONLY_KEYS, GRTStateDictAdapter
from grt_titan.run_reader import CheckpointError
from grt_titan.runtime.atomic_dir import atomic_directory

from .config_map import HF_PARTS, hf_config_kwargs

# The remote code, copied verbatim into every export: every file of grt_titan/hf/remote/ but
# its __init__.py (the model, its configuration and the sibling files modeling_grt.py imports;
# transformers copies each relatively imported file too, and tests/hf/test_hf_copies.py checks
# that the folder is exactly that closure).
REMOTE_DIR = Path(__file__).resolve().parent / "remote"
REMOTE_CODE_FILES = tuple(sorted(p.name for p in REMOTE_DIR.glob("*.py") if p.name != "__init__.py"))
AUTO_MAP = {
    "AutoConfig": "configuration_grt.GRTConfig",
    "AutoModelForCausalLM": "modeling_grt.GRTForCausalLM",
}
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_SHARD_SIZE = "5GB"


class ExportError(CheckpointError):
    """A user error in export / import (bad checkpoint, config, dtype or path)."""


# ---- config ---------------------------------------------------------------------------


def check_exportable(args: GRTModelArgs) -> None:
    """Refuse, by name and before anything is read, a method modeling_grt.py does not
    implement (docs/methods.md, "Recurrence parts in the Hugging Face export")."""
    # The router part is implemented for expert choice only (MoR's token choice is not).
    unsupported = {
        k: v for k, v in args.non_grt_parts.items() if k not in HF_PARTS or (k, v) == ("router", "token_choice")
    }
    if not unsupported:
        return
    missing = {
        "router": "no token-choice routing (Mixture-of-Recursions), so it would compute a different function",
    }
    parts = ", ".join(f"{k} = {v!r}" for k, v in unsupported.items())
    reasons = "; ".join(missing.get(k, f"no {k} = {v!r}") for k, v in unsupported.items())
    raise ExportError(
        f"{args.method_name} ([grt] {parts}) cannot be exported to Hugging Face format yet: "
        f"modeling_grt.py has {reasons}; it implements the parts {', '.join(HF_PARTS)}, "
        "the router for expert choice only (docs/methods.md, docs/mor.md). Evaluate it with the torchtitan model "
        "(training validation, `grt-titan analyze`)"
    )


def build_hf_config(args: GRTModelArgs, dtype: str = "float32", eos_id: int | None = None, bos_id: int | None = None):
    """The HF config of `args`; `eos_id` / `bos_id`: the tokenizer's (None: none; a missing BOS
    is the EOS, as HF's GPT-2 writes it)."""
    from .remote.configuration_grt import GRTConfig

    check_exportable(args)
    try:
        config = GRTConfig(**hf_config_kwargs(args, eos_id, bos_id))
    except ValueError as e:  # e.g. RRT with a default depth above R: no adapters for it
        raise ExportError(f"cannot export {args.method_name}: {e}") from e
    config.architectures = ["GRTForCausalLM"]
    config.auto_map = dict(AUTO_MAP)
    config.dtype = dtype
    return config


# ---- weights --------------------------------------------------------------------------


def parse_size(size: str | int) -> int:
    """'5GB' -> 5e9, '500MB', '2GiB', '1000' -> bytes (transformers' convention)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", size, flags=re.IGNORECASE)
    if not m:
        raise ExportError(f"max_shard_size = {size!r}; use e.g. 5GB, 500MB or a number of bytes")
    number, unit = float(m.group(1)), (m.group(2) or "B").upper()
    powers = {
        "B": 1,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }
    if unit not in powers:
        raise ExportError(f"max_shard_size = {size!r}: unknown unit {unit}")
    return int(number * powers[unit])


def cast_for_export(hf_state_dict: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """Cast to the export dtype; ExportError for an unknown dtype or a value it cannot hold."""
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"dtype = {dtype!r} cannot be exported; allowed: {sorted(EXPORT_DTYPES)}")
    target = EXPORT_DTYPES[dtype]
    out = {}
    for key, value in hf_state_dict.items():
        if not value.is_floating_point():
            raise ExportError(f"{key}: dtype {value.dtype} is not a floating-point weight")
        cast = value.detach().to("cpu", target).contiguous()
        if target != value.dtype and not bool(torch.isfinite(cast).all()) and bool(torch.isfinite(value).all()):
            limit = torch.finfo(target).max
            raise ExportError(
                f"{key}: max |value| {value.abs().max().item():.4g} cannot be represented in "
                f"{dtype} (largest finite {limit:.4g}); export in float32 or bfloat16"
            )
        out[key] = cast
    return out


def plan_shards(hf_state_dict: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Greedy shards in key order, each at most `max_shard_bytes` (a larger tensor alone)."""
    shards, current, size = [], [], 0
    for key, value in hf_state_dict.items():
        nbytes = value.numel() * value.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(key)
        size += nbytes
    if current or not shards:
        shards.append(current)
    return shards


def write_weights(out: Path, hf_state_dict: dict[str, torch.Tensor], max_shard_size: str | int) -> list[str]:
    """model.safetensors, or shards + model.safetensors.index.json. Returns the file names."""
    from safetensors.torch import save_file

    shards = plan_shards(hf_state_dict, parse_size(max_shard_size))
    if len(shards) == 1:
        save_file(hf_state_dict, str(out / SINGLE_FILE), metadata={"format": "pt"})
        return [SINGLE_FILE]
    names, weight_map = [], {}
    for i, keys in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: hf_state_dict[k] for k in keys}, str(out / name), metadata={"format": "pt"})
        names.append(name)
        weight_map.update({k: name for k in keys})
    total = sum(v.numel() * v.element_size() for v in hf_state_dict.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return names + [INDEX_FILE]


# ---- the folder -----------------------------------------------------------------------


def write_hf_folder(
    out: str | Path,
    native_state_dict: dict[str, torch.Tensor],
    model_args: GRTModelArgs,
    dtype: str = "float32",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    tokenizer_path: str | Path | None = None,
    write_tokenizer: bool = True,
    card: dict[str, Any] | None = None,
    overwrite: bool = False,
    verify: bool = False,
    halting_probe=None,
) -> Path:
    """Write an HF folder for a native GRT state dict; all-or-nothing.

    Args:
        out: Folder to create. Must not exist unless `overwrite`.
        native_state_dict: torchtitan parameter names -> tensors (CPU).
        model_args: The model's args (flavor after overrides).
        dtype: float32, bfloat16 or float16 (values out of range -> ExportError).
        max_shard_size: Above this, weights are split into shards with an index.
        tokenizer_path: `.tiktoken` rank file; None = the shipped GPT-2 ranks. Its
            `<|endoftext|>` id is the config's BOS / EOS and the generation config's pad too.
        write_tokenizer: False skips the tokenizer files (models whose vocabulary is not
            the tokenizer's, e.g. tests).
        card: Facts for README.md (see model_card.render_model_card).
        verify: Rebuild the model from the written files and compare its fp32 logits with
            the torchtitan model's (float32 exports only).
        halting_probe: the learned halting rule's fitted `HaltingProbe`, written as
            `model.halting_probe` (config.json's `halting_probe`: the export takes
            `halting="learned"`); None: none.
    """
    from .model_card import render_model_card

    out = Path(out)
    check_exportable(model_args)
    check_export_target(out, overwrite, dtype)
    from grt_titan.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)  # its EOS is the export's EOS and pad
    adapter = GRTStateDictAdapter(model_args, None)
    native = {k: v for k, v in native_state_dict.items() if k not in TRAINING_ONLY_KEYS}
    check_native_shapes(model_args, native, "state dict")
    hf = adapter.to_hf(native)
    check_hf_keys(adapter, hf, "state dict")
    if model_args.tie_embeddings and "output.weight" in native:
        if not torch.equal(native["output.weight"], native["tok_embeddings.weight"]):
            raise ExportError("gpt2 style ties output.weight to tok_embeddings.weight, but they differ")
    hf = {k: hf[k] for k in adapter.hf_keys}
    if halting_probe is not None:
        if halting_probe.dim != model_args.dim:
            raise ExportError(
                f"the halting probe reads states of dim {halting_probe.dim}; the model's dim is {model_args.dim}"
            )
        hf |= {HALTING_PROBE_PREFIX + k: v.detach().cpu() for k, v in halting_probe.state_dict().items()}
    hf = cast_for_export(hf, dtype)

    with atomic_directory(out, overwrite) as tmp:
        files = write_weights(tmp, hf, max_shard_size)
        eos_id, bos_id = special_ids(tokenizer, model_args)
        config = build_hf_config(model_args, dtype, eos_id, bos_id)
        config.halting_probe = halting_probe is not None
        config.to_json_file(str(tmp / "config.json"), use_diff=False)
        for name in REMOTE_CODE_FILES:
            shutil.copyfile(REMOTE_DIR / name, tmp / name)
        write_tokenizer_files_and_generation_config(tmp, tokenizer, model_args, write_tokenizer)
        card = dict(card or {})
        card.setdefault("dtype", dtype)
        card["weight_files"] = files
        card["folder_name"] = out.name
        (tmp / "README.md").write_text(render_model_card(model_args, hf, card))
        if verify:
            if dtype != "float32":
                raise ExportError("--verify compares float32 logits; export in float32 to verify")
            verify_hf_folder(tmp, native_state_dict, model_args)
    return out


def check_export_target(out: Path, overwrite: bool, dtype: str) -> None:
    """ExportError for an existing `out` (without `overwrite`), a missing parent or an unknown dtype."""
    if out.exists() and not overwrite:
        raise ExportError(f"output folder {out} already exists (pass --overwrite to replace it)")
    if not out.parent.is_dir():
        raise ExportError(f"parent folder of {out} does not exist")
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"dtype = {dtype!r} cannot be exported; allowed: {sorted(EXPORT_DTYPES)}")


def special_ids(tokenizer, model_args: GRTModelArgs) -> tuple[int | None, int | None]:
    """(eos_id, bos_id) of the export: the tokenizer's, where the vocabulary has them."""
    return _special_id(tokenizer, "eos_id", model_args), _special_id(tokenizer, "bos_id", model_args)


def write_tokenizer_files_and_generation_config(
    folder: Path, tokenizer, model_args: GRTModelArgs, write_tokenizer: bool = True
) -> None:
    """generation_config.json (bos, eos, pad: a Hugging Face tokenizer folder's own
    generation_config.json ids where it has them) and, with `write_tokenizer`, the tokenizer files."""
    from grt_titan.tokenizer import HFTokenizer

    from .tokenizer_files import source_generation_ids

    eos_id, bos_id = special_ids(tokenizer, model_args)
    source_ids = (
        source_generation_ids(tokenizer.path, model_args.vocab_size) if isinstance(tokenizer, HFTokenizer) else {}
    )
    _write_generation_config(folder, eos_id, bos_id, source_ids)
    if write_tokenizer:
        _write_tokenizer(folder, tokenizer, model_args)


def _special_id(tokenizer, name: str, model_args: GRTModelArgs) -> int | None:
    """The tokenizer's `eos_id` or `bos_id` (GPT-2's `<|endoftext|>` and no BOS; a Hugging Face
    tokenizer folder's `eos_token` / `bos_token`), or None where there is none or the model's
    vocabulary lacks it (a model trained without that tokenizer: tests' small vocabularies)."""
    token_id = getattr(tokenizer, name, None)
    return token_id if token_id is not None and token_id < model_args.vocab_size else None


def _write_generation_config(
    folder: Path, eos_id: int | None, bos_id: int | None = None, source_ids: dict | None = None
) -> None:
    """bos = eos = pad = the tokenizer's EOS (a missing BOS is the EOS, as HF's GPT-2 writes
    it), each replaced by the source's `source_ids` (`source_generation_ids`) where given."""
    from transformers import GenerationConfig

    bos_id = eos_id if bos_id is None else bos_id
    ids = {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, **(source_ids or {})}
    GenerationConfig(**ids).save_pretrained(str(folder))


def _write_tokenizer(folder: Path, tokenizer, model_args: GRTModelArgs) -> None:
    """The export's tokenizer files: a Hugging Face tokenizer folder's own (`copy_tokenizer_files`:
    tokenizer.json, tokenizer_config.json, special tokens, chat templates, where present),
    copied unchanged so that the export's tokenizer identity and prompts are the source's; for
    tiktoken ranks, the GPT-2 files derived from them."""
    from grt_titan.tokenizer import HFTokenizer

    from .tokenizer_files import copy_tokenizer_files, write_tokenizer_files

    if tokenizer.get_vocab_size() > model_args.vocab_size:
        raise ExportError(
            f"the tokenizer has {tokenizer.get_vocab_size()} ids but the model's vocab_size is {model_args.vocab_size}"
        )
    if isinstance(tokenizer, HFTokenizer):
        copy_tokenizer_files(tokenizer.path, folder)
        return
    write_tokenizer_files(folder, tokenizer.encoding._mergeable_ranks, model_args.max_seq_len)


def logits_difference(native, hf_model, model_args: GRTModelArgs, batch: int = 1) -> float:
    """Max |logits difference| of the torchtitan model `native` and the transformers model
    `hf_model` (both in eval mode) on seeded random tokens."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model_args.vocab_size, (batch, min(16, model_args.max_seq_len)), generator=generator)
    with torch.no_grad():
        # The HF model has the true vocabulary; drop the padded columns (vocab_multiple_of).
        ref = native(tokens)[..., : model_args.vocab_size]
        got = hf_model(tokens).logits
    return (ref - got).abs().max().item()


def verify_hf_folder(
    folder: Path, native_state_dict: dict[str, torch.Tensor], model_args: GRTModelArgs, atol: float = 1e-4
) -> float:
    """Max |logits difference| between the torchtitan model and the written HF model (fp32)."""
    from .remote.configuration_grt import GRTConfig
    from .remote.modeling_grt import GRTForCausalLM

    config = GRTConfig.from_json_file(str(folder / "config.json"))
    if model_args.router != "none":  # MoR: compare under the exported model's routing rule
        model_args = model_args.replace(router_inference=config.router_inference)
    native = model_from_state(native_state_dict, model_args).eval()
    hf_model = GRTForCausalLM(config).eval()
    hf_model.load_state_dict(read_hf_weights(folder), strict=not model_args.tie_embeddings)
    if model_args.tie_embeddings:
        hf_model.tie_weights()
    diff = logits_difference(native, hf_model, model_args)
    if not diff < atol:
        raise ExportError(f"verification failed: exported logits differ by {diff:.3g} (> {atol})")
    return diff
