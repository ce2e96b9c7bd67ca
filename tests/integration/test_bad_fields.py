"""Every list- and table-valued field of every TOML the tool reads, and every size,
given a bad value, is one line naming the file and the field, exit status 2, no
traceback: empty where entries are needed, too few, an entry twice, entries out of
order, zero and negative sizes, the wrong kind of value.

The fields are found by walking the schema's dataclasses (a scenario, a nightly config,
a profile file), and the bad values follow from what each field's spec declares, so a
new field is swept without touching this file. Each bad value is fed through the
command that reads that kind of file: ``generate`` (the scenario as a file) and
``replay`` (the same value as ``--set``), ``nightly`` (a nightly config), ``plan
--profile`` (a profile file).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from sessiongen.cli import main
from sessiongen.errors import ScenarioError
from sessiongen.scenario import schema
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.scenario.spec import Scenario
from sessiongen.trend.nightly import NightlyConfig
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"
SMOKE_RAW = tomllib.loads(SMOKE.read_text())
NIGHTLY_RAW: dict[str, Any] = {"scenario": [{"file": str(SMOKE)}]}

Key = tuple[str | int, ...]

#: Two valid entries, in order, for list fields whose items the schema cannot make up
#: (free text with an empty default). A new such field fails
#: :func:`test_every_list_field_has_valid_entries` until it has a line here.
TEXT_ENTRIES: dict[str, tuple[Any, Any]] = {
    "target.endpoints": ("http://127.0.0.1:9001", "http://127.0.0.1:9002"),
    "target.endpoints_off": ("http://127.0.0.1:9001", "http://127.0.0.1:9002"),
    "target.endpoints_on": ("http://127.0.0.1:9003", "http://127.0.0.1:9004"),
    "target.replica_names": ("a", "b"),
    "target.managed.vllm_args": ("--enforce-eager", "--seed=1"),
    "target.router.args": ("--cache-threshold", "0.5"),
    "scenario[0].set": ("sessions.count=3", "sessions.turns=2"),
    "scenario": ({"file": str(SMOKE)}, {"file": str(SMOKE), "set": ["sessions.count=3"]}),
}
#: Fields valid only beside another: the other, set to valid entries whenever they are.
COMPANIONS: dict[str, str] = {
    "target.endpoints_off": "target.endpoints_on",
    "target.endpoints_on": "target.endpoints_off",
}


@dataclass(frozen=True)
class Field:
    """One field of a schema: where it sits, its type, its spec."""

    key: Key
    tp: Any
    meta: Mapping[str, Any]
    default: Any

    @property
    def dotted(self) -> str:
        out = ""
        for part in self.key:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out


def _plain_type(tp: Any) -> Any:
    """``int | None`` -> ``int``; anything else as is."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def fields(cls: type, key: Key = ()) -> Iterator[Field]:
    """Every field of ``cls``, nested tables and the tables in lists of tables included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue
        tp = hints[f.name]
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else None
        )
        here = Field((*key, f.name), tp, f.metadata, default)
        yield here
        if dataclasses.is_dataclass(tp):
            yield from fields(typing.cast(type, tp), here.key)
        elif get_origin(tp) is tuple and dataclasses.is_dataclass(get_args(tp)[0]):
            yield from fields(get_args(tp)[0], (*here.key, 0))


def is_list(f: Field) -> bool:
    return get_origin(f.tp) is tuple


def is_table(f: Field) -> bool:
    return get_origin(f.tp) is dict or dataclasses.is_dataclass(f.tp)


def is_number(f: Field) -> bool:
    return _plain_type(f.tp) in (int, float)


def _bound_breakers(meta: Mapping[str, Any], item: Any) -> list[Any]:
    """Zero, negative and just-out-of-bounds values for a number field or entry."""
    ge, gt, le = meta.get("ge"), meta.get("gt"), meta.get("le")
    whole = item is int
    out = [0, -1]
    if ge is not None:
        out.append(ge - 1 if whole else ge - 0.5)
    if gt is not None:
        out.append(gt)
    if le is not None:
        out.append(le + 1 if whole else le * 2 + 1)

    def bad(v: float) -> bool:
        return (
            (ge is not None and v < ge)
            or (gt is not None and v <= gt)
            or (le is not None and v > le)
        )

    return sorted({v for v in out if bad(v)})


def valid_entries(f: Field) -> list[Any]:
    """At least two valid entries of a list field, in an order its spec accepts."""
    item = get_args(f.tp)[0]
    default = list(f.default or ())
    if len(default) >= 2:
        return default
    if f.dotted in TEXT_ENTRIES:
        return list(TEXT_ENTRIES[f.dotted])
    if get_origin(item) is Literal:
        return sorted(get_args(item))
    if item in (int, float):
        low = f.meta.get("ge")
        low = low if low is not None else (f.meta.get("gt") or 0) + 1
        first = default[0] if default else low
        return [first, first + 1]
    raise AssertionError(f"{f.dotted}: add two valid entries to TEXT_ENTRIES")


def bad_values(f: Field) -> Iterator[tuple[str, Any]]:
    """(what, value) for each kind of bad value the field's spec rules out."""
    least = schema.min_entries(f.meta)
    if is_list(f):
        base = valid_entries(f)
        if least >= 1:
            yield "empty", []
        if least >= 2:
            yield "too few", base[: least - 1]
        if not f.meta.get("repeats"):
            yield "an entry twice", [base[0], base[0], *base[2:]]
        if not f.meta.get("any_order"):
            yield "out of order", [base[1], base[0], *base[2:]]
        item = get_args(f.tp)[0]
        if item in (int, float):
            for value in _bound_breakers(f.meta, item):
                yield f"an entry of {value}", [value, *base[1:]]
        yield "a table for a list", {"x": 1}
    elif get_origin(f.tp) is dict:
        if least >= 1:
            yield "empty", {}
        yield "a list for a table", [1]
    elif dataclasses.is_dataclass(f.tp):
        yield "a number for a table", 5
    elif is_number(f):
        for value in _bound_breakers(f.meta, _plain_type(f.tp)):
            yield f"{value}", value


