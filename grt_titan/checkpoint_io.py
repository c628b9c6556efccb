"""Reading and writing a trained GRT in one process: checkpoint folders, HF weights, and what
a start or a resume would load.

Why here, outside model/: model/ is the single-device model package (args, modules, the
recurrence, the HF key map), as torchtitan's `models/<name>/model/`, and imports nothing
from torch.distributed or torchtitan's config manager. Reading DCP folders is I/O: it sits
one layer above model/ and below components/, hf/ and analysis/ (docs/architecture.md,
"Layer order"), as torchtitan keeps its checkpoint code out of its model packages
(`components/checkpoint.py`, the conversion scripts). Every tool that reads a trained GRT
outside torchrun goes through here: `grt-titan export-hf` / `import-hf`, `grt-titan analyze` /
`table`, benchmarks and tests; so does the start-up check of a resume, and the checkpoint
manager takes its steps from here. It imports nothing that only torchtitan 0.2.2 has: it
serves either host.

- `checkpoint_steps` / `latest_complete_step`: THE definition of a checkpoint folder's
  latest complete step, torchtitan's (`CheckpointManager._find_load_step`): the largest N of
  a `step-N` holding DCP's `.metadata` (written last, by the commit) or the HF
  `model.safetensors.index.json` of a `last_save_in_hf` save; a half-written newer
  `step-N` never counts. A resume loads it (GRTCheckpointManager tries the older complete
  steps only when its checksums fail), `resume_problems` inspects it, and
  `latest_step_folder` picks it for export-hf and analyze.
- `resume_problems`: a resume whose checkpoint holds only the model weights (reported at
  start-up by grt_titan.config_checks).
- `initial_load_source` / `initial_load_applies` / `initial_load_problems` / `initial_load_line`:
  what a start loads (`[checkpoint] initial_load_path`, or with `initial_load_in_hf` and no
  path the safetensors of `[model] hf_assets_path`, as torchtitan), when it loads them
  (GRTCheckpointManager: with checkpointing off too), a path
  there that is not a checkpoint (reported at start-up), and the start-up line naming what was
  loaded (a `grt-titan retrofit`'s source and layers, from its `retrofit.json`).
- `load_model_args` / `OverridesParser` / `CheckpointError`: the GRTModelArgs and settings of a
  training TOML or a run record, with the training command line's overrides, as export-hf,
  import-hf and analyze take them: grt_titan/run_reader.py, the host-neutral reader, named
  here for their callers. `parse_job_config`: torchtitan 0.2.2's whole JobConfig (imported
  when called), for what needs 0.2.2's own sections.
- `load_checkpoint`: a torchtitan step folder. torchtitan 0.2.2 saves
  `<dump_folder>/<checkpoint.folder>/step-N/` with DCP; its model states are flattened to
  the top level in every save (`_flattened_model_states_sd`): the keys are the model FQNs,
  next to `optimizer.*`, `lr_scheduler.*`, `dataloader.*` and `train_state.{step,
  ntokens_seen}` in full saves. A folder whose model keys are nested under `model.` is read
  as well. With `[checkpoint] last_save_in_hf = true` the last step is instead written as
  HF-named safetensors (GRTStateDictAdapter); that is read too.
- `native_state_from_hf`: an exported Hugging Face folder's weights (its config.json:
  grt_titan/hf/config_map.py).
- `model_from_state`: a single-device GRTModel holding a native state dict.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.model import GRTModel, build_meta_model
from grt_titan.model.state_dict_adapter import GRTStateDictAdapter, optional_native_keys
from grt_titan.run_reader import (  # noqa: F401  the readers of a run's config, here for their callers
    CheckpointError,
    OverridesParser,
    check_overrides_have_config,
    load_model_args,
)
from grt_titan.run_record import read_record_file

METADATA_FILE = ".metadata"  # DCP's commit: written last, so a folder with it is complete
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# torchtitan's checkpoint entries besides the model's (CheckpointManager.states).
RESUME_STATES = ("train_state", "optimizer", "lr_scheduler", "dataloader")


# ---- the latest complete step ----------------------------------------------------------


def checkpoint_steps(folder: str | os.PathLike) -> list[int]:
    """The complete checkpoints of a checkpoint folder, as torchtitan's `_find_load_step`
    counts them: `step-N` with DCP's `.metadata` or an HF `model.safetensors.index.json`."""
    steps = []
    if not os.path.isdir(folder):
        return steps
    for name in os.listdir(folder):
        match = re.search(r"step-(\d+)", name)  # as _find_load_step
        path = os.path.join(folder, name)
        if match and (
            os.path.isfile(os.path.join(path, METADATA_FILE)) or os.path.isfile(os.path.join(path, INDEX_FILE))
        ):
            steps.append(int(match.group(1)))
    return steps


