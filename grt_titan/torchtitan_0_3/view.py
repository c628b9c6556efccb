"""The 0.2.2-shaped view of a torchtitan 0.3 config: the sections (`job`, `model`, `training`,
`grt`, ...) that grt_titan's host-neutral code reads (`GRTModelArgs.update_from_config`, the
run record), as it reads them from 0.2.2's JobConfig."""

from __future__ import annotations

from types import SimpleNamespace

MODEL_NAME = "grt"


def job_view(config) -> SimpleNamespace:
    """The 0.2.2-shaped sections of a 0.3 config that grt_titan's host-neutral code reads."""
    training = config.training
    return SimpleNamespace(
        job=SimpleNamespace(
            dump_folder=config.dump_folder, description=config.description, config_file=config.config_file
        ),
        model=SimpleNamespace(
            name=MODEL_NAME, flavor=config.model_spec.flavor, hf_assets_path=config.hf_assets_path, converters=[]
        ),
        grt=config.grt,
        data=config.data,
        training=training,
        debug=config.debug,
        metrics=config.metrics,
        forwards_per_step=config.forwards_per_step,
        to_dict=config.to_dict,
    )
