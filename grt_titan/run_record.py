"""The run record: `<dump_folder>/grt_run.json`, what a training run was (`grt-titan table`).

torchtitan's dump folder holds TensorBoard events and checkpoints but not the resolved
config, so rank 0 writes this record at start-up (from the spec's metrics-processor
builder, the first hook that sees the model args after the `[grt]` overrides). It is
rewritten at every start (a resumed run records its latest start), atomically: a reader
never sees half a file.

| key | value |
|---|---|
| `format`, `version` | `grt_run`, 1 |
| `config_file`, `description`, `flavor`, `label` | `--job.config_file`, `job.description`, `model.flavor`, the method (`method_name` of the args, else GRT / dense) |
| `model_args` | `dataclasses.asdict` of the model args after `[grt]` overrides |
| `seed`, `seq_len`, `global_batch_size`, `training_steps`, `world_size` | `debug.seed`, `training.*`, the job's ranks |
| `tb_folder` | TensorBoard folder under the dump folder (`metrics.save_tb_folder`) |
| `versions` | torch, torchtitan |
| `job_config` | the whole resolved JobConfig (`JobConfig.to_dict()`) |
"""

from __future__ import annotations

import dataclasses
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from grt_titan.model.args import GRTModelArgs
from grt_titan.runtime.atomic_dir import atomic_write_text

RECORD_NAME = "grt_run.json"
RECORD_FORMAT = "grt_run"
RECORD_VERSION = 1


def method_label(model_args: GRTModelArgs) -> str:
    """The method a run trains: the args' `method_name` where it exists, else GRT / dense."""
    return getattr(model_args, "method_name", "GRT" if model_args.is_recurrent else "dense")


def build_run_record(
    job_config, model_args: GRTModelArgs, world_size: int | None = None, batch_degree: int | None = None
) -> dict[str, Any]:
    """The record of a job (`batch_degree`: data-parallel ranks, dp_replicate x dp_shard).

    Without the job's sizes (a record rebuilt from a TOML after the run, `grt-titan table
    --config`) `world_size` and a defaulted global batch are None.
    """
    import torch

    training = job_config.training
    global_batch = training.global_batch_size
    if global_batch < 0:  # torchtitan's default: one microbatch per data-parallel rank
        global_batch = training.local_batch_size * batch_degree if batch_degree is not None else None
    to_dict = getattr(job_config, "to_dict", None)
    return {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "config_file": job_config.job.config_file,
        "description": job_config.job.description,
        "flavor": job_config.model.flavor,
        "label": method_label(model_args),
        "model_args": dataclasses.asdict(model_args),
        "seed": job_config.debug.seed,
        "seq_len": training.seq_len,
        "global_batch_size": global_batch,
        "training_steps": training.steps,
        "world_size": world_size,
        "tb_folder": job_config.metrics.save_tb_folder,
        "versions": {"torch": torch.__version__, "torchtitan": metadata.version("torchtitan")},
        "job_config": to_dict() if to_dict is not None else None,
    }


def write_run_record(folder: str | Path, record: dict[str, Any]) -> Path:
    """Write `folder/grt_run.json` through a temporary file and a rename (all or nothing)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(folder / RECORD_NAME, json.dumps(record, indent=1, default=str) + "\n")


def read_run_record(run_dir: str | Path) -> dict[str, Any]:
    """The record of `run_dir`; FileNotFoundError / ValueError name the folder and the fix."""
    path = Path(run_dir) / RECORD_NAME
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder (expected a run's job.dump_folder)")
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no {RECORD_NAME} (runs started before grt_titan wrote run records, or not a "
            "job.dump_folder): retrain, or pass --config <its training TOML>"
        )
    return read_record_file(path)


def read_record_file(path: str | Path, keys: tuple[str, ...] = ("label", "model_args", "seq_len")) -> dict[str, Any]:
    """The record in the file `path`, holding `keys`; ValueError naming the file otherwise."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{path}: not a grt_titan run record (format {RECORD_FORMAT!r} expected)")
    for key in keys:
        if key not in record:
            raise ValueError(f"{path}: the record has no {key!r}")
    return record


def model_args_from_record(record: dict[str, Any], source: str | Path) -> GRTModelArgs:
    """`GRTModelArgs(**record["model_args"])`, validated.

    A key these args do not have (a record of a newer grt_titan) is a ValueError naming
    `source` and the key; a missing key (an older record) takes the field's default, with
    a note on stderr.
    """
    saved = record["model_args"]
    fields = {f.name: f for f in dataclasses.fields(GRTModelArgs) if f.init}
    unknown = sorted(set(saved) - set(fields))
    if unknown:
        raise ValueError(
            f"{source}: model_args key {unknown[0]!r} is not a field of GRTModelArgs (a record of a newer "
            f"grt_titan?); unknown keys: {unknown}"
        )
    for name in sorted(set(fields) - set(saved)):
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        print(f"{source}: model_args has no {name!r} (an older record); using the default {default!r}", file=sys.stderr)
    args = GRTModelArgs(**saved)
    args.validate(where=f"{source}: model_args")
    return args
