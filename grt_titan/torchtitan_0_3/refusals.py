"""What grt_titan's torchtitan 0.3 adapter does not run yet, refused in one line that names
the setting and the host: TOML keys (recipe.py) and command-line overrides (`refusals`)."""

from __future__ import annotations

from typing import Any

HOST = "torchtitan 0.3"
WHERE_TO_RUN = "run it on torchtitan 0.2.2 (docs/training.md, 'torchtitan 0.2.2 and 0.3')"


class HostRefusal(ValueError):
    """A setting that grt_titan's torchtitan 0.3 adapter does not run yet."""


def refusal(key: str, value: Any, source: str) -> HostRefusal:
    return HostRefusal(f"{source}: {key} = {value!r} is not supported on {HOST} yet; {WHERE_TO_RUN}")


def refusals(config) -> list[str]:
    """What a config asks of this host that it does not run yet (command-line overrides
    included), one line each."""
    parallelism = config.parallelism
    degrees = {
        "--parallelism.tensor_parallel_degree": parallelism.tensor_parallel_degree,
        "--parallelism.context_parallel_degree": parallelism.context_parallel_degree,
        "--parallelism.pipeline_parallel_degree": parallelism.pipeline_parallel_degree,
    }
    found = [
        f"{key} {value!r} is not supported on {HOST} yet; {WHERE_TO_RUN}"
        for key, value in degrees.items()
        if value != 1
    ]
    if config.grt_metrics.validation_depths and config.validator.enable:
        found.append(
            f"--grt_metrics.validation_depths (with validation) is not supported on {HOST} yet; {WHERE_TO_RUN}"
        )
    return found
