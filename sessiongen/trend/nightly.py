"""The nightly job: replay a suite of scenarios, store the runs, check the trend, report.

A nightly config is TOML (see ``nightly/example.toml``)::

    [target]                    # optional: merged over every scenario's [target]
    kind = "sim"

    [check]                     # optional: trend check settings
    threshold = 0.05            # worse by more than this is a regression
    min_nights = 2              # ... once it has lasted this many nights
    [check.thresholds]          # optional per-metric thresholds
    speedup = 0.08

    [[scenario]]                # one or more
    file = "../scenarios/smoke.toml"   # relative to the config file
    set = ["sessions.count=4"]         # --set overrides, applied after [target]

The config and every scenario it names are validated before anything runs; errors are
one line naming the config file and key (``nightly.toml: scenario[1].set[0]: ...``).
Then, for each scenario: :func:`sessiongen.replay.replay`, add the run to the trend store
(:func:`sessiongen.trend.trend_add`), write its report (``report = true``). A scenario
that cannot run (e.g. an unreachable endpoint) is recorded and the suite goes on. Finally
:func:`sessiongen.trend.trend_check` and :func:`sessiongen.trend.trend_plot` over the store
folders of the suite's scenarios (other
scenarios in the store are left alone), and a markdown summary in
``RUNS_DIR/nightly-<UTC time>-<random>/summary.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from sessiongen import outcome
from sessiongen.errors import ScenarioError, UserError
from sessiongen.infra.files import atomic_write_bytes, ensure_dir
from sessiongen.infra.tomlfile import read_toml
from sessiongen.records import io
from sessiongen.replay import ReplayOptions, replay
from sessiongen.report import read_cautions
from sessiongen.scenario import schema
from sessiongen.scenario.schema import spec
from sessiongen.scenario.spec import Scenario, TargetSpec
from sessiongen.scenario.spec import load as load_scenario
from sessiongen.trend import check as trend
from sessiongen.trend.plot import trend_plot
from sessiongen.trend.store import RunIdentity, trend_add


@dataclass(frozen=True)
class ThresholdsSpec:
    """Per-metric regression thresholds (relative); unset ones use ``check.threshold``."""

    ttft: float | None = spec(None, gt=0, doc="median TTFT of an arm and turn")
    speedup: float | None = spec(None, gt=0, doc="ON/OFF speedup of a turn")


@dataclass(frozen=True)
class CheckSpec:
    """How the trend is checked after the runs."""

    threshold: float = spec(0.05, gt=0, le=10, doc="relative change that is a regression")
    min_nights: int = spec(2, ge=1, le=365, doc="nights a shift must last")
    window: int = spec(trend.WINDOW, ge=4, le=3650, doc="newest nights fitted per series")
    thresholds: ThresholdsSpec = field(default_factory=ThresholdsSpec)


@dataclass(frozen=True)
class SuiteEntry:
    """One scenario of the suite."""

    file: str = spec(doc="scenario TOML file, relative to the config file")
    set: tuple[str, ...] = spec(
        (),
        empty="the scenario as written",
        repeats="as with --set, a later override of a key wins",
        any_order="applied in the order given, as with --set",
        doc="dotted.key=value overrides, as with --set",
    )


@dataclass(frozen=True)
class NightlyConfig:
    """A validated nightly config."""

    scenario: tuple[SuiteEntry, ...] = spec(
        any_order="the scenarios run in the order given", doc="the suite, one [[scenario]] each"
    )
    target: TargetSpec = field(default_factory=TargetSpec)
    check: CheckSpec = field(default_factory=CheckSpec)
    report: bool = spec(True, doc="write each run's report")
    plot: bool = spec(True, doc="draw the trend plots")


@dataclass(frozen=True)
class Suite:
    """A config with its scenarios resolved and validated."""

    path: Path
    config: NightlyConfig
    scenarios: tuple[Scenario, ...]


def toml_value(value: object) -> str:
    """A plain value as TOML text (for turning a table into ``--set`` overrides)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"unsupported value {value!r}")


def table_overrides(table: Mapping[str, object], prefix: str) -> list[str]:
    """``prefix.key=value`` for every leaf of a (nested) TOML table."""
    out = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += table_overrides(value, f"{prefix}.{key}")
        else:
            out.append(f"{prefix}.{key}={toml_value(value)}")
    return out


def load_suite(config_path: str | Path) -> Suite:
    """Read and validate a nightly config and every scenario in it (nothing runs)."""
    path = Path(config_path)
    raw = read_toml(path)
    config = schema.build(NightlyConfig, raw, str(path))
    target_sets = table_overrides(raw.get("target", {}), "target")
    scenarios = []
    for i, entry in enumerate(config.scenario):
        file = Path(entry.file)
        file = file if file.is_absolute() else path.parent / file
        try:
            scenarios.append(load_scenario(file, [*target_sets, *entry.set]))
        except ScenarioError as exc:
            raise ScenarioError(str(path), f"scenario[{i}]", str(exc)) from None
    return Suite(path, config, tuple(scenarios))


