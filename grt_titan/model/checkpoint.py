"""A GRT's weights and args in one process: the one native-model loader.

Every tool that reads a trained GRT outside torchrun goes through here: `grt-titan
export-hf` / `import-hf`, `grt-titan analyze`, benchmarks and tests.

- `load_model_args`: the GRTModelArgs of a training TOML (flavor + `[grt]` overrides).
- `load_checkpoint`: a torchtitan step folder. torchtitan 0.2.2 saves
  `<dump_folder>/<checkpoint.folder>/step-N/` with DCP; its model states are flattened to
  the top level in every save (`_flattened_model_states_sd`): the keys are the model FQNs,
  next to `optimizer.*`, `lr_scheduler.*`, `dataloader.*` and `train_state.{step,
  ntokens_seen}` in full saves. A folder whose model keys are nested under `model.` is read
  as well. With `[checkpoint] last_save_in_hf = true` the last step is instead written as
  HF-named safetensors (GRTStateDictAdapter); that is read too.
- `native_state_from_hf` / `model_args_from_hf_config`: an exported Hugging Face folder.
- `model_from_state`: a single-device GRTModel holding a native state dict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torchtitan.config import ConfigManager
from torchtitan.models.llama3.model.args import RoPEScalingArgs

from .args import GRT_PARTS, GRTModelArgs
from .flavors import grt_flavors
from .model import GRTModel, build_meta_model
from .state_dict_adapter import GRTStateDictAdapter, optional_native_keys

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A user error in reading a model: bad checkpoint, config or path, named in the message."""


# ---- args ------------------------------------------------------------------------------


def load_model_args(config_file: str | Path):
    """(GRTModelArgs after `[grt]` overrides, torchtitan JobConfig) of a training TOML."""
    config_file = Path(config_file)
    if not config_file.is_file():
        raise CheckpointError(f"config file {config_file} does not exist")
    try:
        job_config = ConfigManager().parse_args(["--job.config_file", str(config_file)])
    except (ValueError, TypeError, KeyError, SystemExit) as e:
        raise CheckpointError(f"{config_file}: cannot parse as a torchtitan config: {e}") from e
    if job_config.model.name != "grt":
        raise CheckpointError(f"{config_file}: [model] name = {job_config.model.name!r}, expected 'grt'")
    flavor = job_config.model.flavor
    if flavor not in grt_flavors:
        raise CheckpointError(f"{config_file}: flavor {flavor!r} unknown; allowed: {sorted(grt_flavors)}")
    args = dataclasses.replace(grt_flavors[flavor])
    try:
        args.update_from_config(job_config)
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    return args, job_config


# ---- Hugging Face config <-> args --------------------------------------------------------


def _rope_scaling(args: GRTModelArgs) -> dict | None:
    if args.block_style != "llama":
        return None
    # grt_titan's llama blocks use torchtitan's default llama3 RoPE scaling.
    return dataclasses.asdict(RoPEScalingArgs())


def model_args_dict(args: GRTModelArgs) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if not f.name.startswith("_")}


# Recurrence parts that the HF model implements (config.json fields of the same names);
# grt_titan/hf/convert.py refuses the others.
HF_PARTS = ("injection", "update", "initial_state", "step_adapter", "objective", "router")


