"""The stock Llama / Qwen3 <-> grt_titan weight key maps (and Llama's q/k RoPE permutation).

A copy of torchtitan 0.2.2's state-dict adapters, torchtitan/models/llama3/model/
state_dict_adapter.py (`Llama3StateDictAdapter`) and torchtitan/models/qwen3/model/
state_dict_adapter.py (`Qwen3StateDictAdapter`): their `from_hf_map`, `to_hf` and `from_hf`,
which grt_titan/hf/stock_folders.py uses to read and write stock `LlamaForCausalLM` /
`Qwen3ForCausalLM` folders. A copy because torchtitan 0.3 removed those modules and renamed
its parameters, while the GRT keeps 0.2.2's parameter names (grt_titan/model/blocks/llama.py,
qwen3.py), so the import, export and retrofit of stock folders do not depend on the
host torchtitan.

Plain classes, without torchtitan's `StateDictAdapter` base (no HF assets, no safetensors
index). Left out, as the GRT's blocks are dense and plain tensors: Qwen3's MoE keys (grouped
experts, router) and their DTensor handling, and Qwen3's `enable_weight_tying` (always off for
the GRT's stock weights: grt_titan/hf/stock_folders.py drops or checks a tied LM head itself). Two
deliberate differences, on inputs grt_titan/hf/stock_folders.py never passes (it checks every key
against the model first): `to_hf` raises KeyError on a key outside the map for both models
(torchtitan's Qwen3 adapter skipped it), and `from_hf` drops keys that map to None (rotary
`inv_freq`) for both (torchtitan's Qwen3 adapter failed on them).
tests/hf/test_stock_key_maps.py checks the results against the originals, tensor for tensor.

Copyright (c) Meta Platforms, Inc. and affiliates. All rights reserved.
BSD-3-Clause, torchtitan's licence: grt_titan/model/LICENSE.torchtitan.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.blocks import llama_block_args

# Hugging Face key -> grt_titan (torchtitan 0.2.2) key; `{}` is the layer number; None: a key
# Hugging Face may store that has no parameter here (dropped on import).
_DENSE_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_QWEN3_QK_NORM_FROM_HF = {
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attention.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attention.k_norm.weight",
}


def _abstract(key: str) -> tuple[str, str | None]:
    """(`key` with its first number as `{}`, that number) if a layer key, else (`key`, None)."""
    if "layers" not in key:
        return key, None
    return re.sub(r"(\d+)", "{}", key, count=1), re.search(r"\d+", key).group(0)


class _KeyMap:
    """`from_hf_map` and the conversions both ways; values unchanged unless a subclass says."""

    from_hf_map: dict[str, str | None]

    def _convert_to_hf(self, abstract_key: str, value: torch.Tensor) -> torch.Tensor:
        return value

    def _convert_from_hf(self, abstract_key: str, value: torch.Tensor) -> torch.Tensor:
        return value

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """grt_titan flat keys (`layers.{i}.<block>`, embeddings, norm, output) -> Hugging Face's."""
        to_hf_map = {v: k for k, v in self.from_hf_map.items() if v is not None}
        hf_state_dict = {}
        for key, value in state_dict.items():
            abstract_key, layer_num = _abstract(key)
            new_key = to_hf_map[abstract_key]
            hf_state_dict[new_key if layer_num is None else new_key.format(layer_num)] = self._convert_to_hf(
                abstract_key, value
            )
        return hf_state_dict

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """Hugging Face keys -> grt_titan flat keys; keys mapped to None (`inv_freq`) dropped."""
        state_dict = {}
        for key, value in hf_state_dict.items():
            abstract_key, layer_num = _abstract(key)
            new_key = self.from_hf_map[abstract_key]
            if new_key is None:
                continue
            state_dict[new_key if layer_num is None else new_key.format(layer_num)] = self._convert_from_hf(
                abstract_key, value
            )
        return state_dict


class Qwen3KeyMap(_KeyMap):
    """Stock Qwen3 <-> grt_titan: the key map alone (both sides rotate halves)."""

    def __init__(self) -> None:
        self.from_hf_map = {**_DENSE_FROM_HF, **_QWEN3_QK_NORM_FROM_HF}


class LlamaKeyMap(_KeyMap):
    """Stock Llama <-> grt_titan: the key map, and q/k rows permuted between Hugging Face's
    rotate_half RoPE and the interleaved pairs of grt_titan's (torchtitan's) llama blocks."""

    def __init__(self, n_heads: int, n_kv_heads: int | None, dim: int) -> None:
        self.from_hf_map = dict(_DENSE_FROM_HF)
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.dim = dim
        self.head_dim = dim // n_heads

    # Hugging Face's permutation (torchtitan: "exact copy from their conversion script").
    @staticmethod
    def _permute(w: torch.Tensor, n_heads_arg: int, dim1: int | None = None, dim2: int | None = None) -> torch.Tensor:
        if dim1 is None:
            dim1 = w.shape[0]
        if dim2 is None:
            dim2 = w.shape[1]
        return w.view(n_heads_arg, dim1 // n_heads_arg // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2).clone()

    @staticmethod
    def _reverse_permute(
        w: torch.Tensor, n_heads_arg: int, dim1: int | None = None, dim2: int | None = None
    ) -> torch.Tensor:
        if dim1 is None:
            dim1 = w.shape[0]
        if dim2 is None:
            dim2 = w.shape[1]
        return w.view(n_heads_arg, 2, dim1 // n_heads_arg // 2, dim2).transpose(1, 2).reshape(dim1, dim2)

    def _convert_to_hf(self, abstract_key: str, value: torch.Tensor) -> torch.Tensor:
        if abstract_key == "layers.{}.attention.wq.weight":
            return self._permute(value, self.n_heads)
        if abstract_key == "layers.{}.attention.wk.weight":
            return self._permute(value, self.n_kv_heads, self.head_dim * self.n_kv_heads, self.dim)
        return value

    def _convert_from_hf(self, abstract_key: str, value: torch.Tensor) -> torch.Tensor:
        if abstract_key == "model.layers.{}.self_attn.q_proj.weight":
            return self._reverse_permute(value, self.n_heads)
        if abstract_key == "model.layers.{}.self_attn.k_proj.weight":
            return self._reverse_permute(value, self.n_kv_heads, self.head_dim * self.n_kv_heads, self.dim)
        return value


def stock_key_map(args: GRTModelArgs) -> LlamaKeyMap | Qwen3KeyMap:
    """The key map of a llama or qwen3 `args` (llama's heads and widths from its block args)."""
    if args.block_style == "llama":
        block = llama_block_args(args)
        return LlamaKeyMap(block.n_heads, block.n_kv_heads, block.dim)
    if args.block_style == "qwen3":
        return Qwen3KeyMap()
    raise ValueError(f"no stock key map for block_style {args.block_style!r} (llama or qwen3)")
