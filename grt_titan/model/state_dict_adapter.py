"""Native (torchtitan) <-> Hugging Face parameter names of the GRT: one declarative key map.

The HF names are those of grt_titan/hf/remote/modeling_grt.py (a `trust_remote_code` model):

| native (torchtitan)                          | Hugging Face                                 |
|----------------------------------------------|----------------------------------------------|
| tok_embeddings.weight                        | model.embed_tokens.weight                    |
| pos_embeddings.weight (gpt2)                 | model.embed_positions.weight                 |
| prelude.layers.{i}.<block>                   | model.prelude.{i}.<block>                    |
| recurrence.step.core.layers.{i}.<block>      | model.core.{i}.<block> (one copy, shared)    |
| recurrence.step.proj.weight                  | model.proj.weight (W_proj)                   |
| recurrence.step.gate.{state_norm,anchor_norm,w_in,w_out}.* | model.gate.{same}.*            |
| recurrence.step.adapters.{a,b}.{qkv,attention_out,mlp_in,mlp_out} (RRT) | model.adapters.{same} |
| recurrence.anchor.{anchor_proj,init_delta_proj}.weight (SCSE) | model.anchor.{same}.weight |
| recurrence.router.steps.{i}.weight (MoR)     | model.router.{i}.weight                      |
| recurrence.router.depth.weight (MoR, token choice) | model.depth_router.weight (HF saves only) |
| coda.layers.{i}.<block>                      | model.coda.{i}.<block>                       |
| norm.*                                       | model.norm.*                                 |
| output.weight                                | lm_head.weight (llama only; gpt2 ties it)    |
| exit_gate.{weight,bias} (Ouro)               | model.exit_gate.{weight,bias}                |
| recurrence.depth_sampler.draws                       | not exported (training-only sampler counter) |

<block>: attention_norm -> input_layernorm, attention.w{q,k,v,o} -> self_attn.{q,k,v,o}_proj,
ffn_norm -> post_attention_layernorm, feed_forward.w2 -> mlp.down_proj; feed_forward.w1 ->
mlp.gate_proj and w3 -> mlp.up_proj (llama SwiGLU), w1 -> mlp.up_proj (gpt2 GELU MLP);
qwen3 adds attention.{q,k}_norm -> self_attn.{q,k}_norm.

Values are passed through untouched (no wq/wk permutation: modeling_grt.py applies RoPE on
interleaved pairs exactly like torchtitan), so `to_hf` works on DTensors and on the empty
sharded state dict torchtitan builds its HF read plan from, and `from_hf` is its exact
inverse.

One exception, with `vocab_multiple_of` > 1 (`padded_vocab_size` > `vocab_size`): the HF
side holds the true vocabulary. `to_hf` keeps the first `vocab_size` rows of
tok_embeddings.weight and output.weight (a view), and `from_hf` appends zero rows up to
`padded_vocab_size`. torchtitan's `last_save_in_hf` thus writes what `grt-titan export-hf`
writes, and `initial_load_in_hf` / import leave the padded rows at zero (they are never a
target or an input id). Here on plain tensors: model/ imports nothing from torch.distributed
(tests/test_layers.py). The spec registers `ShardedGRTStateDictAdapter`
(grt_titan/components/checkpoint.py), which does the same on the vocabulary-sharded
DTensors torchtitan's CheckpointManager hands it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

from .args import GRTModelArgs
from .model import build_meta_model

logger = logging.getLogger(__name__)

# Buffers that exist only for training and are never exported; import leaves them alone.
TRAINING_ONLY_KEYS = frozenset({"recurrence.depth_sampler.draws"})
# Native weights whose rows are the (padded) vocabulary; the HF side has vocab_size rows.
VOCAB_ROW_KEYS = frozenset({"tok_embeddings.weight", "output.weight"})

_STACKS = (
    ("prelude.layers.", "model.prelude."),
    ("recurrence.step.core.layers.", "model.core."),
    ("coda.layers.", "model.coda."),
)

_BLOCK_COMMON = {
    "attention_norm": "input_layernorm",
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w2": "mlp.down_proj",
}
_BLOCK_BY_STYLE = {
    "llama": {**_BLOCK_COMMON, "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj"},
    "gpt2": {**_BLOCK_COMMON, "feed_forward.w1": "mlp.up_proj"},
}
# qwen3: llama's plus the per-head q/k RMSNorms (Qwen3's `self_attn.{q,k}_norm`).
_BLOCK_BY_STYLE["qwen3"] = {
    **_BLOCK_BY_STYLE["llama"],
    "attention.q_norm": "self_attn.q_norm",
    "attention.k_norm": "self_attn.k_norm",
}

_TOP_LEVEL = {
    "tok_embeddings": "model.embed_tokens",
    "pos_embeddings": "model.embed_positions",
    "recurrence.step.proj": "model.proj",
    "recurrence.step.gate.state_norm": "model.gate.state_norm",
    "recurrence.step.gate.anchor_norm": "model.gate.anchor_norm",
    "recurrence.step.gate.w_in": "model.gate.w_in",
    "recurrence.step.gate.w_out": "model.gate.w_out",
    "recurrence.step.adapters.a": "model.adapters.a",  # RRT: A [R, n, r, in] per adapted linear
    "recurrence.step.adapters.b": "model.adapters.b",  # RRT: B [R, n, out, r]
    "recurrence.anchor.anchor_proj": "model.anchor.anchor_proj",  # SCSE: A of h* = e + a A e
    "recurrence.anchor.init_delta_proj": "model.anchor.init_delta_proj",  # SCSE: B of h_0 = e + b B e
    "norm": "model.norm",
    "output": "lm_head",
    "exit_gate": "model.exit_gate",  # Ouro (objective = "exit_distribution")
    "recurrence.router.depth": "model.depth_router",  # MoR token choice: Linear(d, R)
}


def _split_leaf(key: str) -> tuple[str, str]:
    module, _, leaf = key.rpartition(".")
    return module, leaf


def native_to_hf_key(key: str, block_style: str) -> str:
    """The HF name of native parameter `key`; ValueError for a key outside the map."""
    module, leaf = _split_leaf(key)
    for native_prefix, hf_prefix in _STACKS:
        if module.startswith(native_prefix):
            index, _, inner = module[len(native_prefix) :].partition(".")
            block_map = _BLOCK_BY_STYLE[block_style]
            if index.isdigit() and inner in block_map:
                return f"{hf_prefix}{index}.{block_map[inner]}.{leaf}"
            break
    else:
        if module in _TOP_LEVEL:
            return f"{_TOP_LEVEL[module]}.{leaf}"
        step, _, index = module.rpartition(".")
        if step == "recurrence.router.steps" and index.isdigit():  # MoR: one router per step
            return f"model.router.{index}.{leaf}"
    raise ValueError(f"no Hugging Face name for GRT parameter {key!r} (block_style={block_style!r})")


def expected_native_keys(model_args: GRTModelArgs) -> list[str]:
    """Persistent state-dict keys of `GRTModel(model_args)`, in module order (meta build)."""
    return list(build_meta_model(model_args).state_dict().keys())


def optional_native_keys(model_args: GRTModelArgs) -> frozenset[str]:
    """Native keys a weights-only state may lack: training-only buffers, and the LM head
    when it is tied to the embedding."""
    return TRAINING_ONLY_KEYS | ({"output.weight"} if model_args.tie_embeddings else frozenset())


class GRTStateDictAdapter:
    """The native <-> HF key map, on plain tensors; host-neutral. The spec's torchtitan hook
    (`[checkpoint] last_save_in_hf`) is its subclass `ShardedGRTStateDictAdapter`
    (grt_titan/components/checkpoint.py), which adds torchtitan's base class.

    Args:
        model_args: The flavor's args after `[grt]` overrides.
        hf_assets_path: `[model] hf_assets_path`. A folder holding a
            `model.safetensors.index.json` whose keys are exactly this model's HF keys sets
            the shard layout of HF saves; anything else (the tokenizer's `.tiktoken` file,
            a folder without an index) saves one consolidated file.
    """

    def __init__(self, model_args: GRTModelArgs, hf_assets_path: str | None):
        # torchtitan's StateDictAdapter.__init__ is not called (a subclass may have it as a
        # base): it opens `<hf_assets_path>/model.safetensors.index.json` and fails when
        # hf_assets_path is a file (our tokenizer path may be a .tiktoken file).
        self.model_args = model_args
        self.hf_assets_path = hf_assets_path
        self.block_style = model_args.block_style
        self.tied = model_args.tie_embeddings
        optional = optional_native_keys(model_args)
        native = [k for k in expected_native_keys(model_args) if k not in optional]
        self.to_hf_map = {k: native_to_hf_key(k, self.block_style) for k in native}
        self.from_hf_map = {v: k for k, v in self.to_hf_map.items()}
        assert len(self.from_hf_map) == len(self.to_hf_map), "HF key map is not one-to-one"
        self.fqn_to_index_mapping = self._read_index(hf_assets_path)
        self.vocab_size = model_args.vocab_size
        self.padded_vocab_size = model_args.padded_vocab_size

    def _read_index(self, hf_assets_path: str | None) -> dict[str, int] | None:
        if not hf_assets_path or not os.path.isdir(hf_assets_path):
            return None
        path = os.path.join(hf_assets_path, "model.safetensors.index.json")
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            weight_map = json.load(f).get("weight_map", {})
        if set(weight_map) != set(self.from_hf_map):
            logger.warning(f"{path} does not list exactly this model's weights; HF saves use one file")
            return None
        # "model-00002-of-00003.safetensors" -> 2
        return {k: int(v.split("-")[1]) for k, v in weight_map.items()}

    @property
    def hf_keys(self) -> list[str]:
        """HF keys in module order (the order the export writes them)."""
        return list(self.from_hf_map)

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename native keys to HF keys; drops training-only buffers and the tied head, and
        trims padded vocabulary rows (`vocab_multiple_of`) to vocab_size."""
        hf, optional = {}, optional_native_keys(self.model_args)
        for key, value in state_dict.items():
            if key in optional:
                continue
            if key not in self.to_hf_map:
                raise ValueError(
                    f"unexpected GRT state-dict key {key!r} for this model (block_style="
                    f"{self.block_style!r}); the checkpoint and the config do not match"
                )
            if key in VOCAB_ROW_KEYS:
                value = self._trim_vocab(key, value)
            hf[self.to_hf_map[key]] = value
        return hf

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename HF keys to native keys (inverse of `to_hf`; padded vocabulary rows, dropped
        by `to_hf`, come back as zeros)."""
        native = {}
        for key, value in hf_state_dict.items():
            if key not in self.from_hf_map:
                raise ValueError(
                    f"unexpected Hugging Face key {key!r} for this GRT model; the weights and the config do not match"
                )
            native_key = self.from_hf_map[key]
            if native_key in VOCAB_ROW_KEYS:
                value = self._pad_vocab(native_key, value)
            native[native_key] = value
        return native

    # ---- vocabulary padding (vocab_multiple_of) ---------------------------------------

    def _trim_vocab(self, key: str, value: Any) -> Any:
        """The first vocab_size rows of a padded vocabulary weight (a view: a DCP load into it
        fills the original rows); other shapes unchanged (a mismatched checkpoint is reported
        by the shape checks, not here)."""
        if not self._padding_applies(value, self.padded_vocab_size):
            return value
        return value.narrow(0, 0, self.vocab_size)

    def _pad_vocab(self, key: str, value: Any) -> Any:
        """vocab_size rows -> padded_vocab_size rows, the new rows zero; other shapes unchanged."""
        if not self._padding_applies(value, self.vocab_size):
            return value
        extra = self.padded_vocab_size - self.vocab_size
        return torch.cat([value, value.new_zeros((extra, *value.shape[1:]))])

    def _padding_applies(self, value: Any, rows: int) -> bool:
        """Whether the vocabulary is padded and `value` has the `rows` rows of one side."""
        return self.padded_vocab_size != self.vocab_size and value.shape[0] == rows
