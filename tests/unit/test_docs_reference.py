"""The generated Reference pages cover what the code has: every CLI command and option,
every scenario key (the simulator profile's included), every record and table column, every
exit status.

The code is walked here on its own, not through the generator, so an entry the generator
drops (a filter, a skipped subcommand) fails as surely as one the code adds. The pages are
built by ``docs/gen_reference.py`` (a mkdocs hook; ``make docs``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import typing
from types import ModuleType
from typing import Any

import click
import pytest

from tests.support.paths import ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "docs" / "gen_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _section(page: str, heading: str) -> str:
    """The text under ``heading`` (a whole line's start) up to the next heading of level 2."""
    start = page.index(heading)
    end = page.find("\n## ", start + len(heading))
    return page[start : end if end >= 0 else len(page)]


def _walk(command: click.Command, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    out = [(path, command)]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            out += _walk(sub, (*path, name))
    return out


def test_every_command_option_and_argument_has_an_entry() -> None:
    from sessiongen.cli import cli

    page = GEN.cli_page()
    walked = _walk(cli, ("sessiongen",))
    assert len(walked) > 15
    for path, command in walked:
        section = _section(page, f"## `{' '.join(path)}`")
        for param in command.params:
            if isinstance(param, click.Argument):
                assert f"`{param.human_readable_name}`" in section, (path, param.name)
                continue
            for opt in [*param.opts, *param.secondary_opts]:
                assert re.search(rf"`[^`]*(?<![\w-]){re.escape(opt)}(?![\w-])", section), (
                    f"{' '.join(path)}: {opt} has no entry in the CLI reference"
                )


#: Options without help text today: a new option brings its
#: help; drop an entry once it has one.
UNHELPED_OPTIONS = {
    ("sessiongen", "trace-info", "--speedup"),
    ("sessiongen", "replay", "--progress"),
    ("sessiongen", "sim", "serve", "--host"),
    ("sessiongen", "sim", "serve", "--shared-cache"),
    ("sessiongen", "sim", "serve", "--profile-json"),
    ("sessiongen", "sim", "serve", "--report-urls"),
    ("sessiongen", "sim", "serve", "--exit-on-stdin-eof"),
    ("sessiongen", "sim", "serve", "--log-level"),
    ("sessiongen", "sim", "switch", "--shared-cache"),
    ("sessiongen", "pair", "up", "--cache"),
    ("sessiongen", "trend", "check", "--threshold"),
    ("sessiongen", "trend", "check", "--min-nights"),
    ("sessiongen", "nightly", "--runs-dir"),
    ("sessiongen", "nightly", "--progress"),
    ("sessiongen", "plan", "--runs-dir"),
    ("sessiongen", "plan", "--progress"),
}


def test_every_new_option_and_command_says_what_it_does() -> None:
    from sessiongen.cli import cli

    unhelped = set()
    for path, command in _walk(cli, ("sessiongen",)):
        assert command.help, f"{' '.join(path)} has no help"
        for p in command.params:
            if isinstance(p, click.Option) and not p.help:
                unhelped.add((*path, p.opts[0]))
    assert unhelped <= UNHELPED_OPTIONS, f"options without help: {unhelped - UNHELPED_OPTIONS}"


def _keys(cls: type[Any], prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, doc) of every plain key of a config dataclass, nested tables walked."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out += _keys(hints[f.name], path)
        elif path != "source":
            out.append((path, f.metadata.get("doc", "")))
    return out


def test_every_scenario_and_profile_key_has_an_entry() -> None:
    from sessiongen.scenario.simprofile import SimProfile
    from sessiongen.scenario.spec import Scenario

    page = GEN.scenario_page()
    keys = _keys(Scenario)
    profile = [k for k, _ in _keys(SimProfile, "target.sim")]
    assert profile and set(profile) <= {k for k, _ in keys}
    for key, _doc in keys:
        table = key.rpartition(".")[0]
        section = _section(page, f"## `[{table}]`" if table else "## Top level")
        assert f"| `{key}` |" in section, f"{key} has no entry in the scenario reference"


#: Scenario keys without a doc line today: a new key brings its doc; drop an entry once it has one.
UNDOCUMENTED_KEYS = {
    "name",
    "seed",
    "description",
    "sampling.temperature",
    "sampling.seed",
    "driver.connect_timeout_s",
    "load.arrival",
    "target.kind",
    "target.managed.device",
    "target.managed.replicas",
    "target.managed.gpus_per_replica",
    "target.managed.max_model_len",
    "target.managed.startup_timeout_s",
}


def test_every_new_scenario_key_says_what_it_is() -> None:
    from sessiongen.scenario.spec import Scenario

    undocumented = {key for key, doc in _keys(Scenario) if not doc}
    assert undocumented <= UNDOCUMENTED_KEYS, (
        f"keys without doc=: {undocumented - UNDOCUMENTED_KEYS}"
    )


def test_every_record_and_table_column_has_an_entry() -> None:
    from sessiongen.analysis.whatif import ROW_COLUMNS, WHATIF_COLUMNS
    from sessiongen.records.format import METRICS_SCHEMA, REQUEST_SCHEMA

    page = GEN.records_page()
    for heading, columns in [
        ("## `requests.parquet`", REQUEST_SCHEMA),
        ("## `metrics.parquet`", METRICS_SCHEMA),
        ("## `whatif.parquet`", {**ROW_COLUMNS, **WHATIF_COLUMNS}),
    ]:
        section = _section(page, heading)
        rows = re.findall(r"^\| `([a-z0-9_]+)` \| [^|]*\| (.+) \|$", section, flags=re.M)
        assert [name for name, _ in rows] == list(columns), heading
        assert all(doc.strip() for _, doc in rows), heading


def test_every_exit_status_has_an_entry() -> None:
    from sessiongen import errors

    page = GEN.exit_codes_page()
    for name in dir(errors):
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.SessiongenError):
            assert name in page, name
            if hasattr(cls, "exit_code"):
                assert f"| `{name}` | {cls.exit_code} |" in page
    for status in ("| 0 |", "| 1 |", "| 2 |", "130, 143, 129"):
        assert status in page


@pytest.mark.parametrize("name", sorted(GEN.PAGES))
def test_the_site_lists_each_generated_page(name: str) -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert f"reference/{name}" in nav
    assert f"/docs/reference/{name}" in (ROOT / ".gitignore").read_text(encoding="utf-8")