def hf_config_kwargs(args: GRTModelArgs, eos_id: int | None = None) -> dict[str, Any]:
    """The HF GRTConfig fields for `args` (architecture, recurrence parts, default inference
    depth). A dense model has no recurrence: its config keeps the parts' defaults.

    `eos_id`: the tokenizer's `<|endoftext|>` id (`GPT2Tokenizer.eos_id`), written as BOS and
    EOS as HF's GPT-2 does; None (no tokenizer, or one whose id the vocabulary lacks): none.
    """
    recurrent = args.is_recurrent
    if recurrent:
        depth = args.eval_depth
        parts = {name: getattr(args, name) for name in HF_PARTS}
        parts.update(
            initial_state_std=args.initial_state_std,
            initial_state_seed=args.depth_seed,  # the seed of grt_titan's eval-mode state table
            lora_rank=args.lora_rank,
            lora_scale=args.lora_scale,
            exit_threshold=args.exit_threshold,  # Ouro's Q-exit threshold q
            router_capacity=args.router_capacity,
            router_scale=args.router_scale,
            router_update=args.router_update,  # MoR: the update it was trained with
            # MoR: the exported model routes causally by default (generation); a full forward
            # may ask for top_k (docs/hf_export.md). The run's own eval rule is in training_settings.
            router_inference="threshold",
        )
    else:
        depth, parts = 0, {}
    return dict(
        **parts,
        block_style=args.block_style,
        vocab_size=args.vocab_size,  # the true vocabulary, never padded_vocab_size
        hidden_size=args.dim,
        num_attention_heads=args.n_heads,
        num_key_value_heads=(args.n_kv_heads or args.n_heads) if args.block_style == "llama" else args.n_heads,
        intermediate_size=args.ffn_hidden_dim,
        max_position_embeddings=args.max_seq_len,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        rope_llama3_scaling=_rope_scaling(args),
        num_prelude_layers=args.n_prelude_layers,
        num_core_layers=args.n_core_layers,
        num_coda_layers=args.n_coda_layers,
        num_recurrences=depth,
        train_recurrences=args.num_recurrences if recurrent else None,
        gate_hidden_size=args.gate_hidden_dim or args.dim,
        gate_temperature=args.gate_temperature,
        gate_override=args.gate_override,
        tie_word_embeddings=args.tie_embeddings,
        # Everything torchtitan needs to rebuild the exact args on import.
        training_settings={"grt_model_args": model_args_dict(args)},
        bos_token_id=eos_id,
        eos_token_id=eos_id,
    )


def model_args_from_hf_config(config: dict[str, Any]) -> GRTModelArgs:
    """GRTModelArgs of an exported folder's config.json (exact for grt-titan exports)."""
    if config.get("model_type") != "grt":
        raise CheckpointError(f"config.json has model_type {config.get('model_type')!r}, expected 'grt'")
    saved = dict((config.get("training_settings") or {}).get("grt_model_args") or {})
    known = {f.name for f in dataclasses.fields(GRTModelArgs)}
    args = GRTModelArgs(**{k: v for k, v in saved.items() if k in known})
    kv_heads = config.get("num_key_value_heads")
    overrides = dict(
        block_style=config["block_style"],
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_heads=config["num_attention_heads"],
        n_kv_heads=kv_heads if config["block_style"] == "llama" and kv_heads != config["num_attention_heads"] else None,
        max_seq_len=config["max_position_embeddings"],
        norm_eps=config["norm_eps"],
        rope_theta=config.get("rope_theta", args.rope_theta),
        n_prelude_layers=config["num_prelude_layers"],
        n_core_layers=config["num_core_layers"],
        n_coda_layers=config["num_coda_layers"],
        gate_temperature=config.get("gate_temperature", args.gate_temperature),
        gate_override=config.get("gate_override"),
    )
    if config["num_core_layers"]:
        # The parts config.json gives (none: GRT's) and their settings.
        overrides.update({name: config.get(name, GRT_PARTS[name]) for name in HF_PARTS})
        for key, field in (
            ("initial_state_std",) * 2,
            ("initial_state_seed", "depth_seed"),
            ("lora_rank",) * 2,
            ("lora_scale",) * 2,
            ("exit_threshold",) * 2,
            ("router_capacity",) * 2,
            ("router_scale",) * 2,
            ("router_update",) * 2,
        ):
            if key in config:
                overrides[field] = config[key]
        if overrides["step_adapter"] == "lora" and not saved:
            overrides["depth_sampling"] = "fixed"  # one adapter set per step of a fixed depth
        if overrides["router"] != "none" and not saved:  # MoR: one router per step, no noise
            overrides.update(depth_sampling="fixed", state_noise_std=0.0)
    if saved.get("n_kv_heads") is not None and overrides["n_kv_heads"] is None:
        overrides["n_kv_heads"] = saved["n_kv_heads"]  # n_kv_heads == n_heads, spelled out
    if config.get("gate_hidden_size") not in (None, config["hidden_size"]):
        overrides["gate_hidden_dim"] = config["gate_hidden_size"]
    args = args.replace(**overrides)
    if args.is_recurrent and not saved:
        R = config.get("train_recurrences") or max(config.get("num_recurrences", 1), 1)
        args = args.replace(num_recurrences=R, min_recurrences=min(args.min_recurrences, R))
    try:
        args.validate(where="config.json")
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    expected_ffn = args.ffn_hidden_dim
    if config.get("intermediate_size", expected_ffn) != expected_ffn:
        raise CheckpointError(
            f"config.json: intermediate_size = {config['intermediate_size']} but torchtitan's "
            f"blocks compute {expected_ffn} (multiple_of = {args.multiple_of}, "
            f"ffn_dim_multiplier = {args.ffn_dim_multiplier})"
        )
    return args


