"""The `[grt]` settings, declared once: a `GRTModelArgs` field made with `setting` is one.

Its name, type and default are the field's; its help text (`--grt.<name>` on both hosts) and
its place in an export's config.json ride in the field's metadata. From that declaration come
`CONFIGURABLE_FIELDS` (the names `update_from_config` applies), the model keys of `GRTSection`
(grt_titan/sections.py) and the settings part of the HF config map (grt_titan/hf/config_map.py),
so a new setting is one field (docs/methods.md). A leaf: it imports nothing of grt_titan.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

# The metadata key of a field's `Setting`.
SETTING = "grt_setting"


@dataclass(frozen=True)
class Setting:
    """What the declaration says of a `[grt]` setting besides its field's name, type and default."""

    help: str  # `--grt.<name>`'s help, cleaned as a docstring is
    # Written to an exported config.json (and read back): True under the field's name, a str
    # under that name; for a recurrent model only, unless `hf_dense`.
    hf: bool | str = False
    hf_dense: bool = False
    # The setting `[grt]` lists this one after (--help, run records), where that differs from
    # the field's place in the args (whose order run records keep too).
    listed_after: str | None = None


def setting(default: Any, help: str, **declared: Any) -> Any:
    """A field of `GRTModelArgs` that `[grt]` may override: its default, its help text and
    the other `Setting` entries (`hf`, `hf_dense`, `listed_after`)."""
    return dataclasses.field(default=default, metadata={SETTING: Setting(inspect.cleandoc(help), **declared)})


def reading_order(cls: type) -> list[dataclasses.Field]:
    """The fields of the dataclass `cls`, its own first, then each base's in the order `cls`
    lists its bases (GRTModelArgs: the paper's settings, then each method's,
    grt_titan/model/methods/), where `dataclasses.fields` puts the bases' first."""
    bases = [base for base in cls.__bases__ if dataclasses.is_dataclass(base)]
    inherited = {f.name for base in bases for f in dataclasses.fields(base)}
    ordered = [f for f in dataclasses.fields(cls) if f.name not in inherited]
    for base in bases:
        ordered += [f for f in reading_order(base) if f not in ordered]
    return ordered


def declared_settings(cls: type) -> list[tuple[dataclasses.Field, Setting]]:
    """The settings of the dataclass `cls` with their declarations, in `[grt]`'s order: the
    fields' reading order, each `listed_after` one moved behind the setting it names."""
    found = [(f, f.metadata[SETTING]) for f in reading_order(cls) if SETTING in f.metadata]
    ordered = [entry for entry in found if entry[1].listed_after is None]
    for entry in found:
        if entry[1].listed_after is not None:
            names = [f.name for f, _ in ordered]
            ordered.insert(names.index(entry[1].listed_after) + 1, entry)
    return ordered


def hf_config_keys(cls: type) -> dict[str, tuple[str, bool]]:
    """{field: (its config.json key, written for a dense model too)} of the settings of `cls`
    that an export writes, in the fields' reading order."""
    return {
        f.name: (f.name if s.hf is True else s.hf, s.hf_dense)
        for f in reading_order(cls)
        if (s := f.metadata.get(SETTING)) is not None and s.hf
    }
