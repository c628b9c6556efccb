"""Load a trained GRT into one process for analysis: checkpoint + config, or an HF export.

Reading and checking weights is grt_titan.checkpoints' job (`load_checkpoint` reads
DCP step folders, full or model-only, and `last_save_in_hf` safetensors;
`native_state_from_hf` reads exported folders, grt_titan.hf.config_map their config.json);
this module only picks the route.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grt_titan.checkpoints.folders import latest_step_folder
from grt_titan.checkpoints.hf_weights import read_hf_weights
from grt_titan.checkpoints.load import load_checkpoint, model_from_state, native_state_from_hf
from grt_titan.hf.config_map import model_args_from_hf_config
from grt_titan.model import GRTModel
from grt_titan.model.args import GRTModelArgs
from grt_titan.run_reader import RunView, check_overrides_have_config, load_model_args
from grt_titan.tokenizer import build_tokenizer, export_tokenizer


@dataclass
class LoadedModel:
    model: GRTModel  # eval mode, float32
    args: GRTModelArgs
    tokenizer: Any
    job_config: RunView | None  # the --config's settings by section (grt_titan.run_reader), if given
    source: dict[str, Any]  # what was loaded: kind, path, step


def is_hf_export(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") == "grt"
    except (OSError, ValueError):
        return False


def load_model(
    path: str | Path,
    config_file: str | Path | None = None,
    device: str = "cpu",
    overrides: tuple[str, ...] | list[str] = (),
) -> LoadedModel:
    """The model at `path` (HF export folder, or checkpoint step folder with `config_file`: a
    training TOML with the run's command-line `overrides`, or its run record).

    Raises:
        ValueError / FileNotFoundError: with the path and what was expected.
    """
    check_overrides_have_config(config_file, overrides)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (expected a checkpoint step folder or an HF export)")
    job_config = None
    cfg_args = None
    if config_file is not None:
        cfg_args, job_config = load_model_args(config_file, overrides)

    if is_hf_export(path):
        args = model_args_from_hf_config(json.loads((path / "config.json").read_text()))
        if cfg_args is not None:  # run-time settings of the config (eval depth, ...)
            args = dataclasses.replace(args, eval_recurrences=cfg_args.eval_recurrences)
        state = native_state_from_hf(read_hf_weights(path), args)
        source = {"kind": "hf_export", "path": str(path), "step": None}
        # The export's own tokenizer files (GPT-2's ranks for the GPT-2 files export-hf derives
        # from them), unless --config names the run's tokenizer.
        tokenizer = build_tokenizer(job_config) if job_config is not None else export_tokenizer(path)
    else:
        if cfg_args is None:
            raise ValueError(
                f"{path} is not a Hugging Face export (no config.json of model_type 'grt'); "
                "a torchtitan checkpoint needs --config <the training TOML>"
            )
        path = latest_step_folder(path)
        args = cfg_args
        state, facts = load_checkpoint(path, args)
        source = {
            "kind": "checkpoint",
            "path": str(path),
            "step": facts.get("step"),
            "config": str(config_file),
            "flavor": job_config.model.flavor,
        }
        tokenizer = build_tokenizer(job_config)

    try:
        model = model_from_state(state, args)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    model.to(device).eval()
    return LoadedModel(model, args, tokenizer, job_config, source)