# ---- weights ----------------------------------------------------------------------------


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF folder (model.safetensors or the shards of its index)."""
    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{folder}: no model.safetensors, {INDEX_FILE} or *.safetensors found")
    tensors = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{folder}: {name} is listed in {INDEX_FILE} but missing")
        tensors.update(load_file(str(path)))
    return tensors


def check_hf_keys(adapter: GRTStateDictAdapter, hf_state_dict: dict[str, Any], where: str) -> None:
    missing = [k for k in adapter.hf_keys if k not in hf_state_dict]
    unexpected = [k for k in hf_state_dict if k not in adapter.from_hf_map]
    if missing or unexpected:
        raise CheckpointError(
            f"{where} does not match the config: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}"
        )


def check_native_shapes(args: GRTModelArgs, native: dict[str, Any], where: str) -> None:
    expected = build_meta_model(args).state_dict()
    bad = [
        f"{k}: {tuple(v.shape)} vs config {tuple(expected[k].shape)}"
        for k, v in native.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    if bad:
        raise CheckpointError(f"{where} does not match the config (shape mismatch): " + "; ".join(bad[:8]))


# ---- checkpoints --------------------------------------------------------------------------


_NON_MODEL_PREFIXES = ("optimizer.", "lr_scheduler.", "dataloader.", "train_state.")


@contextlib.contextmanager
def single_process_dcp():
    """DCP without a process group warns that it assumes one process: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def latest_step_folder(path: Path) -> Path:
    """`path` itself, or its `step-N` child with the largest N (a checkpoint folder)."""
    steps = (
        [(int(m.group(1)), p) for p in path.iterdir() if p.is_dir() and (m := re.fullmatch(r"step-(\d+)", p.name))]
        if path.is_dir()
        else []
    )
    return max(steps)[1] if steps else path


def _step_from_name(path: Path) -> int | None:
    m = re.fullmatch(r"step-(\d+)", path.name)
    return int(m.group(1)) if m else None


def load_checkpoint(path: str | Path, args: GRTModelArgs) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Native model state dict (CPU, saved dtype) and facts (`step`, `tokens_seen`).

    Raises:
        CheckpointError: missing folder, or weights that do not match `args` (keys, shapes).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist")
    if (path / ".metadata").is_file():
        return _load_dcp(path, args)
    if (path / "model.safetensors.index.json").is_file() or list(path.glob("*.safetensors")):
        adapter = GRTStateDictAdapter(args, None)
        hf = read_hf_weights(path)
        check_hf_keys(adapter, hf, f"checkpoint {path}")
        native = adapter.from_hf(hf)
        check_native_shapes(args, native, f"checkpoint {path}")
        if args.tie_embeddings:
            native["output.weight"] = native["tok_embeddings.weight"]
        return native, {"step": _step_from_name(path), "tokens_seen": None}
    raise CheckpointError(f"{path} is not a torchtitan checkpoint step folder (no DCP .metadata, no safetensors)")


