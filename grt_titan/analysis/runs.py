"""A finished training run as `grt-titan table` sees it: what it trained and its last
validation loss.

What it trained comes from the run record (`grt_run.json`, grt_titan/run_record.py), or
for runs made before records existed from the training TOML (`--config`), parsed as
`grt-titan analyze --config` does (grt_titan.run_reader.load_model_args). The loss is
the last `validation_metrics/loss` in the run's TensorBoard events (every event file
under the TensorBoard folder: a resumed run starts a new `tb/<timestamp>/`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grt_titan.model.args import GRTModelArgs
from grt_titan.run_reader import load_model_args
from grt_titan.run_record import RECORD_NAME, build_run_record, model_args_from_record, read_run_record

LOSS_TAG = "validation_metrics/loss"


@dataclass
class Run:
    path: Path
    label: str  # the method (table 1's first column)
    args: GRTModelArgs  # after the [grt] overrides
    seq_len: int  # training sequence length (the FLOPs' S)
    seed: int | None
    record: dict[str, Any]  # the run record (for a --config run: the same keys, rebuilt)
    loss: float | None = None  # last validation loss, None when the run has none
    loss_step: int | None = None
    missing: str = ""  # why there is no loss

    @property
    def name(self) -> str:
        return self.path.resolve().name


def scalar_events(tb_root: Path, *tags: str) -> dict[str, dict[Path, list[tuple[int, float, float]]]]:
    """Per tag, (step, wall time, value) of its every event per event folder under `tb_root`
    (in path order); folders without the tag are left out. Each file is read once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, dict[Path, list[tuple[int, float, float]]]] = {tag: {} for tag in tags}
    for folder in sorted({p.parent for p in tb_root.rglob("events.out.tfevents.*")}):
        # Every scalar (0 = no sampling), one of anything else (images of the validator).
        acc = EventAccumulator(
            str(folder), size_guidance={"scalars": 0, "images": 1, "tensors": 1, "histograms": 1, "audio": 1}
        )
        acc.Reload()
        for tag in set(tags) & set(acc.Tags()["scalars"]):
            found[tag][folder] = [(event.step, event.wall_time, event.value) for event in acc.Scalars(tag)]
    return found


def last_scalar(tb_root: Path, tag: str) -> tuple[int, float] | None:
    """(step, value) of `tag` at the largest step over every event file under `tb_root`
    (ties: the latest written); None if no event file holds it."""
    events = [event for folder in scalar_events(tb_root, tag)[tag].values() for event in folder]
    if not events:
        return None
    step, _, value = max(events, key=lambda event: event[:2])
    return step, value


def find_run_dirs(paths: list[str | Path], allow_bare: bool = False) -> list[Path]:
    """The run folders of `paths`, as TensorBoard's logdir finds event files: a path holding
    grt_run.json is a run; any other folder stands for every folder below it that holds one
    (in path order, so `grt-titan table outputs/` reads a whole tree of runs). Each run once,
    at its first mention.

    `allow_bare` (`--config` given): a folder with no record in or below it is a run made
    before records existed, itself. Otherwise such a folder is an error naming it.

    Raises:
        FileNotFoundError: a path that is not a folder, or a folder with no record in or below it.
    """
    found: list[Path] = []
    for given in map(Path, paths):
        if (given / RECORD_NAME).is_file():
            below = [given]
        elif not given.is_dir():
            raise FileNotFoundError(f"{given} is not a folder (expected a run's job.dump_folder, or a folder of runs)")
        else:
            below = sorted(record.parent for record in given.rglob(RECORD_NAME) if record.is_file())
        if not below and allow_bare:
            below = [given]
        elif not below:
            raise FileNotFoundError(
                f"{given} has no {RECORD_NAME}, nor any folder below it (runs started before grt_titan wrote "
                "run records, or not a job.dump_folder nor a folder of them): retrain, or pass --config "
                "<its training TOML>"
            )
        seen = {run.resolve() for run in found}
        found += [run for run in below if run.resolve() not in seen]
    return found


def load_run(run_dir: str | Path, config_file: str | Path | None = None) -> Run:
    """The run in `run_dir`: its record, or with `config_file` (runs without one) the TOML.

    Raises:
        FileNotFoundError / ValueError: naming the folder or file, and what to do.
    """
    path = Path(run_dir)
    if config_file is not None and path.is_dir() and not (path / RECORD_NAME).exists():
        args, job_config = load_model_args(config_file, training_schedule=True)
        record = build_run_record(job_config, args)
        source = str(config_file)
    else:
        record = read_run_record(path)
        source = str(path / RECORD_NAME)
    args = model_args_from_record(record, source)
    run = Run(
        path=path,
        label=record["label"],
        args=args,
        seq_len=int(record["seq_len"]),
        seed=record.get("seed"),
        record=record,
    )
    tb = path / record.get("tb_folder", "tb")
    found = last_scalar(tb, LOSS_TAG) if tb.is_dir() else None
    if found is None:
        run.missing = f"no TensorBoard folder {tb}" if not tb.is_dir() else f"no {LOSS_TAG!r} in the events under {tb}"
        run.missing += " (train with [metrics] enable_tensorboard = true and [validation] enable = true)"
    elif not math.isfinite(found[1]):
        run.missing = f"the last {LOSS_TAG!r} (step {found[0]}) is {found[1]}"
    else:
        run.loss_step, run.loss = found
    return run