def with_value(raw: Mapping[str, Any], key: Key, value: Any) -> dict[str, Any]:
    """A deep copy of ``raw`` with ``key`` set (tables and list entries made as needed)."""
    out: dict[str, Any] = json.loads(json.dumps(raw))
    node: Any = out
    for part, nxt in itertools.pairwise(key):
        if isinstance(part, int):
            node = node[part]
        else:
            node = node.setdefault(part, [{}] if isinstance(nxt, int) else {})
            if isinstance(nxt, int) and not node:
                node.append({})
    node[key[-1]] = value
    return out


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_text(data: Mapping[str, Any], prefix: str = "") -> str:
    """``data`` as a TOML document: scalars first, then ``[tables]`` and ``[[arrays]]``."""
    lines, later = [], []
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            later.append(f"\n[{name}]\n" + toml_text(value, name))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            later += [f"\n[[{name}]]\n" + toml_text(v, name) for v in value]
        else:
            lines.append(f"{json.dumps(key)} = {toml_value(value)}")
    return "\n".join(lines) + "\n" + "".join(later)


def companions(root: Root, f: Field) -> dict[str, Any]:
    """``root.base`` with the field's companion (:data:`COMPANIONS`) set valid, if any."""
    other = COMPANIONS.get(f.dotted)
    if other is None:
        return root.base
    key = (*root.prefix, *other.split("."))
    return with_value(root.base, key, list(TEXT_ENTRIES[other]))


@dataclass(frozen=True)
class Root:
    """A kind of file, how to validate it, and the command line that reads it."""

    name: str
    cls: type
    base: dict[str, Any]
    prefix: Key  # where the schema's fields sit in the file
    validate: Callable[[dict[str, Any]], object]
    args: Callable[[Path, Path], list[str]]  # (file, tmp) -> command line