def latest_complete_step(folder: str | os.PathLike) -> int:
    """The step a resume loads (`[checkpoint] load_step = -1`): the largest complete one, -1
    for none (a half-written newer `step-N` is never loaded)."""
    return max(checkpoint_steps(folder), default=-1)


def step_folder(folder: str | os.PathLike, step: int) -> str:
    """`<folder>/step-N`, torchtitan's checkpoint id of a step."""
    return os.path.join(folder, f"step-{step}")


def latest_step_folder(path: Path) -> Path:
    """`path` itself (a step folder), or the latest complete step of a checkpoint folder."""
    step = latest_complete_step(path)
    return Path(step_folder(path, step)) if step != -1 else path


# ---- what a resume would load ------------------------------------------------------------


def resume_problems(job_config) -> list[str]:
    """A resume whose checkpoint holds only the model weights.

    torchtitan saves the last step model-only while `[checkpoint] last_save_model_only`
    (default true); extending a finished run (more `[training] steps`, same dump folder)
    would load that folder and fail inside DCP (`Missing key in checkpoint state_dict:
    dataloader.global_position`). The folder is the one torchtitan's `CheckpointManager.load`
    picks: `load_step`, or the latest complete step.
    """
    c = job_config.checkpoint
    if not c.enable:
        return []
    folder = os.path.join(job_config.job.dump_folder, c.folder)
    if not os.path.isdir(folder):
        return []  # a fresh run (initial_load_path, if any, is loaded as configured)
    step = c.load_step if c.load_step != -1 else latest_complete_step(folder)
    if step <= 0:
        return []  # nothing to resume, or step 0 (torchtitan loads it model-only)
    wanted = [k for k in RESUME_STATES if k not in c.exclude_from_loading]
    path = step_folder(folder, step)
    if not wanted or saved_states(path) != set():
        return []
    older = [s for s in sorted(checkpoint_steps(folder), reverse=True) if s < step]
    full = next((s for s in older if saved_states(step_folder(folder, s))), None)
    earlier = (
        "" if full is None else (f"resume from the newest full checkpoint with --checkpoint.load_step {full}, or ")
    )
    return [
        f"[checkpoint] last_save_model_only: {path} holds only the model weights (torchtitan "
        "saves the last step model-only while last_save_model_only = true), so the run cannot "
        f"resume from it (no {', '.join(RESUME_STATES)}); allowed: {earlier}start from these "
        "weights with a fresh optimizer and LR schedule in a new folder (--job.dump_folder "
        f"<new> --checkpoint.initial_load_path {path} --checkpoint.initial_load_model_only); "
        "set last_save_model_only = false in runs you may extend"
    ]


def saved_states(path: str) -> set[str] | None:
    """Which of RESUME_STATES the checkpoint `path` holds: set() for a model-only one (DCP
    or HF safetensors), None if it cannot be told (missing or unreadable: DCP reports it)."""
    if not os.path.isfile(os.path.join(path, METADATA_FILE)):
        return set() if os.path.isfile(os.path.join(path, INDEX_FILE)) else None
    try:
        keys = FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception:
        return None
    return {k.split(".", 1)[0] for k in keys} & set(RESUME_STATES)


# ---- what a fresh start loads: [checkpoint] initial_load_path ------------------------------

INITIAL_LOAD_KEY = "[checkpoint] initial_load_path"
# What `grt-titan retrofit OUT` writes beside the checkpoint OUT/model (grt_titan/hf/retrofit.py).
RETROFIT_RECORD = "retrofit.json"


HF_ASSETS_KEY = "[model] hf_assets_path"


def initial_load_source(checkpoint_config, hf_assets_path: str | None) -> tuple[str | None, str]:
    """What a fresh start loads, and the key that names it: `[checkpoint] initial_load_path`,
    or, with `initial_load_in_hf` and no such path, torchtitan's fallback: the safetensors of
    `[model] hf_assets_path` (CheckpointManager.load). (None, "") when neither applies."""
    if checkpoint_config.initial_load_path:
        return checkpoint_config.initial_load_path, INITIAL_LOAD_KEY
    if checkpoint_config.initial_load_in_hf:
        return hf_assets_path or "", HF_ASSETS_KEY
    return None, ""


def initial_load_applies(path: str | None, enable: bool, folder: str | None, load_step: int) -> bool:
    """Whether a start loads `path`, what `initial_load_source` names (GRTCheckpointManager.load).

    torchtitan loads it when checkpointing is on and the run's checkpoint `folder` does not
    exist, and otherwise ignores it: with checkpointing off, and with a folder that holds no
    complete step, the run then starts from random weights. grt_titan loads it in those two
    cases too. A folder with a complete step (or an explicit `load_step`) is a resume, which
    loads the run's own checkpoint and not this path, as torchtitan does.
    """
    if path is None:
        return False
    if not enable or folder is None or not os.path.exists(folder):
        return True
    return load_step == -1 and latest_complete_step(folder) == -1


def _hf_weight_files(path: str) -> list[str]:
    return [name for name in os.listdir(path) if name.endswith(".safetensors")]


def _initial_load_hint(path: str) -> str:
    """A likely meant folder inside `path` (a retrofit's model/, a run's newest step), or ''."""
    inner = os.path.join(path, "model")
    if os.path.isfile(os.path.join(inner, METADATA_FILE)):
        return f"; did you mean {inner!r}, the checkpoint of a `grt-titan retrofit` folder?"
    step = latest_complete_step(path)
    if step != -1:
        return f"; did you mean {step_folder(path, step)!r}, its newest complete step?"
    if _hf_weight_files(path):
        return "; it holds safetensors: set [checkpoint] initial_load_in_hf = true to read them"
    return ""


