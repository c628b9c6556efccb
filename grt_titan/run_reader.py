"""The host-neutral reader of a run's config: what export-hf, import-hf, analyze, eval-task,
table and the teacher read of a training TOML or a run record, on torchtitan 0.2.2 and 0.3.

    args, view = load_model_args("train_configs/grt_debug.toml", ["--grt.num_recurrences", "3"])
    view.training.seq_len, view.model.hf_assets_path, view.validation.dataset, view.data

Why not the host's own parser: torchtitan 0.2.2's ConfigManager (the merged JobConfig of
grt_titan/job_config.py) does not exist on torchtitan 0.3, and 0.3 reads a run as a Python
`Trainer.Config` built from the same TOML (grt_titan/torchtitan_0_3/recipe.py). A trained model
is described by the flavor, the `[grt]` overrides and `[training] seq_len` (or, in a run
record, by the resolved `model_args`); the tools also read a few settings (tokenizer, dump
folder, TensorBoard folder, batch size, validation data, `[data]`). This module reads exactly
those with tomllib and grt_titan's own section dataclasses (grt_titan/sections.py), so every
tool reads a run the same way on either host.

- A training TOML (the recipe, torchtitan 0.2.2's format, which both hosts train from): the
  flavor's args (grt_titan.model.flavors, or a flavor file) with `[grt]` and `[training]
  seq_len` applied by `GRTModelArgs.update_from_config`, validated. A key the tools read but
  the TOML leaves out takes torchtitan 0.2.2's default (`TORCHTITAN_DEFAULTS`; grt_titan's own
  for `[model] hf_assets_path`). A section no host knows, or a key that grt_titan's sections
  do not have, is refused by name; the keys of torchtitan's sections are the training host's
  to check.
- A run record (`<dump_folder>/grt_run.json`, or the dump folder): the record's `model_args`
  (what the run built), and the settings from its `job_config` (either host's layout).
- `overrides`: the training command line's `--section.key value` (OverridesParser), applied
  on top, as the run took them; on a record only `[grt]` and `[training] seq_len` change the
  model (its flavor is the record's).

Keys that only shape training over its steps (the depth curriculum, and the job's forwards per
optimizer step) are dropped unless `training_schedule`: a trained model reads the same whatever
schedule trained it. The start-up checks of a job (grt_titan.config_checks, installed on
GRTModelArgs by the 0.2.2 spec) never run here: a reader reads a trained model, not a job.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import typing
from pathlib import Path
from types import NoneType, SimpleNamespace, UnionType
from typing import Any, Literal

import tomllib

from grt_titan.data.config import DataConfig
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.flavors import flavor_from_file, grt_flavors
from grt_titan.run_record import RECORD_NAME, model_args_from_record, read_record_file
from grt_titan.sections import (
    DistillConfig,
    GRTCheckpointConfig,
    GRTMetricsConfig,
    GRTModelDefaults,
    GRTOptimizerConfig,
    GRTSection,
    GRTTrainingConfig,
    LossSpikeConfig,
)


class CheckpointError(ValueError):
    """A user error in reading a model: bad checkpoint, config or path, named in the message."""


MODEL_NAME = "grt"
# `[grt]` keys that shape training over its steps, not the trained model: dropped where a
# trained model is read (`load_model_args`), with the job's forwards per optimizer step.
TRAINING_SCHEDULE_KEYS = ("depth_curriculum_steps", "depth_curriculum_shape")
# grt_titan's own sections, read as their dataclasses: a key they lack is refused by name.
OWN_SECTIONS: dict[str, type] = {
    "grt": GRTSection,
    "data": DataConfig,
    "grt_metrics": GRTMetricsConfig,
    "loss_spike": LossSpikeConfig,
    "distill": DistillConfig,
}
# The fields grt_titan adds to torchtitan's sections (with their defaults).
ADDED_FIELDS: dict[str, type] = {
    "model": GRTModelDefaults,
    "optimizer": GRTOptimizerConfig,
    "training": GRTTrainingConfig,
    "checkpoint": GRTCheckpointConfig,
}
# torchtitan's sections in the recipe format (0.2.2's JobConfig), and its defaults of the keys
# the tools read (torchtitan 0.2.2's, which the TOMLs were written against).
TORCHTITAN_SECTIONS = (
    "job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training", "parallelism",
    "checkpoint", "activation_checkpoint", "compile", "quantize", "float8", "comm",
    "memory_estimation", "fault_tolerance", "experimental", "validation", "debug",
)  # fmt: skip
TORCHTITAN_DEFAULTS: dict[str, dict[str, Any]] = {
    "job": {"dump_folder": "./outputs", "description": "default job", "config_file": None},
    "model": {"name": "llama3", "flavor": "debugmodel", "tokenizer_path": None},
    "training": {"seq_len": 2048, "local_batch_size": 8, "global_batch_size": -1, "steps": 10000,
                 "dataset": "c4_test", "dataset_path": None},
    "validation": {"enable": False, "dataset": "c4_validation", "dataset_path": None, "seq_len": 2048},
    "metrics": {"log_freq": 10, "enable_tensorboard": False, "save_tb_folder": "tb"},
    "checkpoint": {"enable": False, "folder": "checkpoint"},
    "fault_tolerance": {"enable": False, "group_size": 0},
    "debug": {"seed": None},
}  # fmt: skip


class RunView(SimpleNamespace):
    """A run's settings by TOML section (`view.training.seq_len`, `view.grt`, `view.data`):
    what the tools read of it, on either host."""

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: _section_dict(section) for name, section in vars(self).items()}


def _section_dict(section: Any) -> dict[str, Any]:
    return dataclasses.asdict(section) if dataclasses.is_dataclass(section) else dict(vars(section))


# ---- the command line's overrides --------------------------------------------------------

_OVERRIDE = re.compile(r"--[A-Za-z_][\w-]*\.[\w.-]+(=.*)?")
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)(e-?\d+)?")


class OverridesParser(argparse.ArgumentParser):
    """The parser of a command that reads a training config (export-hf, import-hf, analyze):
    after its own arguments it takes the training command line's overrides (`--section.key
    value`, `--section.key=value`, a flag alone such as `--checkpoint.no-enable`), as the run
    took them, into `namespace.overrides` (read by `load_model_args`). Any other argument it
    does not know is refused, as argparse refuses it."""

    def parse_args(self, args=None, namespace=None):
        namespace, rest = self.parse_known_args(args, namespace)
        overrides: list[str] = []
        for i, arg in enumerate(rest):
            is_value = overrides and "=" not in overrides[-1] and (not arg.startswith("-") or _NUMBER.fullmatch(arg))
            if _OVERRIDE.fullmatch(arg) or is_value:
                overrides.append(arg)
            else:
                self.error(f"unrecognized arguments: {' '.join(rest[i:])}")
        namespace.overrides = overrides
        return namespace


def check_overrides_have_config(config_file, overrides) -> None:
    """A command's training-config overrides (OverridesParser) mean nothing without --config."""
    if overrides and config_file is None:
        raise CheckpointError(f"{' '.join(overrides)}: overrides of a training config need --config")


def split_overrides(overrides: list[str] | tuple[str, ...]) -> list[tuple[str, str, list[str]]]:
    """(section, key, values) of each `--section.key [values...]` (`--a.b=v` too); a flag
    alone has no values. Hyphens in names read as underscores, as torchtitan's parser reads them."""
    found: list[tuple[str, str, list[str]]] = []
    for arg in overrides:
        if _OVERRIDE.fullmatch(arg):
            name, eq, value = arg[2:].partition("=")
            section, _, key = name.replace("-", "_").partition(".")
            found.append((section, key, [value] if eq else []))
        elif found:
            found[-1][2].append(arg)
        else:
            raise CheckpointError(f"{arg}: not a training-config override; allowed: --section.key value")
    return found


def _field_type(section: str, key: str) -> Any:
    """The declared type of `[section] key` (grt_titan's dataclasses, else the type of
    torchtitan's default), or None when unknown."""
    for cls in (OWN_SECTIONS.get(section), ADDED_FIELDS.get(section)):
        if cls is not None and key in {f.name for f in dataclasses.fields(cls)}:
            return typing.get_type_hints(cls)[key]
    default = TORCHTITAN_DEFAULTS.get(section, {}).get(key)
    return type(default) if default is not None else None


def _convert(values: list[str], kind: Any, name: str) -> Any:
    """`values` of the override `name` as its declared type `kind` (None: a TOML literal, else
    the text); ValueError naming the override and what is allowed."""
    args = [a for a in typing.get_args(kind) if a is not NoneType]
    if typing.get_origin(kind) in (typing.Union, UnionType):
        if values == ["None"]:
            return None
        return _convert(values, args[0] if len(args) == 1 else None, name)
    if typing.get_origin(kind) is list:
        return [_convert([v], args[0] if args else None, name) for v in values]
    if len(values) != 1:
        raise ValueError(f"{name} takes one value, got {values}")
    value = values[0]
    if typing.get_origin(kind) is Literal:
        if value not in typing.get_args(kind):
            raise ValueError(f"{name} {value!r}: allowed: {list(typing.get_args(kind))}")
        return value
    if kind is bool:
        if value.lower() not in ("true", "false"):
            raise ValueError(f"{name} {value!r}: allowed: true, false")
        return value.lower() == "true"
    if kind in (int, float, str):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{name} {value!r}: expected {kind.__name__}") from None
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def apply_overrides(sections: dict[str, dict[str, Any]], overrides, source: str) -> dict[str, dict[str, Any]]:
    """A copy of the TOML-shaped `sections` with the command line's `overrides` set."""
    result = {name: dict(values) for name, values in sections.items()}
    for section, key, values in split_overrides(overrides):
        if not values and key.startswith("no_") and _field_type(section, key) is not bool:
            key, values = key[3:], ["false"]
        kind = _field_type(section, key)
        name = f"--{section}.{key}"
        try:
            value = _convert(values or ["true"], kind, name)
        except ValueError as e:
            raise CheckpointError(f"{source}: {e}") from e
        result.setdefault(section, {})[key] = value
    return result


# ---- the sections of a run -------------------------------------------------------------


def _own_section(cls: type, values: dict[str, Any], section: str, source: str, strict: bool) -> Any:
    """grt_titan's section `cls` holding `values`: a key it lacks is refused by name (`strict`,
    a TOML) or left out (a record of another grt_titan version)."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in known]
    if unknown and strict:
        close = difflib.get_close_matches(unknown[0], known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise CheckpointError(f"{source}: [{section}] {unknown[0]} is not a key of [{section}]; {hint}allowed: {known}")
    return cls(**{k: v for k, v in values.items() if k in known})


def build_view(sections: dict[str, Any], source: str, strict: bool = True) -> RunView:
    """The RunView of TOML-shaped `sections`: grt_titan's sections as their dataclasses,
    torchtitan's as namespaces over the defaults the tools read. `strict` (a TOML): a section
    no host knows, or a value that is not a table, is refused by name."""
    for name, values in sections.items():
        if strict and (name not in TORCHTITAN_SECTIONS and name not in OWN_SECTIONS or not isinstance(values, dict)):
            allowed = sorted({*TORCHTITAN_SECTIONS, *OWN_SECTIONS})
            raise CheckpointError(f"{source}: [{name}] is not a section of a training config; allowed: {allowed}")
    view = RunView()
    for name, cls in OWN_SECTIONS.items():
        setattr(view, name, _own_section(cls, sections.get(name) or {}, name, source, strict))
    names = [*TORCHTITAN_DEFAULTS, *ADDED_FIELDS, *(n for n in sections if n not in OWN_SECTIONS)]
    for name in dict.fromkeys(names):
        added = dataclasses.asdict(ADDED_FIELDS[name]()) if name in ADDED_FIELDS else {}
        given = sections.get(name)
        given = given if isinstance(given, dict) else {}
        setattr(view, name, SimpleNamespace(**{**TORCHTITAN_DEFAULTS.get(name, {}), **added, **given}))
    return view


def read_recipe(path: str) -> dict[str, Any]:
    """The TOML's sections, with `[job] config_file` = `path` as the training host sets it."""
    try:
        with open(path, "rb") as f:
            sections = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read as a training TOML: {e}") from e
    sections.setdefault("job", {})
    if isinstance(sections["job"], dict):
        sections["job"]["config_file"] = path
    return sections


def record_sections(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The TOML-shaped sections of a run record's `job_config`: torchtitan 0.2.2's JobConfig
    is in that shape; torchtitan 0.3's `Trainer.Config.to_dict()` is mapped back (the places
    of grt_titan/torchtitan_0_3/recipe.py); a record without one gives its own keys."""
    config = record.get("job_config") or {}
    if "job" in config:  # torchtitan 0.2.2
        return config
    sections = {k: v for k, v in config.items() if k in ("training", "metrics", "checkpoint", "debug", *OWN_SECTIONS)}
    validator, dataloader = config.get("validator") or {}, config.get("dataloader") or {}
    loader = validator.get("dataloader") or {}
    if dataloader:
        where = {"dataset": dataloader.get("dataset"), "dataset_path": dataloader.get("dataset_path")}
        sections["training"] = {**sections.get("training", {}), **where}
    sections["job"] = {
        "dump_folder": config.get("dump_folder", str(folder)),
        "description": record.get("description"),
        "config_file": record.get("config_file"),
    }
    sections["model"] = {"name": MODEL_NAME, "flavor": record.get("flavor")}
    if config.get("hf_assets_path") is not None:
        sections["model"]["hf_assets_path"] = config["hf_assets_path"]
    sections.setdefault("training", {"seq_len": record["seq_len"], "steps": record.get("training_steps")})
    sections.setdefault("metrics", {"save_tb_folder": record.get("tb_folder", "tb")})
    sections.setdefault("debug", {"seed": record.get("seed")})
    if validator:  # 0.3 validates at the training sequence length
        sections["validation"] = {
            "enable": validator.get("enable"),
            "dataset": loader.get("dataset"),
            "dataset_path": loader.get("dataset_path"),
            "seq_len": sections["training"].get("seq_len", record["seq_len"]),
        }
    return sections


# ---- the model args ---------------------------------------------------------------------


def apply_grt(args: GRTModelArgs, grt: GRTSection, seq_len: int, flavor: str, source: str) -> GRTModelArgs:
    """`args` with the `[grt]` overrides `grt` and `[training] seq_len` applied and validated
    by GRTModelArgs' own `update_from_config` (the hosts' route, without what a host adds of
    a job about to start: its start-up checks judge its world size and folder, not a trained
    model)."""
    job = SimpleNamespace(grt=grt, training=SimpleNamespace(seq_len=seq_len), model=SimpleNamespace(flavor=flavor))
    try:
        args.update_from_config(job)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e
    return args


def flavor_args(flavor: str, source: str) -> GRTModelArgs:
    """A fresh copy of the flavor `flavor`, or of a flavor file's args (`grt-titan retrofit`)."""
    try:
        from_file = flavor_from_file(flavor)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e
    if from_file is not None:
        return from_file
    if flavor not in grt_flavors:
        raise CheckpointError(f"{source}: flavor {flavor!r} unknown; allowed: {sorted(grt_flavors)}")
    return dataclasses.replace(grt_flavors[flavor])


def _schedule_dropped(grt: GRTSection) -> GRTSection:
    return dataclasses.replace(grt, **dict.fromkeys(TRAINING_SCHEDULE_KEYS))


def _toml_args(view: RunView, source: str, training_schedule: bool) -> GRTModelArgs:
    if view.model.name != MODEL_NAME:
        raise CheckpointError(f"{source}: [model] name = {view.model.name!r}, expected {MODEL_NAME!r}")
    grt = view.grt if training_schedule else _schedule_dropped(view.grt)
    return apply_grt(flavor_args(view.model.flavor, source), grt, view.training.seq_len, view.model.flavor, source)


def _record_args(record: dict[str, Any], overrides, source: str, training_schedule: bool) -> GRTModelArgs:
    """The record's `model_args`, with the `[grt]` / `[training] seq_len` of `overrides`."""
    try:
        args = model_args_from_record(record, source)
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    changed = {(section, key) for section, key, _ in split_overrides(overrides)}
    if ("model", "flavor") in changed:
        raise CheckpointError(
            f"{source}: --model.flavor: a run record's model is its model_args; allowed: a training TOML"
        )
    if not training_schedule:
        defaults = GRTModelArgs()
        for name in (*TRAINING_SCHEDULE_KEYS, "forwards_per_step"):
            setattr(args, name, getattr(defaults, name))
    if any(section == "grt" or (section, key) == ("training", "seq_len") for section, key in changed):
        given = apply_overrides({}, overrides, source)
        grt = _own_section(GRTSection, given.get("grt", {}), "grt", source, strict=True)
        grt = grt if training_schedule else _schedule_dropped(grt)
        seq_len = given.get("training", {}).get("seq_len", record["seq_len"])
        args = apply_grt(args, grt, seq_len, record.get("flavor"), source)
    return args


def record_file(config_file: Path) -> Path | None:
    """The run record that `config_file` names (a `.json` file, or a dump folder holding one),
    None for a TOML; CheckpointError for a path that is neither."""
    if config_file.is_dir():
        if not (config_file / RECORD_NAME).is_file():
            raise CheckpointError(
                f"{config_file} is a folder without {RECORD_NAME}; allowed: a training TOML, a run's "
                f"{RECORD_NAME} or its dump folder"
            )
        return config_file / RECORD_NAME
    if not config_file.is_file():
        raise CheckpointError(f"config file {config_file} does not exist")
    return config_file if config_file.suffix == ".json" else None


def load_model_args(
    config_file: str | Path, overrides: tuple[str, ...] | list[str] = (), *, training_schedule: bool = False
) -> tuple[GRTModelArgs, RunView]:
    """(GRTModelArgs, RunView) of a training TOML or a run record (or its dump folder), with
    the command line's `overrides` (module docstring). Keys that only shape training over its
    steps are dropped unless `training_schedule` (a dense model's TOML may keep a curriculum a
    command line turned off)."""
    source = str(config_file)  # as given: the record and the errors name it so
    record_path = record_file(Path(config_file))
    if record_path is not None:
        try:
            record = read_record_file(record_path)
        except ValueError as e:
            raise CheckpointError(str(e)) from e
        sections = apply_overrides(record_sections(record, record_path.parent), overrides, str(record_path))
        view = build_view(sections, str(record_path), strict=False)
        return _record_args(record, overrides, str(record_path), training_schedule), view
    view = build_view(apply_overrides(read_recipe(source), overrides, source), source)
    return _toml_args(view, source, training_schedule), view
