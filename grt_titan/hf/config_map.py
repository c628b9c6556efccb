"""GRTModelArgs <-> the exported folder's config.json (GRTConfig's fields): the HF config map.

`hf_config_kwargs` writes the config of an export (grt_titan/hf/convert.py);
`model_args_from_hf_config` reads one back (`grt-titan import-hf`, and `grt-titan analyze`
on an exported folder). The `[grt]` settings it carries as they are come from their declaration
(`HF_SETTINGS`, grt_titan/model/args.py); `HF_PARTS` are the recurrence parts modeling_grt.py
implements.

It sits in the one-process I/O layer with grt_titan/checkpoints/ (docs/architecture.md,
"Layer order"), below hf/ and analysis/, so that analyze reads an export without importing
the export command. Plain data in, plain data out: no transformers import, no torch.distributed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grt_titan.model.args import GRT_PARTS, GRTModelArgs
from grt_titan.model.blocks.llama import RoPEScalingArgs
from grt_titan.model.settings import hf_config_keys
from grt_titan.run_reader import CheckpointError


def _rope_scaling(args: GRTModelArgs) -> dict | None:
    if args.block_style != "llama":
        return None
    if args.rope_scaling is None:
        # grt_titan's llama flavors use llama3's default RoPE scaling (torchtitan's, copied).
        return dataclasses.asdict(RoPEScalingArgs())
    # A retrofitted source's own scaling ([factor, low, high, original]; factor 1: none).
    factor, low, high, original = args.rope_scaling
    return dataclasses.asdict(RoPEScalingArgs(float(factor), float(low), float(high), int(original)))


def model_args_dict(args: GRTModelArgs) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if not f.name.startswith("_")}


# The `[grt]` settings an export's config.json holds, {field: (key, written for a dense model
# too)}: their declaration's `hf` (grt_titan/model/args.py); a recurrent model's parts and
# their settings, and the gate's.
HF_SETTINGS = hf_config_keys(GRTModelArgs)
# Recurrence parts that the HF model implements (config.json fields of the same names);
# grt_titan/hf/convert.py refuses the others.
HF_PARTS = tuple(name for name in HF_SETTINGS if name in GRT_PARTS)


def hf_config_kwargs(args: GRTModelArgs, eos_id: int | None = None, bos_id: int | None = None) -> dict[str, Any]:
    """The HF GRTConfig fields for `args` (architecture, recurrence parts, default inference
    depth). A dense model has no recurrence: its config keeps the parts' defaults.

    `eos_id` / `bos_id`: the tokenizer's (GPT-2's `<|endoftext|>` is both, as HF's GPT-2
    writes it: a missing `bos_id` is `eos_id`); None (no tokenizer, or one whose id the
    vocabulary lacks): none.
    """
    recurrent = args.is_recurrent
    declared = {key: getattr(args, name) for name, (key, dense) in HF_SETTINGS.items() if recurrent or dense}
    if recurrent:
        # MoR: the exported model routes causally by default (generation); a full forward
        # may ask for top_k (docs/mor.md). The run's own eval rule is in training_settings.
        declared["router_inference"] = "threshold"
    return dict(
        **declared,
        block_style=args.block_style,
        vocab_size=args.vocab_size,  # the true vocabulary, never padded_vocab_size
        hidden_size=args.dim,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.n_heads if args.block_style == "gpt2" else (args.n_kv_heads or args.n_heads),
        head_dim=args.head_dim,  # qwen3's may differ from hidden_size / heads
        intermediate_size=args.ffn_hidden_dim,
        max_position_embeddings=args.max_seq_len,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        rope_llama3_scaling=_rope_scaling(args),
        num_prelude_layers=args.n_prelude_layers,
        num_core_layers=args.n_core_layers,
        num_coda_layers=args.n_coda_layers,
        num_recurrences=args.num_recurrences if recurrent else 0,  # R, as in the args
        eval_recurrences=args.eval_recurrences if recurrent else None,  # the default depth (None: R)
        gate_hidden_size=args.gate_hidden_dim or args.dim,
        tie_word_embeddings=args.tie_embeddings,
        # Everything torchtitan needs to rebuild the exact args on import.
        training_settings={"grt_model_args": model_args_dict(args)},
        bos_token_id=eos_id if bos_id is None else bos_id,
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
        n_kv_heads=kv_heads if config["block_style"] != "gpt2" and kv_heads != config["num_attention_heads"] else None,
        max_seq_len=config["max_position_embeddings"],
        norm_eps=config["norm_eps"],
        rope_theta=config.get("rope_theta", args.rope_theta),
        n_prelude_layers=config["num_prelude_layers"],
        n_core_layers=config["num_core_layers"],
        n_coda_layers=config["num_coda_layers"],
    )
    recurrent = bool(config["num_core_layers"])
    # The declared settings config.json gives (a missing part: GRT's; another: the saved value).
    for name, (key, dense) in HF_SETTINGS.items():
        if recurrent or dense:
            overrides[name] = config.get(key, GRT_PARTS.get(name, getattr(args, name)))
    if recurrent:
        if overrides["step_adapter"] == "lora" and not saved:
            overrides["depth_sampling"] = "fixed"  # one adapter set per step of a fixed depth
        if overrides["router"] != "none" and not saved:  # MoR: one router per step, no noise
            overrides.update(depth_sampling="fixed", state_noise_std=0.0)
    if saved.get("n_kv_heads") is not None and overrides["n_kv_heads"] is None:
        overrides["n_kv_heads"] = saved["n_kv_heads"]  # n_kv_heads == n_heads, spelled out
    if config.get("head_dim") not in (None, config["hidden_size"] // config["num_attention_heads"]):
        overrides["attention_head_dim"] = config["head_dim"]  # qwen3's explicit head width
    if config.get("gate_hidden_size") not in (None, config["hidden_size"]):
        overrides["gate_hidden_dim"] = config["gate_hidden_size"]
    args = args.replace(**overrides)
    if args.is_recurrent and not saved:
        # R: num_recurrences; an old config.json's train_recurrences (num_recurrences was the depth).
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
