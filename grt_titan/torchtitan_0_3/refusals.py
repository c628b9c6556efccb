"""What grt_titan's torchtitan 0.3 adapter does not run yet, refused in one line that names
the setting and the host: TOML keys (recipe.py) and command-line overrides (`refusals`)."""

from __future__ import annotations

from typing import Any

from grt_titan.sections import UNSUPPORTED_DEGREES, unsupported_degree

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
    found = [
        unsupported_degree(key, getattr(parallelism, key))
        for key in UNSUPPORTED_DEGREES
        if getattr(parallelism, key, 1) != 1
    ]
    if parallelism.tensor_parallel_degree > 1 and not parallelism.enable_sequence_parallel:
        found.append(
            "--parallelism.no-enable_sequence_parallel with tensor parallelism is not supported by grt_titan: "
            "the GRT's TP plan shards the sequence between blocks on both hosts (docs/parallelism.md)"
        )
    return found
