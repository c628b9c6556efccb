"""Dense models <-> stock transformers folders: GPT2LMHeadModel and LlamaForCausalLM.

A dense grt_titan model (`n_core_layers = 0`: the `dense_*` flavors) is a plain transformer,
so it exports as the stock class of its block style, loadable with no `trust_remote_code`
(docs/hf_export.md, "Dense models: stock GPT-2 and Llama folders"):

| block_style | model_type | class            | weights                                              |
|-------------|------------|------------------|------------------------------------------------------|
| gpt2        | gpt2       | GPT2LMHeadModel  | Conv1D layout (transposed), q/k/v fused in c_attn;   |
|             |            |                  | a tied LM head is not stored (GPT-2's own layout)    |
| llama       | llama      | LlamaForCausalLM | torchtitan's Llama3StateDictAdapter (q/k permuted to |
|             |            |                  | HF's rotate_half RoPE); lm_head unless tied          |

The native side is the dense GRTModel's state dict: blocks `prelude.layers.{i}` then
`coda.layers.{j}` (stock layer p + j), `tok_embeddings`, `pos_embeddings` (gpt2), `norm`,
`output`. Padded vocabulary rows (`vocab_multiple_of`) are trimmed on the way out and come
back as zeros, as in the GRT export.

The mapping is plain functions of (state dict, args) and (config.json dict), usable outside
export / import (e.g. reading a stock folder as a source model, as grt_titan/hf/retrofit.py
does with its own reader today):

- `stock_export_problems(args)`: why a model has no stock form ([] if it has one).
- `stock_config(args, ...)`: the transformers config object of the export.
- `native_to_stock_state_dict(native, args)` / `stock_to_native_state_dict(hf, args)`:
  weights, exact inverses of each other (float32 round trip is bit-exact).
- `dense_args_from_stock_config(config)`: GRTModelArgs of a stock config.json (exact for
  grt_titan's own stock exports, which keep every field in `training_settings`).
- `write_stock_folder` / `read_stock_folder` / `verify_stock_folder`: the folder.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import torch

from grt_titan.atomic_dir import atomic_directory
from grt_titan.checkpoint_io import CheckpointError, check_native_shapes, model_from_state, read_hf_weights
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.blocks import llama_block_args
from grt_titan.model.state_dict_adapter import TRAINING_ONLY_KEYS

from .config_map import model_args_dict
from .convert import (
    DEFAULT_MAX_SHARD_SIZE,
    ExportError,
    cast_for_export,
    check_export_target,
    logits_difference,
    special_ids,
    write_tokenizer_files_and_generation_config,
    write_weights,
)

STOCK_MODEL_TYPES = ("gpt2", "llama")  # block_style == model_type
STOCK_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
# GPT-2's tanh GELU under its two transformers names (the same function).
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
# Keys of stock GPT-2 files that are buffers, not weights (older transformers saved them).
_GPT2_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class StockFormatError(CheckpointError):
    """A model or a folder that has no stock transformers form, named in one line."""


# ---- which models have a stock form -------------------------------------------------------


def stock_export_problems(args: GRTModelArgs) -> list[str]:
    """Why `args` cannot be written as a stock GPT-2 / Llama model ([] if it can)."""
    problems = []
    if args.is_recurrent:
        problems.append(
            f"n_core_layers = {args.n_core_layers}: a recurrent model (core x R) has no stock transformers "
            "class; export it as model_type 'grt' (--format grt)"
        )
    if args.block_style not in STOCK_MODEL_TYPES:
        problems.append(f"block_style = {args.block_style!r} has no stock export (allowed: {list(STOCK_MODEL_TYPES)})")
    elif args.head_dim * args.n_heads != args.dim:
        problems.append(f"head_dim = {args.head_dim} != dim / n_heads = {args.dim} / {args.n_heads}")
    return problems


def check_stock_exportable(args: GRTModelArgs) -> None:
    """StockFormatError (one line, naming the settings) if `args` has no stock form."""
    problems = stock_export_problems(args)
    if problems:
        raise StockFormatError(
            f"{args.block_style} model cannot be exported as a stock transformers model: " + "; ".join(problems)
        )


# ---- config ---------------------------------------------------------------------------


def n_dense_layers(args: GRTModelArgs) -> int:
    return args.n_prelude_layers + args.n_coda_layers


def _native_layer_prefixes(args: GRTModelArgs) -> list[str]:
    """Native block prefixes in stock layer order: the prelude's, then the coda's."""
    return [f"prelude.layers.{i}" for i in range(args.n_prelude_layers)] + [
        f"coda.layers.{j}" for j in range(args.n_coda_layers)
    ]


def llama_rope_parameters(args: GRTModelArgs) -> dict[str, Any]:
    """transformers' `rope_parameters` of the RoPE torchtitan's llama blocks compute for
    `args`: llama3 scaling (torchtitan's default, or `rope_scaling`), "default" for factor 1."""
    scaling = llama_block_args(args).rope_scaling_args
    if scaling is None or float(scaling.scaling_factor) == 1.0:  # factor 1: the frequencies unchanged
        return {"rope_type": "default", "rope_theta": args.rope_theta}
    return {
        "rope_type": "llama3",
        "rope_theta": args.rope_theta,
        "factor": float(scaling.scaling_factor),
        "low_freq_factor": float(scaling.low_freq_factor),
        "high_freq_factor": float(scaling.high_freq_factor),
        "original_max_position_embeddings": int(scaling.original_max_position_embeddings),
    }


def stock_config(args: GRTModelArgs, dtype: str = "float32", eos_id: int | None = None, bos_id: int | None = None):
    """The transformers GPT2Config / LlamaConfig of dense `args`; every GRTModelArgs field is
    kept under `training_settings.grt_model_args` (transformers ignores it) so import is exact."""
    check_stock_exportable(args)
    bos_id = eos_id if bos_id is None else bos_id
    if args.block_style == "gpt2":
        from transformers import GPT2Config

        config = GPT2Config(
            vocab_size=args.vocab_size,  # the true vocabulary, never padded_vocab_size
            n_positions=args.max_seq_len,
            n_embd=args.dim,
            n_layer=n_dense_layers(args),
            n_head=args.n_heads,
            n_inner=None if args.ffn_hidden_dim == 4 * args.dim else args.ffn_hidden_dim,  # None: 4 n_embd
            activation_function="gelu_new",  # tanh GELU, as grt_titan's GPT-2 MLP
            resid_pdrop=0.0,  # grt_titan trains without dropout
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=args.norm_eps,
            tie_word_embeddings=args.tie_embeddings,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
        )
    else:
        from transformers import LlamaConfig

        config = LlamaConfig(
            vocab_size=args.vocab_size,
            hidden_size=args.dim,
            intermediate_size=args.ffn_hidden_dim,
            num_hidden_layers=n_dense_layers(args),
            num_attention_heads=args.n_heads,
            num_key_value_heads=args.n_kv_heads or args.n_heads,
            head_dim=args.head_dim,
            hidden_act="silu",
            max_position_embeddings=args.max_seq_len,
            rms_norm_eps=args.norm_eps,
            rope_parameters=llama_rope_parameters(args),
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=args.tie_embeddings,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
        )
    config.architectures = [STOCK_CLASSES[args.block_style]]
    config.dtype = dtype
    config.training_settings = {"grt_model_args": model_args_dict(args)}
    return config


def _refuse(model_type: str, key: str, value: Any, allowed: str) -> StockFormatError:
    return StockFormatError(
        f"{model_type} config.json: {key} = {value!r} cannot be read into a grt_titan model; allowed: {allowed}"
    )


def _require(config: dict[str, Any], key: str, default: Any, allowed: tuple) -> None:
    value = config.get(key, default)
    if value not in allowed:
        raise _refuse(config["model_type"], key, value, ", ".join(json.dumps(a) for a in allowed))


def _architecture(args: GRTModelArgs) -> tuple:
    """What fixes the weights and the function (two args with equal ones compute the same)."""
    rope = llama_rope_parameters(args) if args.block_style == "llama" else None
    return (args.ffn_hidden_dim, args.tie_embeddings, args.n_kv_heads or args.n_heads, rope)


def dense_args_from_stock_config(config: dict[str, Any]) -> GRTModelArgs:
    """Dense GRTModelArgs (all layers in the prelude) of a stock GPT-2 / Llama config.json.

    The architecture comes from the stock keys; other fields from `training_settings`
    where a grt_titan export wrote it (vocabulary padding, the layer split, how the MLP width
    is derived), else the defaults; so a grt_titan export imports to exactly its args. A
    setting grt_titan's blocks cannot compute is refused by name.
    """
    model_type = config.get("model_type")
    if model_type not in STOCK_MODEL_TYPES:
        raise StockFormatError(
            f"config.json: model_type = {model_type!r} is not a stock model grt_titan reads "
            f"(allowed: {list(STOCK_MODEL_TYPES)})"
        )
    saved = dict((config.get("training_settings") or {}).get("grt_model_args") or {})
    known = {f.name for f in dataclasses.fields(GRTModelArgs)}
    base = GRTModelArgs(**{k: v for k, v in saved.items() if k in known}).replace(
        block_style=model_type, n_core_layers=0
    )
    overrides = _gpt2_overrides(config) if model_type == "gpt2" else _llama_overrides(config)
    n_layers = overrides.pop("n_layers")
    if saved.get("n_prelude_layers", 0) + saved.get("n_coda_layers", 0) != n_layers:
        overrides.update(n_prelude_layers=n_layers, n_coda_layers=0)
    args = base.replace(**overrides)
    # Keep the saved (or default) spelling of each size where it computes the same.
    for key in ("ffn_dim", "tie_word_embeddings", "n_kv_heads", "rope_scaling"):
        kept = args.replace(**{key: getattr(base, key)})
        if _architecture(kept) == _architecture(args):
            args = kept
    try:
        args.validate(where=f"{model_type} config.json")
    except ValueError as e:
        raise StockFormatError(str(e)) from e
    problems = stock_export_problems(args)
    if problems:
        raise StockFormatError(f"{model_type} config.json: " + "; ".join(problems))
    return args


def _gpt2_overrides(config: dict[str, Any]) -> dict[str, Any]:
    _require(config, "activation_function", "gelu_new", GPT2_ACTIVATIONS)
    _require(config, "scale_attn_weights", True, (True,))
    _require(config, "scale_attn_by_inverse_layer_idx", False, (False,))
    dim = config["n_embd"]
    return dict(
        n_layers=config["n_layer"],
        vocab_size=config["vocab_size"],
        dim=dim,
        n_heads=config["n_head"],
        n_kv_heads=None,
        max_seq_len=config["n_positions"],
        norm_eps=config.get("layer_norm_epsilon", 1e-5),
        ffn_dim=config.get("n_inner") or 4 * dim,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
    )


def _llama_overrides(config: dict[str, Any]) -> dict[str, Any]:
    _require(config, "hidden_act", "silu", ("silu",))
    _require(config, "attention_bias", False, (False,))
    _require(config, "mlp_bias", False, (False,))
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") not in (None, dim // heads):
        raise _refuse("llama", "head_dim", config["head_dim"], f"hidden_size / num_attention_heads = {dim // heads}")
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    scaling = config.get("rope_scaling") or params  # transformers 4.x, or 5.x's rope_parameters
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    max_seq_len = config.get("max_position_embeddings", 2048)
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        rope = [float(scaling[k]) for k in keys]
    elif kind == "default":
        rope = [1.0, 1.0, 4.0, float(max_seq_len)]  # factor 1: plain RoPE
    else:
        raise _refuse("llama", "rope_scaling", scaling, '"llama3", "default" (rope_type)')
    return dict(
        n_layers=config["num_hidden_layers"],
        vocab_size=config["vocab_size"],
        dim=dim,
        n_heads=heads,
        n_kv_heads=config.get("num_key_value_heads") or heads,
        max_seq_len=max_seq_len,
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=rope,
        ffn_dim=config["intermediate_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


# ---- weights ---------------------------------------------------------------------------


def _trim_vocab(value: torch.Tensor, args: GRTModelArgs) -> torch.Tensor:
    return value[: args.vocab_size] if value.shape[0] == args.padded_vocab_size else value


def _pad_vocab(value: torch.Tensor, args: GRTModelArgs) -> torch.Tensor:
    extra = args.padded_vocab_size - value.shape[0]
    if extra <= 0 or value.shape[0] != args.vocab_size:
        return value
    return torch.cat([value, value.new_zeros((extra, *value.shape[1:]))])


def _llama_adapter(args: GRTModelArgs):
    """torchtitan's own Llama 3 <-> HF adapter (key map and the q/k RoPE permutation)."""
    from torchtitan.models.llama3.model.state_dict_adapter import Llama3StateDictAdapter

    return Llama3StateDictAdapter(llama_block_args(args), None)


def native_to_stock_state_dict(native: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """A dense GRTModel state dict -> the stock class's weights (a tied LM head is not stored,
    as transformers saves it; padded vocabulary rows are dropped)."""
    check_stock_exportable(args)
    native = {k: v for k, v in native.items() if k not in TRAINING_ONLY_KEYS}
    expected = _expected_native_keys(args)
    missing = sorted(expected - set(native))
    unexpected = sorted(set(native) - expected - {"output.weight"})
    if missing or unexpected:
        raise StockFormatError(
            f"dense state dict does not match the config: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    check_native_shapes(args, native, "state dict")
    if args.tie_embeddings and "output.weight" in native:
        if not torch.equal(native["output.weight"], native["tok_embeddings.weight"]):
            raise StockFormatError("the model ties output.weight to tok_embeddings.weight, but they differ")
        native.pop("output.weight")
    # Stock layer order: rename the blocks to layers.{l}.
    flat = {}
    for layer, prefix in enumerate(_native_layer_prefixes(args)):
        for key, value in native.items():
            if key.startswith(prefix + "."):
                flat[f"layers.{layer}{key[len(prefix) :]}"] = value
    for key in ("tok_embeddings.weight", "output.weight"):
        if key in native:
            flat[key] = _trim_vocab(native[key], args)
    for key in native:
        if not key.startswith(("prelude.", "coda.")) and key not in flat:
            flat[key] = native[key]
    if args.block_style == "llama":
        return _llama_adapter(args).to_hf(flat)
    return _gpt2_to_stock(flat, args)


def _expected_native_keys(args: GRTModelArgs) -> set[str]:
    from grt_titan.model.state_dict_adapter import expected_native_keys, optional_native_keys

    return set(expected_native_keys(args)) - optional_native_keys(args)


def _gpt2_to_stock(flat: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    hf = {
        "transformer.wte.weight": flat["tok_embeddings.weight"],
        "transformer.wpe.weight": flat["pos_embeddings.weight"],
    }
    for layer in range(n_dense_layers(args)):
        n, h = f"layers.{layer}.", f"transformer.h.{layer}."
        for leaf in ("weight", "bias"):
            hf[f"{h}ln_1.{leaf}"] = flat[f"{n}attention_norm.{leaf}"]
            hf[f"{h}ln_2.{leaf}"] = flat[f"{n}ffn_norm.{leaf}"]
        # Conv1D stores [in, out]: the transpose of nn.Linear's weight; q, k, v fused in c_attn.
        hf[f"{h}attn.c_attn.weight"] = torch.cat([flat[f"{n}attention.w{x}.weight"] for x in "qkv"]).t()
        hf[f"{h}attn.c_attn.bias"] = torch.cat([flat[f"{n}attention.w{x}.bias"] for x in "qkv"])
        for stock, native in (
            ("attn.c_proj", "attention.wo"),
            ("mlp.c_fc", "feed_forward.w1"),
            ("mlp.c_proj", "feed_forward.w2"),
        ):
            hf[f"{h}{stock}.weight"] = flat[f"{n}{native}.weight"].t()
            hf[f"{h}{stock}.bias"] = flat[f"{n}{native}.bias"]
    for leaf in ("weight", "bias"):
        hf[f"transformer.ln_f.{leaf}"] = flat[f"norm.{leaf}"]
    if "output.weight" in flat:  # untied (tie_word_embeddings = false)
        hf["lm_head.weight"] = flat["output.weight"]
    return {k: v.contiguous() for k, v in hf.items()}


def stock_to_native_state_dict(hf: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """A stock GPT-2 / Llama state dict -> the dense GRTModel's (padded vocabulary rows as
    zeros; a tied `output.weight` is the embedding). Inverse of `native_to_stock_state_dict`.
    Unknown, missing or mis-shaped keys: StockFormatError."""
    check_stock_exportable(args)
    hf = dict(hf)
    head_key = "lm_head.weight"
    embed_key = "transformer.wte.weight" if args.block_style == "gpt2" else "model.embed_tokens.weight"
    if args.block_style == "gpt2" and embed_key not in hf:
        embed_key = "wte.weight"  # the hub's GPT-2 files have no `transformer.` prefix
    if args.tie_embeddings and head_key in hf:  # a tied head stored anyway must be the embedding
        if embed_key in hf and not torch.equal(hf[head_key], hf[embed_key]):
            raise _refuse(
                args.block_style, "tie_word_embeddings", True, "false (lm_head.weight differs from the embedding)"
            )
        hf.pop(head_key)
    if args.block_style == "llama":
        flat = _llama_from_stock(hf, args)
    else:
        flat = _gpt2_from_stock(hf, args)
    prefixes = _native_layer_prefixes(args)
    native = {}
    for key, value in flat.items():
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", key)
        native[f"{prefixes[int(m.group(1))]}.{m.group(2)}" if m else key] = value
    for key in ("tok_embeddings.weight", "output.weight"):
        if key in native:
            native[key] = _pad_vocab(native[key], args)
    expected = _expected_native_keys(args)
    missing = sorted(expected - set(native))
    if missing:
        raise StockFormatError(f"{args.block_style} weights do not match config.json: missing {missing[:8]}")
    check_native_shapes(args, native, f"{args.block_style} weights")
    if args.tie_embeddings:
        native["output.weight"] = native["tok_embeddings.weight"]
    return native


def _unexpected(model_type: str, keys: list[str]) -> StockFormatError:
    return StockFormatError(f"{model_type} weights: unexpected keys {sorted(keys)[:8]} for this config.json")


def _llama_from_stock(hf: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    adapter = _llama_adapter(args)
    unexpected = []
    for key in hf:
        abstract = re.sub(r"(\d+)", "{}", key, count=1)
        m = re.search(r"\d+", key)
        if abstract not in adapter.from_hf_map or (m and int(m.group(0)) >= n_dense_layers(args)):
            unexpected.append(key)
    if unexpected:
        raise _unexpected("llama", unexpected)
    try:
        return adapter.from_hf(hf)
    except RuntimeError as e:  # a q/k weight whose shape the permutation cannot view
        raise StockFormatError(f"llama weights do not match config.json: {e}") from e


def _gpt2_from_stock(hf: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """GPT-2 weights with or without the `transformer.` prefix (the hub's files have none);
    the attention-mask buffers of old files are dropped, a stored lm_head must be the tied wte."""
    state = {}
    for key, value in hf.items():
        if key.endswith(_GPT2_BUFFER_SUFFIXES):
            continue
        state[key.removeprefix("transformer.")] = value
    flat, used = {}, set()

    def take(key: str) -> torch.Tensor:
        if key not in state:
            raise StockFormatError(f"gpt2 weights do not match config.json: missing {key!r}")
        used.add(key)
        return state[key]

    flat["tok_embeddings.weight"] = take("wte.weight")
    flat["pos_embeddings.weight"] = take("wpe.weight")
    d = args.dim
    for layer in range(n_dense_layers(args)):
        n, h = f"layers.{layer}.", f"h.{layer}."
        for leaf in ("weight", "bias"):
            flat[f"{n}attention_norm.{leaf}"] = take(f"{h}ln_1.{leaf}")
            flat[f"{n}ffn_norm.{leaf}"] = take(f"{h}ln_2.{leaf}")
        c_attn_w, c_attn_b = take(f"{h}attn.c_attn.weight"), take(f"{h}attn.c_attn.bias")
        if tuple(c_attn_w.shape) != (d, 3 * d):
            raise StockFormatError(
                f"gpt2 weights: {h}attn.c_attn.weight has shape {tuple(c_attn_w.shape)}, config {(d, 3 * d)}"
            )
        for i, x in enumerate("qkv"):
            flat[f"{n}attention.w{x}.weight"] = c_attn_w[:, i * d : (i + 1) * d].t().contiguous()
            flat[f"{n}attention.w{x}.bias"] = c_attn_b[i * d : (i + 1) * d].clone()
        for stock, native in (
            ("attn.c_proj", "attention.wo"),
            ("mlp.c_fc", "feed_forward.w1"),
            ("mlp.c_proj", "feed_forward.w2"),
        ):
            flat[f"{n}{native}.weight"] = take(f"{h}{stock}.weight").t().contiguous()
            flat[f"{n}{native}.bias"] = take(f"{h}{stock}.bias")
    for leaf in ("weight", "bias"):
        flat[f"norm.{leaf}"] = take(f"ln_f.{leaf}")
    if not args.tie_embeddings:
        flat["output.weight"] = take("lm_head.weight")
    unexpected = [k for k in state if k not in used]
    if unexpected:
        raise _unexpected("gpt2", unexpected)
    return flat


# ---- the folder -----------------------------------------------------------------------


def is_stock_config(config: dict[str, Any]) -> bool:
    return config.get("model_type") in STOCK_MODEL_TYPES


def read_stock_folder(folder: str | Path) -> tuple[GRTModelArgs, dict[str, torch.Tensor]]:
    """(dense args, native state dict) of a stock GPT-2 / Llama folder."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StockFormatError(f"{folder / 'config.json'}: cannot read: {e}") from e
    args = dense_args_from_stock_config(config)
    return args, stock_to_native_state_dict(read_hf_weights(folder), args)


def write_stock_folder(
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
) -> Path:
    """Write a stock GPT2LMHeadModel / LlamaForCausalLM folder for a dense model; all-or-nothing.

    The arguments are `write_hf_folder`'s (grt_titan/hf/convert.py): the same tokenizer files,
    generation config, dtypes and shards; config.json is the stock class's, the weights carry
    its names, and there is no remote code. `verify`: load the folder with
    `AutoModelForCausalLM.from_pretrained` (no trust_remote_code) and compare fp32 logits.
    """
    from grt_titan.tokenizer import load_tokenizer

    out = Path(out)
    check_stock_exportable(model_args)
    check_export_target(out, overwrite, dtype)
    if verify and dtype != "float32":
        raise ExportError("--verify compares float32 logits; export in float32 to verify")
    tokenizer = load_tokenizer(tokenizer_path)
    hf = cast_for_export(native_to_stock_state_dict(native_state_dict, model_args), dtype)
    with atomic_directory(out, overwrite) as tmp:
        files = write_weights(tmp, hf, max_shard_size)
        eos_id, bos_id = special_ids(tokenizer, model_args)
        stock_config(model_args, dtype, eos_id, bos_id).to_json_file(str(tmp / "config.json"), use_diff=False)
        write_tokenizer_files_and_generation_config(tmp, tokenizer, model_args, write_tokenizer)
        card = dict(card or {}, dtype=dtype, weight_files=files, folder_name=out.name)
        (tmp / "README.md").write_text(render_stock_card(model_args, hf, card))
        if verify:
            verify_stock_folder(tmp, native_state_dict, model_args)
    return out


def verify_stock_folder(
    folder: str | Path, native_state_dict: dict[str, torch.Tensor], model_args: GRTModelArgs, atol: float = 1e-4
) -> float:
    """Max |logits difference| between the torchtitan model and the folder loaded as the stock
    class (fp32, no trust_remote_code); StockFormatError above `atol` or for another class."""
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if type(hf_model).__name__ != STOCK_CLASSES[model_args.block_style]:
        raise StockFormatError(f"verification failed: {folder} loads as {type(hf_model).__name__}")
    diff = logits_difference(model_from_state(native_state_dict, model_args).eval(), hf_model, model_args, batch=2)
    if not diff < atol:
        raise StockFormatError(
            f"verification failed: stock {type(hf_model).__name__} logits differ by {diff:.3g} (> {atol})"
        )
    return diff


def render_stock_card(args: GRTModelArgs, hf_state_dict: dict[str, Any], card: dict[str, Any]) -> str:
    """README.md of a stock export: what it is, the training facts, and how to load it."""
    cls = STOCK_CLASSES[args.block_style]
    name = card.get("folder_name") or "dense_model"
    total = sum(v.numel() for v in hf_state_dict.values())

    def fact(key: str) -> str:
        value = card.get(key)
        return "unknown" if value is None else (f"{value:.4f}" if isinstance(value, float) else f"{value}")

    heads = f"{args.n_heads} heads" + (f", {args.n_kv_heads} KV heads" if args.n_kv_heads else "")
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            f"tags: [{args.block_style}, torchtitan, grt-titan]",
            "---",
            "",
            f"# Dense {args.block_style} model ({cls})",
            "",
            "Exported from a torchtitan checkpoint by `grt-titan export-hf` as a stock transformers "
            f"model: a dense twin of the Gated Recurrent Transformer (no recurrence), {n_dense_layers(args)} "
            f"layers, d = {args.dim}, {heads}, vocabulary {args.vocab_size}, context {args.max_seq_len}; "
            f"{total:,} stored parameters.",
            "",
            f"- flavor: {fact('flavor')}; config: {fact('config_file')}; checkpoint: {fact('source_checkpoint')}",
            f"- training steps: {fact('step')}; tokens: {fact('tokens_seen')}; validation loss: {fact('validation_loss')}",
            f"- exported dtype: {fact('dtype')}; weight files: {', '.join(card.get('weight_files', []))}",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'tok = AutoTokenizer.from_pretrained("{name}")',
            f'model = AutoModelForCausalLM.from_pretrained("{name}")',
            'out = model.generate(**tok("The meaning of life is", return_tensors="pt"), max_new_tokens=32)',
            "print(tok.decode(out[0]))",
            "```",
            "",
        ]
    )
