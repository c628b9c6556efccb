"""Stock transformers folders <-> grt_titan: GPT2LMHeadModel, LlamaForCausalLM, Qwen3ForCausalLM.

The one reader of stock Hugging Face models (config.json and safetensors of a GPT-2, Llama or
Qwen3 folder), which import-hf, the retrofit (grt_titan/hf/retrofit.py) and the distillation
teacher use, and the writer of a dense grt_titan model (`n_core_layers = 0`: the `dense_*`
flavors) as the stock class of its block style, loadable with no `trust_remote_code`
(docs/hf_export.md, "Dense models: stock GPT-2, Llama and Qwen3 folders"):

| block_style | model_type | class            | weights                                              |
|-------------|------------|------------------|------------------------------------------------------|
| gpt2        | gpt2       | GPT2LMHeadModel  | Conv1D layout (transposed), q/k/v fused in c_attn;   |
|             |            |                  | a tied LM head is not stored (GPT-2's own layout)    |
| llama       | llama      | LlamaForCausalLM | torchtitan 0.2.2's Llama3 key map, copied (q/k       |
|             |            |                  | permuted to HF's rotate_half RoPE); lm_head unless   |
|             |            |                  | tied (grt_titan/hf/stock_key_maps.py)                |
| qwen3       | qwen3      | Qwen3ForCausalLM | torchtitan 0.2.2's Qwen3 key map, copied (key map:   |
|             |            |                  | both sides rotate halves); lm_head unless tied       |

Reading is two steps, each with one set of one-line refusals that name the key or file:

- `stock_architecture(config)`: the GRTModelArgs fields a config.json fixes (widths, heads and
  KV heads, head width, MLP width, RoPE theta and scaling, norm eps, tying, vocabulary,
  positions); `source_args(config)` makes them a dense model, every layer in the prelude.
- `stock_to_flat(hf, args, layers)`: the weights as flat native tensors, `layers.{i}.<block>`
  for source layer i plus `tok_embeddings`, `pos_embeddings` (gpt2), `norm`, `output`
  (untied), the source's own vocabulary rows. `place_layers` puts layer i where a model keeps
  it: a dense model's `prelude.layers.{i}` / `coda.layers.{j}` (stock layer p + j), or the
  retrofit's prelude, core and coda.

For the dense export and import: `stock_export_problems(args)` (why a model has no stock
form), `stock_config(args, ...)`, `native_to_stock_state_dict` / `stock_to_native_state_dict`
(exact inverses, a float32 round trip is bit-exact; padded vocabulary rows, `vocab_multiple_of`,
are trimmed on the way out and come back as zeros), `dense_args_from_stock_config` (exact for
grt_titan's own exports, which keep every field in `training_settings`), and the folder:
`write_stock_folder` / `read_stock_folder` / `verify_stock_folder`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from grt_titan.checkpoints.hf_weights import read_hf_weights
from grt_titan.checkpoints.load import model_from_state
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.blocks import llama_block_args
from grt_titan.model.model import build_meta_model
from grt_titan.model.state_dict_adapter import TRAINING_ONLY_KEYS, VOCAB_ROW_KEYS, optional_native_keys
from grt_titan.run_reader import CheckpointError
from grt_titan.runtime.atomic_dir import atomic_directory

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
from .stock_key_maps import stock_key_map

STOCK_MODEL_TYPES = ("gpt2", "llama", "qwen3")  # block_style == model_type
STOCK_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# GPT-2's tanh GELU under its two transformers names (the same function).
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
# Keys of stock GPT-2 files that are buffers, not weights (older transformers saved them).
_GPT2_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# transformers' defaults where a config.json leaves a key out (LlamaConfig, Qwen3Config).
_DEFAULT_POSITIONS = {"llama": 2048, "qwen3": 32768}
_QWEN3_DEFAULT_HEAD_DIM = 128
_LAYER_KEY = re.compile(r"layers\.(\d+)\.")


class StockFormatError(CheckpointError):
    """A stock config.json or weights grt_titan cannot read, or a model without a stock form,
    named in one line."""


# ---- config.json -> the architecture ------------------------------------------------------


def read_stock_config(folder: str | Path) -> dict[str, Any]:
    """config.json of the Hugging Face folder `folder` (one line naming the file if absent or bad)."""
    folder = Path(folder)
    path = folder / "config.json"
    if not folder.is_dir():
        raise StockFormatError(f"{folder}: not a folder (a Hugging Face model folder is expected)")
    if not path.is_file():
        raise StockFormatError(f"{path}: missing (a Hugging Face model folder has one)")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StockFormatError(f"{path}: not valid JSON: {e}") from e


def is_stock_config(config: dict[str, Any]) -> bool:
    return config.get("model_type") in STOCK_MODEL_TYPES


def _refuse(model_type: str, key: str, value: Any, allowed: str) -> StockFormatError:
    return StockFormatError(
        f"{model_type} config.json: {key} = {value!r} cannot be read into a grt_titan model; allowed: {allowed}"
    )


def _require(config: dict[str, Any], key: str, default: Any, allowed: tuple) -> None:
    value = config.get(key, default)
    if value not in allowed:
        raise _refuse(config["model_type"], key, value, ", ".join(json.dumps(a) for a in allowed))


def _key(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise StockFormatError(f"{config['model_type']} config.json: {key} is missing")
    return config[key]


def stock_architecture(config: dict[str, Any]) -> dict[str, Any]:
    """The GRTModelArgs fields a stock config.json fixes, and `n_layers`: what grt_titan's
    blocks need to compute the source exactly. Sizes the flavors derive stay None where the
    source's equal the derivation (gpt2's 4d MLP and tied head); a setting the blocks cannot
    compute is refused in one line naming the key and what is allowed."""
    model_type = config.get("model_type")
    if model_type not in STOCK_MODEL_TYPES:
        raise StockFormatError(
            f"config.json: model_type = {model_type!r} cannot be read into a grt_titan model; "
            f"allowed: {', '.join(STOCK_MODEL_TYPES)}"
        )
    return _gpt2_architecture(config) if model_type == "gpt2" else _rope_architecture(config)


def _gpt2_architecture(config: dict[str, Any]) -> dict[str, Any]:
    _require(config, "activation_function", "gelu_new", GPT2_ACTIVATIONS)
    _require(config, "scale_attn_weights", True, (True,))
    _require(config, "scale_attn_by_inverse_layer_idx", False, (False,))
    dim = int(_key(config, "n_embd"))
    n_inner = config.get("n_inner")
    return dict(
        block_style="gpt2",
        n_layers=int(_key(config, "n_layer")),
        vocab_size=int(_key(config, "vocab_size")),
        dim=dim,
        n_heads=int(_key(config, "n_head")),
        n_kv_heads=None,
        max_seq_len=int(_key(config, "n_positions")),
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        ffn_dim=None if n_inner in (None, 4 * dim) else int(n_inner),
        tie_word_embeddings=None if config.get("tie_word_embeddings", True) else False,
    )


def _rope_architecture(config: dict[str, Any]) -> dict[str, Any]:
    """Llama (3.x) and Qwen3: RMSNorm, SwiGLU, GQA, RoPE; Qwen3 adds qk-norm and its head width."""
    model_type = config["model_type"]
    _require(config, "hidden_act", "silu", ("silu",))
    _require(config, "attention_bias", False, (False,))
    if model_type == "llama":
        _require(config, "mlp_bias", False, (False,))
    else:
        _require(config, "use_sliding_window", False, (False,))
    dim, heads = int(_key(config, "hidden_size")), int(_key(config, "num_attention_heads"))
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    scaling = config.get("rope_scaling") or params  # transformers 4.x, or 5.x's rope_parameters
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    max_seq_len = int(config.get("max_position_embeddings", _DEFAULT_POSITIONS[model_type]))
    fields = dict(
        block_style=model_type,
        n_layers=int(_key(config, "num_hidden_layers")),
        vocab_size=int(_key(config, "vocab_size")),
        dim=dim,
        n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        max_seq_len=max_seq_len,
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(params.get("rope_theta", config.get("rope_theta", 10000.0))),
        ffn_dim=int(_key(config, "intermediate_size")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )
    if model_type == "qwen3":
        if kind != "default":
            raise _refuse(model_type, "rope_scaling", scaling, '"default" (rope_type: qwen3 blocks compute plain RoPE)')
        fields["attention_head_dim"] = int(config.get("head_dim") or _QWEN3_DEFAULT_HEAD_DIM)
        return fields
    if config.get("head_dim") not in (None, dim // heads):
        raise _refuse(model_type, "head_dim", config["head_dim"], f"hidden_size / num_attention_heads = {dim // heads}")
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        fields["rope_scaling"] = [float(scaling[k]) for k in keys]
    elif kind == "default":
        fields["rope_scaling"] = [1.0, 1.0, 4.0, float(max_seq_len)]  # factor 1: plain RoPE
    else:
        raise _refuse(model_type, "rope_scaling", scaling, '"llama3", "default" (rope_type)')
    return fields


def _checked(args: GRTModelArgs, where: str) -> GRTModelArgs:
    try:
        args.validate(where=where)
    except ValueError as e:
        raise StockFormatError(str(e)) from e
    return args


def source_args(config: dict[str, Any]) -> GRTModelArgs:
    """The model of a stock config.json as dense GRTModelArgs: its architecture, every layer
    in the prelude, every other field the default (what a retrofit starts from)."""
    fields = stock_architecture(config)
    n_layers = fields.pop("n_layers")
    args = GRTModelArgs(**fields, n_prelude_layers=n_layers, n_core_layers=0, n_coda_layers=0)
    return _checked(args, f"{fields['block_style']} config.json")


def _architecture(args: GRTModelArgs) -> tuple:
    """What fixes the weights and the function (two args with equal ones compute the same)."""
    rope = llama_rope_parameters(args) if args.block_style == "llama" else None
    return (args.ffn_hidden_dim, args.tie_embeddings, args.n_kv_heads or args.n_heads, args.head_dim, rope)


def dense_args_from_stock_config(config: dict[str, Any]) -> GRTModelArgs:
    """Dense GRTModelArgs (all layers in the prelude) of a stock config.json, for import.

    The architecture comes from the stock keys (`stock_architecture`); other fields from
    `training_settings` where a grt_titan export wrote it (vocabulary padding, the layer
    split, how the MLP width is derived), else the defaults; so a grt_titan export imports to
    exactly its args.
    """
    fields = stock_architecture(config)
    model_type = fields["block_style"]
    saved = dict((config.get("training_settings") or {}).get("grt_model_args") or {})
    known = {f.name for f in dataclasses.fields(GRTModelArgs)}
    base = GRTModelArgs(**{k: v for k, v in saved.items() if k in known}).replace(
        block_style=model_type, n_core_layers=0
    )
    n_layers = fields.pop("n_layers")
    if saved.get("n_prelude_layers", 0) + saved.get("n_coda_layers", 0) != n_layers:
        fields.update(n_prelude_layers=n_layers, n_coda_layers=0)
    args = base.replace(**fields)
    # Keep the saved (or default) spelling of each size where it computes the same.
    for key in ("ffn_dim", "tie_word_embeddings", "n_kv_heads", "rope_scaling", "attention_head_dim"):
        kept = args.replace(**{key: getattr(base, key)})
        if _architecture(kept) == _architecture(args):
            args = kept
    _checked(args, f"{model_type} config.json")
    problems = stock_export_problems(args)
    if problems:
        raise StockFormatError(f"{model_type} config.json: " + "; ".join(problems))
    return args


# ---- which models have a stock form, and their config ----------------------------------------


def stock_export_problems(args: GRTModelArgs) -> list[str]:
    """Why `args` cannot be written as a stock GPT-2 / Llama / Qwen3 model ([] if it can)."""
    problems = []
    if args.is_recurrent:
        problems.append(
            f"n_core_layers = {args.n_core_layers}: a recurrent model (core x R) has no stock transformers "
            "class; export it as model_type 'grt' (--format grt)"
        )
    if args.block_style not in STOCK_MODEL_TYPES:
        problems.append(f"block_style = {args.block_style!r} has no stock export (allowed: {list(STOCK_MODEL_TYPES)})")
    elif args.block_style != "qwen3" and args.head_dim * args.n_heads != args.dim:
        problems.append(f"head_dim = {args.head_dim} != dim / n_heads = {args.dim} / {args.n_heads}")
    return problems


def check_stock_exportable(args: GRTModelArgs) -> None:
    """StockFormatError (one line, naming the settings) if `args` has no stock form."""
    problems = stock_export_problems(args)
    if problems:
        raise StockFormatError(
            f"{args.block_style} model cannot be exported as a stock transformers model: " + "; ".join(problems)
        )


def n_dense_layers(args: GRTModelArgs) -> int:
    return args.n_prelude_layers + args.n_coda_layers


def dense_layer_prefixes(args: GRTModelArgs) -> dict[int, str]:
    """Stock layer -> its block in a dense GRTModel: the prelude's, then the coda's."""
    prefixes = [f"prelude.layers.{i}" for i in range(args.n_prelude_layers)]
    prefixes += [f"coda.layers.{j}" for j in range(args.n_coda_layers)]
    return dict(enumerate(prefixes))


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
    """The transformers GPT2Config / LlamaConfig / Qwen3Config of dense `args`; every
    GRTModelArgs field is kept under `training_settings.grt_model_args` (transformers ignores
    it) so import is exact."""
    check_stock_exportable(args)
    bos_id = eos_id if bos_id is None else bos_id
    common = dict(vocab_size=args.vocab_size, tie_word_embeddings=args.tie_embeddings, bos_token_id=bos_id)
    if args.block_style == "gpt2":
        from transformers import GPT2Config

        config = GPT2Config(
            **common,  # vocab_size: the true vocabulary, never padded_vocab_size
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
            eos_token_id=eos_id,
        )
    else:
        from transformers import LlamaConfig, Qwen3Config

        rope = dict(
            **common,
            hidden_size=args.dim,
            intermediate_size=args.ffn_hidden_dim,
            num_hidden_layers=n_dense_layers(args),
            num_attention_heads=args.n_heads,
            num_key_value_heads=args.n_kv_heads or args.n_heads,
            head_dim=args.head_dim,
            hidden_act="silu",
            max_position_embeddings=args.max_seq_len,
            rms_norm_eps=args.norm_eps,
            attention_bias=False,
            eos_token_id=eos_id,
        )
        if args.block_style == "llama":
            config = LlamaConfig(**rope, rope_parameters=llama_rope_parameters(args), mlp_bias=False)
        else:
            rope_parameters = {"rope_type": "default", "rope_theta": args.rope_theta}
            config = Qwen3Config(**rope, rope_parameters=rope_parameters, use_sliding_window=False)
    config.architectures = [STOCK_CLASSES[args.block_style]]
    config.dtype = dtype
    config.training_settings = {"grt_model_args": model_args_dict(args)}
    return config


# ---- weights ---------------------------------------------------------------------------


def _layer_of(key: str) -> int | None:
    match = _LAYER_KEY.match(key)
    return None if match is None else int(match.group(1))


def place_layers(flat: dict[str, torch.Tensor], places: Mapping[int, str]) -> dict[str, torch.Tensor]:
    """Flat `layers.{i}.<block>` keys -> `places[i].<block>` (a dense model's stack, or the
    retrofit's prelude / core / coda); other keys unchanged."""
    out = {}
    for key, value in flat.items():
        match = _LAYER_KEY.match(key)
        out[key if match is None else f"{places[int(match.group(1))]}.{key[match.end() :]}"] = value
    return out


def pad_vocab_rows(native: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """Embedding / head rows of the true vocabulary, padded with zero rows to
    padded_vocab_size (`vocab_multiple_of`; never an input id or a target)."""
    extra = args.padded_vocab_size - args.vocab_size
    for key in VOCAB_ROW_KEYS & set(native):
        value = native[key]
        if extra > 0 and value.shape[0] == args.vocab_size:
            native[key] = torch.cat([value, value.new_zeros((extra, *value.shape[1:]))])
    return native


def _flat_shapes(args: GRTModelArgs) -> dict[str, tuple[int, ...]]:
    """The flat native weights of the dense `args` (the true vocabulary) and their shapes."""
    state = build_meta_model(args.replace(vocab_multiple_of=1)).state_dict()
    optional = optional_native_keys(args)
    flat = {}
    for layer, prefix in dense_layer_prefixes(args).items():
        flat.update({f"layers.{layer}{k[len(prefix) :]}": v for k, v in state.items() if k.startswith(prefix + ".")})
    flat.update({k: v for k, v in state.items() if not k.startswith(("prelude.", "coda.")) and k not in optional})
    return {k: tuple(v.shape) for k, v in flat.items()}


def stock_to_flat(
    hf: dict[str, torch.Tensor], args: GRTModelArgs, layers: Iterable[int] | None = None
) -> dict[str, torch.Tensor]:
    """The stock weights of the dense model `args` as flat native tensors: `layers.{i}.<block>`
    for the source layers `layers` (default: all; the others are not converted), embeddings,
    positions (gpt2), final norm, and the LM head unless tied (a tied head stored anyway must
    be the embedding). The true vocabulary's rows. Unknown keys, missing or mis-shaped
    weights: StockFormatError naming them."""
    style = args.block_style
    wanted = set(range(n_dense_layers(args)) if layers is None else layers)
    flat = _gpt2_from_stock(hf, args, wanted) if style == "gpt2" else _adapter_from_stock(hf, args, wanted)
    if args.tie_embeddings and "output.weight" in flat:
        head, embedding = flat.pop("output.weight"), flat.get("tok_embeddings.weight")
        if embedding is not None and not torch.equal(head, embedding):
            raise _refuse(style, "tie_word_embeddings", True, "false (lm_head.weight differs from the embedding)")
    _check_flat(flat, args, wanted, f"{style} weights")
    return flat


def _check_flat(flat: dict[str, torch.Tensor], args: GRTModelArgs, layers: set[int], where: str) -> None:
    """StockFormatError naming the keys where `flat` is not the flat weights of the dense
    `args` (of its source layers `layers`): missing, unexpected or mis-shaped."""
    expected = {k: v for k, v in _flat_shapes(args).items() if _layer_of(k) in layers | {None}}
    missing, unexpected = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
    if missing or unexpected:
        found = [f"{name} {keys[:8]}" for name, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        raise StockFormatError(f"{where} do not match config.json: " + ", ".join(found))
    bad = [f"{k}: {tuple(v.shape)} vs config {expected[k]}" for k, v in flat.items() if tuple(v.shape) != expected[k]]
    if bad:
        raise StockFormatError(f"{where} do not match config.json (shape mismatch): " + "; ".join(bad[:8]))


def _unexpected(model_type: str, keys: list[str]) -> StockFormatError:
    return StockFormatError(f"{model_type} weights: unexpected keys {sorted(keys)[:8]} for this config.json")


def _adapter_from_stock(hf: dict[str, torch.Tensor], args: GRTModelArgs, wanted: set[int]) -> dict[str, torch.Tensor]:
    """Llama / Qwen3 weights through the stock key map (torchtitan 0.2.2's, copied); rotary
    `inv_freq` buffers of old files are dropped, and the layers not `wanted` are never converted."""
    adapter, n = stock_key_map(args), n_dense_layers(args)
    kept, unexpected = {}, []
    for key, value in hf.items():
        abstract = re.sub(r"(\d+)", "{}", key, count=1)
        number = re.search(r"\d+", key)
        layer = None if number is None else int(number.group(0))
        if abstract not in adapter.from_hf_map or (layer is not None and layer >= n):
            unexpected.append(key)
        elif adapter.from_hf_map[abstract] is not None and (layer is None or layer in wanted):
            kept[key] = value
    if unexpected:
        raise _unexpected(args.block_style, unexpected)
    try:
        return adapter.from_hf(kept)
    except RuntimeError as e:  # a q/k weight whose shape the permutation cannot view
        raise StockFormatError(f"{args.block_style} weights do not match config.json: {e}") from e


def _gpt2_from_stock(hf: dict[str, torch.Tensor], args: GRTModelArgs, wanted: set[int]) -> dict[str, torch.Tensor]:
    """GPT-2 weights with or without the `transformer.` prefix (the hub's files have none);
    the attention-mask buffers of old files are dropped, and the layers not `wanted`."""
    state, count = {}, n_dense_layers(args)
    for key, value in hf.items():
        key = key.removeprefix("transformer.")
        layer = re.match(r"h\.(\d+)\.", key)
        unwanted = layer is not None and int(layer.group(1)) < count and int(layer.group(1)) not in wanted
        if not (unwanted or key.endswith(_GPT2_BUFFER_SUFFIXES)):
            state[key] = value
    flat, used = {}, set()

    def take(key: str) -> torch.Tensor:
        if key not in state:
            raise StockFormatError(f"gpt2 weights do not match config.json: missing {key!r}")
        used.add(key)
        return state[key]

    flat["tok_embeddings.weight"] = take("wte.weight")
    flat["pos_embeddings.weight"] = take("wpe.weight")
    d = args.dim
    for layer in sorted(wanted):
        n, h = f"layers.{layer}.", f"h.{layer}."
        for leaf in ("weight", "bias"):
            flat[f"{n}attention_norm.{leaf}"] = take(f"{h}ln_1.{leaf}")
            flat[f"{n}ffn_norm.{leaf}"] = take(f"{h}ln_2.{leaf}")
        c_attn_w, c_attn_b = take(f"{h}attn.c_attn.weight"), take(f"{h}attn.c_attn.bias")
        if tuple(c_attn_w.shape) != (d, 3 * d):
            raise StockFormatError(
                f"gpt2 weights: {h}attn.c_attn.weight has shape {tuple(c_attn_w.shape)}, config {(d, 3 * d)}"
            )
        # Conv1D stores [in, out]: the transpose of nn.Linear's weight; q, k, v fused in c_attn.
        for i, x in enumerate("qkv"):
            flat[f"{n}attention.w{x}.weight"] = c_attn_w[:, i * d : (i + 1) * d].t().contiguous()
            flat[f"{n}attention.w{x}.bias"] = c_attn_b[i * d : (i + 1) * d].clone()
        for stock, native in _GPT2_LINEARS:
            flat[f"{n}{native}.weight"] = take(f"{h}{stock}.weight").t().contiguous()
            flat[f"{n}{native}.bias"] = take(f"{h}{stock}.bias")
    for leaf in ("weight", "bias"):
        flat[f"norm.{leaf}"] = take(f"ln_f.{leaf}")
    if "lm_head.weight" in state:  # untied, or a tied head stored anyway (checked by the caller)
        flat["output.weight"] = take("lm_head.weight")
    unexpected = [k for k in state if k not in used]
    if unexpected:
        raise _unexpected("gpt2", unexpected)
    return flat


# Conv1D (stock GPT-2) <-> nn.Linear (grt_titan's GPT-2 block), besides the fused c_attn.
_GPT2_LINEARS = (("attn.c_proj", "attention.wo"), ("mlp.c_fc", "feed_forward.w1"), ("mlp.c_proj", "feed_forward.w2"))


def stock_to_native_state_dict(hf: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """A stock GPT-2 / Llama / Qwen3 state dict -> the dense GRTModel's (padded vocabulary rows
    as zeros; a tied `output.weight` is the embedding). Inverse of `native_to_stock_state_dict`."""
    check_stock_exportable(args)
    native = pad_vocab_rows(place_layers(stock_to_flat(hf, args), dense_layer_prefixes(args)), args)
    if args.tie_embeddings:
        native["output.weight"] = native["tok_embeddings.weight"]
    return native


def native_to_stock_state_dict(native: dict[str, torch.Tensor], args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """A dense GRTModel state dict -> the stock class's weights (a tied LM head is not stored,
    as transformers saves it; padded vocabulary rows are dropped)."""
    check_stock_exportable(args)
    native = {k: v for k, v in native.items() if k not in TRAINING_ONLY_KEYS}
    if args.tie_embeddings and "output.weight" in native:
        if not torch.equal(native["output.weight"], native["tok_embeddings.weight"]):
            raise StockFormatError("the model ties output.weight to tok_embeddings.weight, but they differ")
        native.pop("output.weight")
    # Stock layer order: the blocks renamed to layers.{l}; the vocabulary rows trimmed.
    blocks = {prefix: layer for layer, prefix in dense_layer_prefixes(args).items()}
    flat = {}
    for key, value in native.items():
        prefix = ".".join(key.split(".")[:3])
        if key in VOCAB_ROW_KEYS and value.shape[0] == args.padded_vocab_size:
            value = value[: args.vocab_size]
        flat[f"layers.{blocks[prefix]}{key[len(prefix) :]}" if prefix in blocks else key] = value
    _check_flat(flat, args, set(range(n_dense_layers(args))), "the dense model's weights")
    if args.block_style == "gpt2":
        return _gpt2_to_stock(flat, args)
    return {k: v.contiguous() for k, v in stock_key_map(args).to_hf(flat).items()}


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
        hf[f"{h}attn.c_attn.weight"] = torch.cat([flat[f"{n}attention.w{x}.weight"] for x in "qkv"]).t()
        hf[f"{h}attn.c_attn.bias"] = torch.cat([flat[f"{n}attention.w{x}.bias"] for x in "qkv"])
        for stock, native in _GPT2_LINEARS:
            hf[f"{h}{stock}.weight"] = flat[f"{n}{native}.weight"].t()
            hf[f"{h}{stock}.bias"] = flat[f"{n}{native}.bias"]
    for leaf in ("weight", "bias"):
        hf[f"transformer.ln_f.{leaf}"] = flat[f"norm.{leaf}"]
    if "output.weight" in flat:  # untied (tie_word_embeddings = false)
        hf["lm_head.weight"] = flat["output.weight"]
    return {k: v.contiguous() for k, v in hf.items()}


# ---- the folder -----------------------------------------------------------------------


def read_stock_folder(folder: str | Path) -> tuple[GRTModelArgs, dict[str, torch.Tensor]]:
    """(dense args, native state dict) of a stock GPT-2 / Llama / Qwen3 folder."""
    args = dense_args_from_stock_config(read_stock_config(folder))
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
    """Write a stock GPT2LMHeadModel / LlamaForCausalLM / Qwen3ForCausalLM folder for a dense
    model; all-or-nothing.

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
