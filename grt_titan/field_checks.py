"""The field checker: types, Literal choices and finiteness of a config dataclass's fields
(scalars and lists of scalars).

A leaf module (no grt_titan imports): `GRTModelArgs.validate` and the start-up checks of the
whole job config (grt_titan/config_checks.py) both use it, so each rule has one home.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, Union


def _literal_choices(annotation) -> tuple | None:
    """The allowed values of `Literal[...]` or `Literal[...] | None`, else None."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = typing.get_args(annotation)
        literals = [a for a in args if typing.get_origin(a) is Literal]
        if literals and all(a is type(None) or a in literals for a in args):
            choices = tuple(c for lit in literals for c in typing.get_args(lit))
            return choices + ((None,) if type(None) in args else ())
    return None


def _scalar_types(annotation) -> tuple[type, ...] | None:
    """(int,), (float,), (bool,), (str,) or with NoneType for `X | None`; None if not scalar."""
    scalars = (bool, int, float, str)
    if annotation in scalars:
        return (annotation,)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = typing.get_args(annotation)
        if all(a in scalars or a is type(None) for a in args):
            return tuple(args)
    return None


def _list_item_types(annotation) -> tuple[tuple[type, ...], bool] | None:
    """((item types), None allowed) for `list[X]` or `list[X] | None` with X scalar, else None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    lists = [a for a in args if typing.get_origin(a) is list]
    if len(lists) != 1 or any(a is not type(None) and a not in lists for a in args):
        return None
    items = _scalar_types(typing.get_args(lists[0])[0]) if typing.get_args(lists[0]) else None
    return None if items is None else (items, type(None) in args)


def _list_problem(value, items: tuple[type, ...], optional: bool) -> str | None:
    """What is wrong with `value` for a `list[item] (| None)` field (None if nothing)."""
    if value is None and optional:
        return None
    allowed = f"a list of {_type_name(items)}" + (" or unset" if optional else "")
    if not isinstance(value, (list, tuple)) or not all(_type_ok(v, items) for v in value):
        return allowed
    if any(isinstance(v, float) and not math.isfinite(v) for v in value):
        return "finite numbers"
    return None


def _type_ok(value, allowed: tuple[type, ...]) -> bool:
    if value is None:
        return type(None) in allowed
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int):
        return int in allowed or float in allowed
    return isinstance(value, tuple(t for t in allowed if t is not type(None)))


def _type_name(allowed: tuple[type, ...]) -> str:
    return " or ".join("unset" if t is type(None) else t.__name__ for t in allowed)


def field_problems(obj, where: str, hints: dict[str, Any] | None = None, only_changed: bool = False) -> list[str]:
    """Type, Literal-choice and finiteness problems of a dataclass's scalar fields.

    torchtitan checks command-line values (tyro) but not TOML ones; this covers both.
    `only_changed` skips fields still at their default (torchtitan's own defaults are not
    always of their declared type).
    """
    if hints is None:
        try:
            hints = typing.get_type_hints(type(obj))
        except Exception:  # an unresolvable annotation: fall back to the raw field types
            hints = {}
    problems = []
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        value = getattr(obj, f.name)
        annotation = hints.get(f.name, f.type)
        if only_changed and f.default is not dataclasses.MISSING and value == f.default:
            continue
        choices = _literal_choices(annotation)
        if choices is not None:
            if value not in choices:
                allowed = ", ".join("unset" if c is None else repr(c) for c in choices)
                problems.append(f"{where} {f.name} = {value!r} is invalid; allowed: {allowed}")
            continue
        allowed_types = _scalar_types(annotation)
        if allowed_types is None:
            list_items = _list_item_types(annotation)
            problem = None if list_items is None else _list_problem(value, *list_items)
            if problem is not None:
                problems.append(f"{where} {f.name} = {value!r} is invalid; allowed: {problem}")
            continue
        if not _type_ok(value, allowed_types):
            problems.append(f"{where} {f.name} = {value!r} is invalid; allowed: {_type_name(allowed_types)}")
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where} {f.name} = {value!r} is invalid; allowed: a finite number")
    return problems
