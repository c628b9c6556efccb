"""What a training start or a resume would load, checked before the run builds anything.

- `resume_problems`: a resume whose checkpoint holds only the model weights (reported at
  start-up by grt_titan.config_checks).
- `initial_load_source` / `initial_load_applies` / `initial_load_problems` / `initial_load_line`:
  what a start loads (`[checkpoint] initial_load_path`, or with `initial_load_in_hf` and no
  path the safetensors of `[model] hf_assets_path`, as torchtitan), when it loads them
  (GRTCheckpointManager: with checkpointing off too), a path
  there that is not a checkpoint (reported at start-up), and the start-up line naming what was
  loaded (a `grt-titan retrofit`'s source and layers, from its `retrofit.json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch.distributed.checkpoint import FileSystemReader

from .folders import INDEX_FILE, METADATA_FILE, RESUME_STATES, checkpoint_steps, latest_complete_step, step_folder

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