ROOTS = [
    Root(
        "scenario", Scenario, SMOKE_RAW, (),
        lambda raw: schema.build(Scenario, {**raw, "source": "x"}, "x"),
        lambda file, tmp: ["generate", str(file), "-o", str(tmp / "o.jsonl")],
    ),
    Root(
        "nightly config", NightlyConfig, NIGHTLY_RAW, (),
        lambda raw: schema.build(NightlyConfig, raw, "x"),
        lambda file, tmp: ["nightly", str(file), "--store", str(tmp / "store"),
                           "--runs-dir", str(tmp / "runs")],
    ),
    Root(
        "profile", SimProfile, {}, ("target", "sim"),
        lambda raw: schema.build(SimProfile, raw.get("target", {}).get("sim", {}), "x"),
        lambda file, tmp: ["plan", str(SMOKE), "--profile", str(file),
                           "--runs-dir", str(tmp / "runs"), "--no-progress"],
    ),
]  # fmt: skip

CASES = [(root, f, what, value) for root in ROOTS for f in fields(root.cls)
         for what, value in bad_values(f)]  # fmt: skip
SWEEP = [pytest.param(*case, id=f"{case[0].name}: {case[1].dotted}: {case[2]}") for case in CASES]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, list[str]]:
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return stop.value.code, err.strip().splitlines()


def assert_one_line(code: object, lines: list[str], source: str, dotted: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("sessiongen: error: "), lines
    assert f"{source}: " in lines[0], lines[0]
    assert dotted in lines[0], lines[0]


@pytest.mark.parametrize(("root", "field", "what", "value"), SWEEP)
def test_a_bad_value_in_the_file_is_one_line_naming_file_and_field(
    root: Root,
    field: Field,
    what: str,
    value: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    key = (*root.prefix, *field.key)
    path = tmp_path / "bad.toml"
    path.write_text(toml_text(with_value(companions(root, field), key, value)))
    code, lines = run_cli(root.args(path, tmp_path), capsys)
    dotted = ".".join(map(str, root.prefix)) + "." + field.dotted if root.prefix else field.dotted
    assert_one_line(code, lines, str(path), dotted)
    assert not (tmp_path / "o.jsonl").exists()


SET_SWEEP = [p for p, case in zip(SWEEP, CASES, strict=True)
             if case[0].name == "scenario" and is_list(case[1])]  # fmt: skip


@pytest.mark.parametrize(("root", "field", "what", "value"), SET_SWEEP)
def test_the_same_value_given_with_set_is_refused_alike(
    root: Root,
    field: Field,
    what: str,
    value: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    override = f"{field.dotted}={toml_value(value)}"
    args = ["replay", str(SMOKE), "--set", override, "--runs-dir", str(tmp_path / "r"),
            "--no-progress", "--no-report"]  # fmt: skip
    code, lines = run_cli(args, capsys)
    assert_one_line(code, lines, str(SMOKE), field.dotted)
    assert not (tmp_path / "r").exists()


def test_every_list_field_has_valid_entries() -> None:
    """The values the sweep breaks are valid before it breaks them (so each bad value is
    refused for what was done to it), and the walk found the fields it should."""
    seen = []
    for root in ROOTS:
        for f in fields(root.cls):
            if not is_list(f):
                continue
            seen.append(f.dotted)
            key = (*root.prefix, *f.key)
            root.validate(with_value(companions(root, f), key, valid_entries(f)))
    assert {"sessions.initial_context_tokens", "scenario", "hit_overhead_tokens"} <= set(seen)


def test_every_size_has_a_lower_bound() -> None:
    """A number without one would let zero and negative sizes through unswept."""
    unbounded = [
        f"{root.name}: {f.dotted}"
        for root in ROOTS
        for f in fields(root.cls)
        if (is_number(f) or (is_list(f) and get_args(f.tp)[0] in (int, float)))
        and f.meta.get("ge") is None
        and f.meta.get("gt") is None
    ]
    assert unbounded == []


def test_a_valid_file_passes_the_same_route(tmp_path: Path) -> None:
    """The sweep's files are well-formed: unchanged, each validates."""
    for root in ROOTS:
        raw = tomllib.loads(toml_text(root.base))
        root.validate(raw)
    with pytest.raises(ScenarioError):
        ROOTS[0].validate({})