class _CheckArgs(TypedDict):
    """The config's ``[check]`` as :func:`trend_check` and :func:`trend_plot` take it."""

    threshold: float
    min_nights: int
    per_metric_thresholds: dict[str, float]
    window: int
    folders: set[str]


@dataclass
class NightlyRun:
    """What happened to one scenario of the suite."""

    scenario: str  # scenario name
    source: str  # scenario file
    run_dir: Path | None = None
    requests: int = 0
    failed: int = 0
    interrupted: bool = False
    stored: Path | None = None  # the run's file in the trend store, when newly added
    report: Path | None = None
    error: str | None = None  # the scenario could not run (one line)
    failure: str | None = None  # it ran and failed as ``replay`` would exit 1 (one line)
    folder: str = ""  # its trend store folder
    problems: tuple[str, ...] = ()  # its report's Problems (warnings), as the report says them
    limits: tuple[str, ...] = ()  # its report's Limits

    @property
    def ok(self) -> bool:
        return self.error is None and self.failure is None and not self.interrupted


@dataclass
class NightlyResult:
    """Everything the nightly job produced."""

    out_dir: Path
    summary: Path
    runs: list[NightlyRun]
    added: list[Path]  # trend store files written tonight
    check: trend.CheckResult | None
    plots: list[Path]

    @property
    def interrupted(self) -> bool:
        return any(r.interrupted for r in self.runs)

    @property
    def exit_code(self) -> int:
        """130 when interrupted; 1 on a regression or a run that failed; else 0."""
        if self.interrupted:
            return 130
        regressed = self.check is not None and self.check.exit_code != 0
        return 1 if regressed or not all(r.ok for r in self.runs) else 0


def _run_one(sc: Scenario, store: Path, runs_dir: Path, report: bool, progress: bool) -> NightlyRun:
    """Replay one scenario, store it, report it, judge it as ``sessiongen replay`` does
    (:func:`sessiongen.outcome.judge`, quietly); a UserError is recorded, not raised."""
    run = NightlyRun(sc.name, sc.source, folder=f"{sc.name}-{sc.digest()}")
    try:
        result = replay(sc, ReplayOptions(runs_dir=runs_dir, progress=progress))
    except UserError as exc:
        run.error = str(exc)
        return run
    run.run_dir, run.requests = result.run_dir, result.requests
    run.folder = RunIdentity.of(io.read_meta(result.run_dir)).folder  # as the store files it
    run.failed, run.interrupted = result.failed, result.interrupted
    if result.interrupted:
        return run
    run.stored = next(iter(trend_add([result.run_dir], store)), None)
    verdict = outcome.judge(
        result,
        strict_arms=sc.target.strict_arms,
        write_report=report,
        say=outcome.quiet,
    )
    run.failure = None if verdict.error is None else str(verdict.error)
    if verdict.report is not None:
        run.report = verdict.report
        cautions = read_cautions(run.report.parent) or {}
        run.problems = tuple(cautions.get("problems", ()))
        run.limits = tuple(cautions.get("limits", ()))
    return run


def _outcome(run: NightlyRun) -> str:
    """One scenario's outcome in a few words, for the step lines."""
    if run.error is not None:
        return f"could not run: {run.error}"
    if run.interrupted:
        return "interrupted"
    said = f"{run.requests} requests" + (f", {run.failed} failed" if run.failed else "")
    if run.failure is not None and not run.failed:  # cache failures, or a strict arm check
        said += f", {run.failure}"
    if run.report:
        for n, what in ((len(run.limits), "limit"), (len(run.problems), "problem")):
            said += f", {n} {what}{'' if n == 1 else 's'}"
    return said + (f"; report {run.report}" if run.report else "")