def initial_load_problems(job_config) -> list[str]:
    """`[checkpoint] initial_load_path`, when the start would load it (`initial_load_applies`),
    is not a checkpoint torchtitan can load: no such folder, no DCP `.metadata` (no
    safetensors with `initial_load_in_hf`), or, for a full load (`initial_load_model_only =
    false`), a model-only checkpoint; and the HF load's own rules (torchtitan's asserts)."""
    c = job_config.checkpoint
    folder = os.path.join(job_config.job.dump_folder, c.folder)
    path, key = initial_load_source(c, job_config.model.hf_assets_path)
    if not initial_load_applies(path, c.enable, folder, c.load_step):
        return []
    problems = []
    if c.initial_load_in_hf and not c.initial_load_model_only:
        problems.append(
            "[checkpoint] initial_load_in_hf = true loads the model weights only; allowed: "
            "initial_load_model_only = true with it, or initial_load_in_hf = false"
        )
    if c.initial_load_in_hf_quantized and not c.initial_load_in_hf:
        problems.append(
            "[checkpoint] initial_load_in_hf_quantized = true reads Hugging Face safetensors; "
            "allowed: initial_load_in_hf = true with it, or initial_load_in_hf_quantized = false"
        )
    if c.initial_load_in_hf:
        kind, missing = (
            "a Hugging Face folder holding *.safetensors ([checkpoint] initial_load_in_hf = true)",
            "*.safetensors",
        )
    else:
        kind = (
            f"a torchtitan DCP checkpoint folder (holding {METADATA_FILE}), such as a run's "
            "checkpoint/step-N or the model/ folder `grt-titan retrofit` writes"
        )
        missing = METADATA_FILE
    allowed = f"allowed: {kind}, or no initial_load_path (random weights)"
    if key == HF_ASSETS_KEY:  # no initial_load_path: torchtitan reads the safetensors of hf_assets_path
        key = f"[checkpoint] initial_load_in_hf = true with no initial_load_path reads {HF_ASSETS_KEY}"
        allowed = (
            f"allowed: {kind} as initial_load_path or hf_assets_path, or initial_load_in_hf = false (random weights)"
        )
    if not os.path.isdir(path):
        problems.append(f"{key} = {path!r}: no such folder; {allowed}")
    elif not (_hf_weight_files(path) if c.initial_load_in_hf else os.path.isfile(os.path.join(path, METADATA_FILE))):
        problems.append(f"{key} = {path!r}: not a checkpoint (no {missing} in it{_initial_load_hint(path)}); {allowed}")
    elif not c.initial_load_model_only and not c.initial_load_in_hf and saved_states(path) == set():
        problems.append(
            f"[checkpoint] initial_load_model_only = false: {key} = {path!r} holds only "
            f"the model weights (no {', '.join(RESUME_STATES)}); allowed: initial_load_model_only = true"
        )
    return problems


def _layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'; [] -> 'none'."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"


def initial_load_line(path: str, key: str = INITIAL_LOAD_KEY) -> str:
    """The start-up line naming what `[checkpoint] initial_load_path` (or the `key` that named
    the weights) loaded: the retrofit (from the `retrofit.json` beside it: source, model type,
    which source layers became prelude / core / coda / dropped, the init when recorded), or
    else the path."""
    record_file = Path(path).parent / RETROFIT_RECORD
    if not record_file.is_file():
        return f"Initial weights: loaded {path} ({key})"
    try:
        r = json.loads(record_file.read_text())
        layers = ", ".join(f"{part} {_layer_ranges(r[part])}" for part in ("prelude", "core", "coda", "dropped"))
        described = f"{r['source']}, {r['model_type']}, {r['source_layers']} source layers: {layers}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"Initial weights: loaded {path} ({INITIAL_LOAD_KEY}; its {record_file} is unreadable: {e!r})"
    init = f"; init {r['init']}" if "init" in r else ""  # retrofits before --init have none
    return f"Retrofit: loaded {path} ({described}{init})"


# ---- args ------------------------------------------------------------------------------


def parse_job_config(config_file: str | Path, overrides: tuple[str, ...] | list[str] = ()):
    """torchtitan 0.2.2's whole JobConfig of a training TOML, or of a 0.2.2 run record (the
    config the run started with), with `overrides` on top as the training command line takes
    them: for what needs 0.2.2's own sections. The tools read a run through
    `load_model_args` (grt_titan/run_reader.py, either host); this needs torchtitan 0.2.2."""
    from grt_titan.job_config import GRTConfigManager, RecordedConfigManager

    config_file = Path(config_file)
    if not config_file.is_file():
        raise CheckpointError(f"config file {config_file} does not exist")
    with_overrides = f" with {' '.join(overrides)}" if overrides else ""
    try:
        if config_file.suffix == ".json":
            values = read_record_file(config_file, ("job_config",))["job_config"]
            return RecordedConfigManager(values).parse_args(list(overrides))
        return GRTConfigManager().parse_args(["--job.config_file", str(config_file), *overrides])
    except (ValueError, TypeError, KeyError, SystemExit) as e:
        raise CheckpointError(f"{config_file}: cannot parse as a torchtitan config{with_overrides}: {e}") from e


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
