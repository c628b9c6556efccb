"""`parse_job_config`: torchtitan 0.2.2's whole JobConfig of a training TOML or a run record
(imported when called), with the training command line's overrides, for what needs 0.2.2's
own sections. The GRTModelArgs and settings of a run, as export-hf, import-hf and analyze take
them on either host, are grt_titan/run_reader.py's (`load_model_args`).
"""

from __future__ import annotations

from pathlib import Path

from grt_titan.run_reader import CheckpointError
from grt_titan.run_record import read_record_file


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