def _load_dcp(path: Path, args: GRTModelArgs) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    expected = build_meta_model(args).state_dict()
    prefix = "model." if "model.tok_embeddings.weight" in metadata else ""
    saved = {
        k[len(prefix) :]: v
        for k, v in metadata.items()
        if k.startswith(prefix) and not k.startswith(_NON_MODEL_PREFIXES)
    }
    optional = optional_native_keys(args)
    missing = [k for k in expected if k not in saved and k not in optional]
    # Checkpoints written before the sampler was named `depth_sampler` (not needed to read weights).
    unexpected = [k for k in saved if k not in expected and k != "recurrence.depth.draws"]
    bad_shapes = [
        f"{k}: {tuple(saved[k].size)} vs config {tuple(v.shape)}"
        for k, v in expected.items()
        if k in saved and isinstance(saved[k], TensorStorageMetadata) and tuple(saved[k].size) != tuple(v.shape)
    ]
    if missing or unexpected or bad_shapes:
        raise CheckpointError(
            f"checkpoint {path} does not match the config (flavor / [grt] overrides): "
            f"missing {missing[:8]}, unexpected {unexpected[:8]}, shapes {bad_shapes[:8]}"
        )
    state = {k: torch.empty(tuple(saved[k].size), dtype=saved[k].properties.dtype) for k in expected if k in saved}
    # dcp.load fills the given tensors in place (the prefixed dict shares them).
    with single_process_dcp():
        dcp.load({prefix + k: v for k, v in state.items()}, checkpoint_id=str(path))
    facts: dict[str, Any] = {"step": _step_from_name(path), "tokens_seen": None}
    if "train_state.step" in metadata:
        train_state = {"train_state": {"step": 0, "ntokens_seen": 0}}
        with single_process_dcp():
            dcp.load(train_state, checkpoint_id=str(path))
        facts["step"] = int(train_state["train_state"]["step"])
        facts["tokens_seen"] = int(train_state["train_state"]["ntokens_seen"])
    if args.tie_embeddings and "output.weight" in state:
        if not torch.equal(state["output.weight"], state["tok_embeddings.weight"]):
            raise CheckpointError(f"checkpoint {path}: tied output.weight differs from tok_embeddings.weight")
    return state, facts


def save_checkpoint(path: str | Path, state_dict: dict[str, Any]) -> None:
    """DCP checkpoint in torchtitan's layout: model FQNs at the top level (plus, optionally,
    `train_state` etc. as in a full save)."""
    with single_process_dcp():
        dcp.save(dict(state_dict), checkpoint_id=str(path))


def native_state_from_hf(hf_state_dict: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """Full native state dict (fp32) of a GRTModel holding the HF weights.

    Training-only buffers (the depth sampler's counter) take their initial values: an
    imported model starts a new depth sequence.
    """
    adapter = GRTStateDictAdapter(args, None)
    check_hf_keys(adapter, hf_state_dict, "Hugging Face weights")
    native = adapter.from_hf(hf_state_dict)
    check_native_shapes(args, native, "Hugging Face weights")
    model = model_from_state(native, args)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def model_from_state(state: dict[str, torch.Tensor], args: GRTModelArgs) -> GRTModel:
    """A float32 GRTModel (train mode, CPU) holding `state`; keys it may lack keep their init."""
    model = GRTModel(args)
    with torch.no_grad():
        model.init_weights()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if unexpected or not set(missing) <= optional_native_keys(args):
        raise CheckpointError(f"weights do not fit the model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    model.tie_weights()
    return model