def run_nightly(
    config_path: str | Path,
    store: str | Path,
    runs_dir: str | Path,
    *,
    progress: bool = False,
    say: Callable[[str], None] | None = None,
) -> NightlyResult:
    """Run the suite of ``config_path``, add the runs to ``store``, check, plot, summarize.

    Config errors raise :class:`ScenarioError` before anything runs. Ctrl-C stops after
    the current scenario (which keeps what it measured) and skips the rest. ``say`` gets
    one line as each step starts and ends (a scenario's replay takes minutes; without
    ``progress`` nothing else is printed meanwhile).
    """
    tell = say or (lambda _line: None)
    suite = load_suite(config_path)
    cfg = suite.config
    store, runs_dir = Path(store), Path(runs_dir)
    started = datetime.now(UTC)
    out_dir = runs_dir / f"nightly-{started:%Y%m%dT%H%M%SZ}-{os.urandom(2).hex()}"
    ensure_dir(out_dir)
    ensure_dir(store)  # a store that cannot be written fails now, not after the suite ran
    runs: list[NightlyRun] = []
    total = len(suite.scenarios)
    for i, sc in enumerate(suite.scenarios, start=1):
        tell(f"nightly: [{i}/{total}] {sc.name}: replaying {sc.source}")
        runs.append(_run_one(sc, store, runs_dir, cfg.report, progress))
        tell(f"nightly: [{i}/{total}] {sc.name}: {_outcome(runs[-1])}")
        if runs[-1].interrupted:
            break
    added = [r.stored for r in runs if r.stored is not None]
    check_args: _CheckArgs = {
        "threshold": cfg.check.threshold,
        "min_nights": cfg.check.min_nights,
        "per_metric_thresholds": {
            k: v for k, v in schema.to_plain(cfg.check.thresholds).items() if v is not None
        },
        "window": cfg.check.window,
        "folders": {r.folder for r in runs},
    }
    check, plots = None, []
    if any(any((store / f).glob("*.parquet")) for f in check_args["folders"]):
        tell(f"nightly: checking the trend in {store}")
        check = trend.trend_check(store, **check_args)
        if cfg.plot:
            plots = trend_plot(store, out_dir / "plots", **check_args)
    result = NightlyResult(out_dir, out_dir / "summary.md", runs, added, check, plots)
    text = summary_markdown(result, suite, store, started)
    atomic_write_bytes(result.summary, text.encode("utf-8"))
    return result


def _rel(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` (links in the summary survive moving the folder)."""
    return os.path.relpath(path, base)


def _runs_table(result: NightlyResult) -> list[str]:
    out = ["| scenario | run | requests | failed | stored | report |", "|---|---|---|---|---|---|"]
    for r in result.runs:
        if r.error is not None:
            out.append(f"| {r.scenario} | could not run: {r.error} | - | - | - | - |")
            continue
        run = r.run_dir.name if r.run_dir else "-"
        state = "interrupted" if r.interrupted else str(r.failed)
        report = f"[report]({_rel(r.report, result.out_dir)})" if r.report else "-"
        stored = "yes" if r.stored else "no"
        out.append(f"| {r.scenario} | {run} | {r.requests} | {state} | {stored} | {report} |")
    return out


def headline(result: NightlyResult) -> str:
    """The night in a few words: OK only when no run's report has a Problem or a Limit."""
    if result.exit_code == 130:
        return "INTERRUPTED"
    if result.exit_code:
        return "ATTENTION: regressions or failed runs"
    troubled = [r for r in result.runs if r.problems]
    limited = [r for r in result.runs if r.limits and not r.problems]
    if troubled:
        return (
            f"NO REGRESSION, BUT {len(troubled)} OF {len(result.runs)} RUNS REPORT PROBLEMS: "
            "their figures may not mean what they say"
        )
    if limited:
        return f"OK, WITH LIMITS in {len(limited)} of {len(result.runs)} runs"
    return "OK"


def _cautions(result: NightlyResult) -> list[str]:
    """Each run's Limits and Problems, in its report's order (its Limits, then its
    Problems, each in the report's order), as the notebook lists them too."""
    out: list[str] = []
    for r in result.runs:
        if not (r.problems or r.limits):
            continue
        out += [f"### {r.scenario}", ""]
        out += [f"- Limit: {text}" for text in r.limits]
        out += [f"- Problem: {text}" for text in r.problems]
        out.append("")
    return ["## Problems and limits of tonight's runs", "", *out] if out else []


def summary_markdown(result: NightlyResult, suite: Suite, store: Path, started: datetime) -> str:
    """The night's summary: runs, their Problems and Limits, the trend's findings, plots."""
    tool = io.tool_identity()
    lines = [
        f"# sessiongen nightly {started:%Y-%m-%d %H:%M} UTC: {headline(result)}",
        "",
        f"Config `{suite.path}`, trend store `{store}`, sessiongen {tool['sessiongen_version']}"
        f" (git {str(tool['git_sha'])[:12]}).",
        "",
        "## Runs",
        "",
        *_runs_table(result),
        "",
        *_cautions(result),
        "## Trend",
        "",
        result.check.markdown() if result.check else "No runs in the trend store yet.\n",
    ]
    if result.plots:
        lines += ["## Plots", ""]
        lines += [f"- [{_rel(p, result.out_dir)}]({_rel(p, result.out_dir)})" for p in result.plots]
    return "\n".join(lines).rstrip("\n") + "\n"
