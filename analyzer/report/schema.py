"""The ``kvpool.report/3`` schema's reader: JSON into frozen view dataclasses and back.

A view class's fields are the JSON object's keys. ``rest`` collects the keys a view
does not name (a stage's output carries more than the renderers read): they travel
through unchanged, so ``to_json(from_json(d)) == d``. An ``absent`` field is a key some
documents leave out: None in the view, its name in ``missing``, and left out again on
the way back (a key written as null stays null). Numbers keep their JSON type (an int
stays an int in a float field), so the text written back is the text read. A value
that does not fit raises :class:`ReportFormatError` naming the dotted field.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from functools import cache
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

from analyzer.advisor.figures import (
    Undefined,
)

if TYPE_CHECKING:
    pass

SCHEMA = "kvpool.report/3"


# -- reading the schema into frozen dataclasses --------------------------------------------
#
# A view class's fields are the JSON object's keys. ``rest`` collects the keys a view
# does not name (a stage's output carries more than the renderers read): they travel
# through unchanged, so ``to_json(from_json(d)) == d``. An ``absent`` field is a key some
# documents leave out: None in the view, its name in ``missing``, and left out again on
# the way back (a key written as null stays null). Numbers
# keep their JSON type (an int stays an int in a float field), so the text written back
# is the text read.


class ReportFormatError(ValueError):
    """A document that does not fit the schema; ``field`` is the dotted path to it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


# Field markers: ``rest`` holds the keys a view does not name; an ``absent`` key may be
# left out of the JSON (None here); ``missing`` lists the absent keys this object's JSON
# left out, so they are left out again on the way back.
REST = {"rest": True}
ABSENT = {"absent": True}
MISSING = {"missing": True}


def json_kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "null" if value is None else "a number"
    )


@cache
def _hints(cls: type) -> dict[str, object]:
    return get_type_hints(cls)


def _load(tp: object, value: object, where: str) -> object:
    """``value`` (from ``json.loads``) as the type ``tp`` names; a mismatch raises
    :class:`ReportFormatError` naming the field."""
    origin = get_origin(tp)
    if tp is object:  # JSON of a shape the view does not fix: kept as read
        return copy.deepcopy(value)
    if origin in (Union, UnionType):
        args = get_args(tp)
        if value is None and NoneType in args:
            return None
        if NotApplicable in args and isinstance(value, dict) and "not_applicable" in value:
            return load_object(NotApplicable, value, where)
        (one,) = [a for a in args if a not in (NoneType, NotApplicable)]
        return _load(one, value, where)
    if value is None:
        raise ReportFormatError(where, "is null")
    if origin is tuple:
        if not isinstance(value, list):
            raise ReportFormatError(where, f"expected a list, got {json_kind(value)}")
        item = get_args(tp)[0]
        return tuple(_load(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, dict):
            raise ReportFormatError(where, f"expected an object, got {json_kind(value)}")
        kt, vt = get_args(tp)
        return {
            _load(kt, k, f"{where}.{k}"): _load(vt, v, f"{where}.{k}") for k, v in value.items()
        }
    if isinstance(tp, type) and issubclass(tp, Enum):
        if not isinstance(value, str) or value not in {m.value for m in tp}:
            names = ", ".join(m.value for m in tp)
            what = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", tp.__name__).lower()  # "deploy option"
            raise ReportFormatError(where, f"unknown {what} {value!r} ({names})")
        return tp(value)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif is_dataclass(tp):
        return load_object(tp, value, where)  # type: ignore[arg-type]
    else:  # pragma: no cover - a view class names a type this reader does not know
        raise TypeError(f"no reader for {tp!r}")
    if not ok:
        raise ReportFormatError(where, f"expected {tp.__name__}, got {json_kind(value)}")
    return value


def load_object(cls: type, value: object, where: str) -> Any:
    if not isinstance(value, dict):
        raise ReportFormatError(where, f"expected an object, got {json_kind(value)}")
    hints = _hints(cls)
    args: dict[str, object] = {}
    rest: str | None = None
    known: set[str] = set()
    missing: list[str] = []
    for f in fields(cls):
        if f.metadata.get("rest"):
            rest = f.name
            continue
        if f.metadata.get("missing"):
            continue
        known.add(f.name)
        at = f"{where}.{f.name}" if where else f.name
        if f.name in value:
            args[f.name] = _load(hints[f.name], value[f.name], at)
        elif f.metadata.get("absent"):
            missing.append(f.name)
        else:
            raise ReportFormatError(at, "missing")
    unknown = [k for k in value if k not in known]
    if unknown and rest is None:
        raise ReportFormatError(f"{where}.{unknown[0]}" if where else unknown[0], "unknown field")
    if rest is not None:
        args[rest] = {k: copy.deepcopy(value[k]) for k in unknown}
    if missing:
        args["missing"] = frozenset(missing)
    return cls(**args)


def dump_view(x: Any) -> Any:
    """A view back to plain JSON values (enums as their names, tuples as lists)."""
    if isinstance(x, Enum):
        return x.value
    if is_dataclass(x) and not isinstance(x, type):
        out: dict[str, Any] = {}
        left_out: frozenset[str] = getattr(x, "missing", frozenset())
        for f in fields(x):
            v = getattr(x, f.name)
            if f.metadata.get("rest"):
                out.update(copy.deepcopy(dict(v)))
            elif not f.metadata.get("missing") and f.name not in left_out:
                out[f.name] = dump_view(v)
        return out
    if isinstance(x, tuple | list):
        return [dump_view(v) for v in x]
    if isinstance(x, Mapping):
        return {dump_view(k): dump_view(v) for k, v in x.items()}
    return x


class View:
    """``to_json`` for every view class."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dump_view(self)
        return out


# -- the view: one class per object of the schema ------------------------------------------


@dataclass(frozen=True, slots=True)
class NotApplicable(View):
    """A figure the model leaves undefined on this log, and why: where a field's type
    names it (``float | NotApplicable``), the JSON holds ``{"not_applicable": code,
    "reason": words}`` instead of a number. Renderers print :attr:`short` in a table cell
    and :attr:`reason` in a sentence."""

    not_applicable: Undefined
    reason: str

    @property
    def short(self) -> str:
        return self.not_applicable.short


def not_applicable(why: Undefined) -> dict[str, str]:
    """The JSON form of a figure the model leaves undefined."""
    return {"not_applicable": why.value, "reason": why.words}
