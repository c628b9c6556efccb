"""The preset names that `--module grt_titan --config NAME` takes, and their TOMLs.

Importing it loads neither torchtitan nor torch: the docs' checks name presets on either host.
"""

from __future__ import annotations

import os
from pathlib import Path

# The presets ship beside the package in a source checkout; GRT_TRAIN_CONFIGS names another folder.
TRAIN_CONFIGS = Path(__file__).resolve().parents[2] / "train_configs"
PAPER_PREFIX = "paper_"


def train_configs() -> Path:
    return Path(os.environ.get("GRT_TRAIN_CONFIGS", TRAIN_CONFIGS))


def presets() -> dict[str, Path]:
    """Every preset name and its TOML."""
    root = train_configs()
    found = {path.stem: path for path in sorted(root.glob("*.toml"))}
    found.update({PAPER_PREFIX + path.stem: path for path in sorted((root / "paper").glob("*.toml"))})
    return found


def unknown_preset(name: str) -> str:
    """The one line for a `--config` that names no preset."""
    known = presets()
    if not known:
        return (
            f"--config {name!r}: no presets in {train_configs()} (the train_configs/ of a source checkout; "
            "GRT_TRAIN_CONFIGS names another folder)"
        )
    return f"--config {name!r} is not a grt_titan preset; allowed: {', '.join(known)}"
