"""Hugging Face safetensors in one process: every tensor of a folder (`read_hf_weights`:
model.safetensors or the shards of its index), and the checks that HF-named weights fit the
args (`check_hf_keys`, `check_native_shapes`). What builds a model of them is
grt_titan/checkpoints/load.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.model import build_meta_model
from grt_titan.model.state_dict_adapter import GRTStateDictAdapter
from grt_titan.run_reader import CheckpointError

from .folders import INDEX_FILE, SINGLE_FILE

# An export's learned-halting probe (`grt-titan export-hf --halting-probe`): fitted after
# training, not part of the training model, so an import leaves it out.
HALTING_PROBE_PREFIX = "model.halting_probe."


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
