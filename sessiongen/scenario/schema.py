"""Validate plain TOML data into frozen dataclasses, once, with one-line errors.

Each config section is a frozen dataclass whose fields carry their type and,
in ``field(metadata=...)``, their bounds: ``ge``, ``gt``, ``le`` for numbers (for a
list, for each of its entries) and ``check`` (a callable returning an error text or
``None``) for anything else. Unknown keys are rejected. Every error names the source
file and the dotted key path (see :class:`sessiongen.errors.ScenarioError`).

List- and table-valued fields are strict unless their spec says why not, so a new
list field gets every check without asking for it, and nothing downstream meets an
empty list (``max()`` of nothing) or a repeated or shuffled one it did not expect:

- at least one entry (a table: at least one key), unless ``empty`` says what an empty
  one means; ``at_least`` asks for more;
- each entry once, unless ``repeats`` says why an entry may come back;
- entries increasing, unless ``any_order`` says why their order is free (or is the
  order things happen in).
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

from sessiongen.errors import ScenarioError

T = TypeVar("T")

#: Top-level fields the loader sets (the scenario's file), never listed as known keys;
#: ``[sessions] source`` is a user's key and is listed.
_HIDDEN_KEYS = frozenset({"source"})


def spec(
    default: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    check: Callable[[Any], str | None] | None = None,
    one_or_many: bool = False,
    empty: str = "",
    at_least: int | None = None,
    repeats: str = "",
    any_order: str = "",
    doc: str = "",
) -> Any:
    """A dataclass field with validation metadata (bounds, a custom check, a doc line).

    For a list or table field: ``empty`` (what an empty one means; without it, at least
    one entry), ``at_least`` (fewest entries, instead), ``repeats`` (why an entry may
    repeat; without it, each entry once), ``any_order`` (why entries need not increase;
    without it, increasing). See the module docstring.
    """
    if empty and at_least is not None:
        raise TypeError("spec(): give empty or at_least, not both")
    meta = {
        "ge": ge,
        "gt": gt,
        "le": le,
        "check": check,
        "one_or_many": one_or_many,
        "empty": empty,
        "at_least": at_least,
        "repeats": repeats,
        "any_order": any_order,
        "doc": doc,
    }
    if isinstance(default, list | dict | tuple) or dataclasses.is_dataclass(default):
        frozen = default
        return dataclasses.field(default_factory=lambda: frozen, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(_fmt(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a table of strings"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp) if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return "a table"
    return str(tp)


def _bounds_text(meta: Mapping[str, Any]) -> str:
    parts = []
    if meta.get("ge") is not None:
        parts.append(f">= {meta['ge']}")
    if meta.get("gt") is not None:
        parts.append(f"> {meta['gt']}")
    if meta.get("le") is not None:
        parts.append(f"<= {meta['le']}")
    return (" " + " and ".join(parts)) if parts else ""


class _Fail(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _convert(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    origin = get_origin(tp)
    expected = _describe(tp) + _bounds_text(meta)
    bad = _Fail(path, f"expected {expected}, got {_fmt(value)}")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None and type(None) in get_args(tp):
            return None
        for arg in args:
            try:
                return _convert(arg, value, path, meta)
            except _Fail:
                continue
        raise bad
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        _check_bounds(value, meta, bad)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        _check_bounds(value, meta, bad)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise bad
        return value
    if origin is tuple:
        if meta.get("one_or_many") and not isinstance(value, list):
            value = [value]
        if not isinstance(value, list):
            raise bad
        (item_tp, _ellipsis) = get_args(tp)
        items = tuple(_convert(item_tp, v, f"{path}[{i}]", meta) for i, v in enumerate(value))
        _check_list(tp, items, value, path, meta)
        return items
    if origin is dict:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise bad
        if len(value) < min_entries(meta):
            raise _Fail(path, "expected a non-empty table of strings, got an empty table")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _build_dataclass(typing.cast(type, tp), value, path)
    raise TypeError(f"unsupported config type {tp!r} at {path}")


def min_entries(meta: Mapping[str, Any]) -> int:
    """The fewest entries a list or table field takes (see :func:`spec`)."""
    if meta.get("at_least") is not None:
        return int(meta["at_least"])
    return 0 if meta.get("empty") else 1


def _check_list(
    tp: Any, items: tuple[Any, ...], raw: list[Any], path: str, meta: Mapping[str, Any]
) -> None:
    """Length, repeats and order of a list field, as its spec declares them."""
    least = min_entries(meta)
    if len(items) < least:
        kind = _describe(tp).removeprefix("a ")
        what = f"a non-empty {kind}" if least == 1 else f"at least {least} entries ({kind})"
        raise _Fail(path, f"expected {what}, got {_fmt(raw)}")
    if not meta.get("repeats"):
        seen: dict[Any, int] = {}
        for i, item in enumerate(items):
            if item in seen:
                raise _Fail(
                    f"{path}[{i}]",
                    f"expected each entry once, got {_fmt(raw[i])} again (first at [{seen[item]}])",
                )
            seen[item] = i
    if not meta.get("any_order"):
        for i in range(1, len(items)):
            if not items[i - 1] < items[i]:
                raise _Fail(
                    f"{path}[{i}]",
                    f"expected increasing entries, got {_fmt(raw[i])} after {_fmt(raw[i - 1])}",
                )


def _check_bounds(value: float, meta: Mapping[str, Any], bad: _Fail) -> None:
    if meta.get("ge") is not None and value < meta["ge"]:
        raise bad
    if meta.get("gt") is not None and value <= meta["gt"]:
        raise bad
    if meta.get("le") is not None and value > meta["le"]:
        raise bad


def _build_dataclass(cls: type[T], raw: Mapping[str, Any], path: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in raw:
        if key not in fields:
            where = f"{path}.{key}" if path else key
            known = ", ".join(sorted(k for k in fields if path or k not in _HIDDEN_KEYS))
            raise _Fail(where, f"unknown key (known keys here: {known})")
    kwargs: dict[str, object] = {}
    for name, f in fields.items():
        where = f"{path}.{name}" if path else name
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if dataclasses.is_dataclass(hints[name]):
                    kwargs[name] = _build_dataclass(hints[name], {}, where)
                    continue
                raise _Fail(where, f"missing; expected {_describe(hints[name])}")
            continue
        value = _convert(hints[name], raw[name], where, f.metadata)
        check = f.metadata.get("check")
        if check is not None:
            problem = check(value)
            if problem:
                # A check that names the offending entry itself ("got 'alternat'") is not
                # followed by the whole value again.
                got = "" if ", got " in problem else f", got {_fmt(raw[name])}"
                raise _Fail(where, problem + got)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ValueError as exc:
        # Cross-field checks in __post_init__ raise "field: message", relative to here.
        key, _, message = str(exc).partition(": ")
        raise _Fail(f"{path}.{key}" if path else key, message) from None


def build(cls: type[T], raw: Mapping[str, Any], source: str, prefix: str = "") -> T:
    """Validate ``raw`` into ``cls``; raise :class:`ScenarioError` naming ``source`` and
    the key path (under ``prefix``, where ``raw`` sits in its file, e.g. ``target.sim``)."""
    try:
        return _build_dataclass(cls, raw, prefix)
    except _Fail as fail:
        raise ScenarioError(source, fail.path, fail.message) from None


def check_field(cls: type, name: str, value: Any, source: str, prefix: str = "") -> Any:
    """One field of ``cls`` validated alone, as a file's would be (for a CLI flag that
    stands for it, e.g. ``--endpoints``); a :class:`ScenarioError` naming ``source``."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    where = f"{prefix}.{name}" if prefix else name
    try:
        out = _convert(typing.get_type_hints(cls)[name], value, where, f.metadata)
        check = f.metadata.get("check")
        problem = check(out) if check is not None else None
        if problem:
            raise _Fail(where, f"{problem}, got {_fmt(value)}")
    except _Fail as fail:
        raise ScenarioError(source, fail.path, fail.message) from None
    return out


def parse_override(text: str, source: str = "--set") -> tuple[list[str], Any]:
    """Parse ``dotted.key=value``; the value is read as a TOML value, else as a bare string."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ScenarioError(source, "", f"expected dotted.key=value, got {_fmt(text)}")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.split("."), parsed


def apply_overrides(raw: dict[str, object], overrides: list[str]) -> dict[str, object]:
    """Return a deep copy of ``raw`` with each ``dotted.key=value`` override set."""
    out = copy.deepcopy(raw)
    for text in overrides:
        keys, value = parse_override(text)
        node = out
        for i, part in enumerate(keys[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                dotted = ".".join(keys[: i + 1])
                raise ScenarioError("--set", dotted, f"is not a table, cannot set {text!r}")
            node = child
        node[keys[-1]] = value
    return out


def to_plain(obj: Any) -> Any:
    """A dataclass tree as plain JSON/TOML-friendly data (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj
