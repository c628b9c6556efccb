"""A trained GRT's weights into one process, and a checkpoint out of it.

- `load_checkpoint`: a torchtitan step folder. torchtitan 0.2.2 saves
  `<dump_folder>/<checkpoint.folder>/step-N/` with DCP; its model states are flattened to
  the top level in every save (`_flattened_model_states_sd`): the keys are the model FQNs,
  next to `optimizer.*`, `lr_scheduler.*`, `dataloader.*` and `train_state.{step,
  ntokens_seen}` in full saves. A folder whose model keys are nested under `model.` is read
  as well. With `[checkpoint] last_save_in_hf = true` the last step is instead written as
  HF-named safetensors (GRTStateDictAdapter); that is read too.
- `save_checkpoint`: a DCP checkpoint in torchtitan's layout, from one process.
- `native_state_from_hf`: an exported Hugging Face folder's weights (its config.json:
  grt_titan/hf/config_map.py).
- `model_from_state`: a single-device GRTModel holding a native state dict.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.model import GRTModel, build_meta_model
from grt_titan.model.state_dict_adapter import GRTStateDictAdapter, optional_native_keys
from grt_titan.run_reader import CheckpointError

from .folders import INDEX_FILE, METADATA_FILE, RESUME_STATES
from .hf_weights import HALTING_PROBE_PREFIX, check_hf_keys, check_native_shapes, read_hf_weights

_NON_MODEL_PREFIXES = tuple(f"{name}." for name in RESUME_STATES)


@contextlib.contextmanager
def single_process_dcp():
    """DCP without a process group warns that it assumes one process: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


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
    if (path / METADATA_FILE).is_file():
        return _load_dcp(path, args)
    if (path / INDEX_FILE).is_file() or list(path.glob("*.safetensors")):
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
    hf_state_dict = {k: v for k, v in hf_state_dict.items() if not k.startswith(HALTING_PROBE_PREFIX)}
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
