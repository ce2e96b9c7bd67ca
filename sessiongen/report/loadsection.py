"""The report's load section: what a platform engineer acts on, for runs under load.

Shown when a run swept load levels, used open-loop arrivals or set an objective: per
placement, the pool's gain in whole-session time at each level, goodput OFF and ON, and
the load each arm sustains within the objective; then saturation curves, goodput, the
full table, working sets against capacities, and reuse distances. Arms whose TTFT grows
over the run at a level (offered load above what they serve: ``stable`` false in
:func:`~sessiongen.analysis.load.load_table`) are named as unstable first, and their
medians, tails and gains at that level are left blank: they measure the run's length.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sessiongen.analysis import SESSION_GAIN, load, session_speedup
from sessiongen.analysis.stats import Bootstrap
from sessiongen.records.run import Run
from sessiongen.report.document import Element, Heading, Image, Paragraph, Table
from sessiongen.report.figures import save_png_svg
from sessiongen.report.loadplots import goodput_figure, saturation_figure


def is_load_run(run: Run) -> bool:
    """True when the run swept levels, arrived open-loop or set a TTFT objective."""
    spec = run.meta.scenario.get("load") or {}
    objective = run.meta.scenario.get("objective") or {}
    levels = run.requests["load_level"].drop_nulls().n_unique()
    return bool(levels > 1 or spec.get("arrival", "closed") != "closed" or objective.get("ttft_s"))


def _objective(run: Run) -> tuple[float | None, float]:
    objective = run.meta.scenario.get("objective") or {}
    return objective.get("ttft_s"), float(objective.get("attainment", 0.9))


def level_name(run: Run) -> str:
    """What the load level is, in words."""
    arrival = (run.meta.scenario.get("load") or {}).get("arrival", "closed")
    if arrival == "closed":
        return "sessions in flight (closed loop)"
    return f"session starts per {'modeled ' if run.modeled else ''}second ({arrival})"


def pool_gain_by_level(run: Run, table: pl.DataFrame, boot: Bootstrap) -> pl.DataFrame:
    """Per placement and level: the pool's whole-session gain and goodput OFF vs ON."""
    rows: list[dict[str, object]] = []
    levels = sorted(table["load_level"].unique().to_list())
    for level in levels:
        at = run.filter(pl.col("load_level").fill_null(1.0) == level)
        gains = session_speedup(at, boot=boot)
        for g in gains.iter_rows(named=True):
            arms = table.filter(
                (pl.col("placement") == g["placement"])
                & (pl.col("context_tokens") == g["context_tokens"])
                & (pl.col("load_level") == level)
            )
            good = {r["cache"]: r for r in arms.iter_rows(named=True)}
            rows.append(
                {
                    "placement": g["placement"],
                    "context_tokens": g["context_tokens"],
                    "load_level": level,
                    "session_gain": g["speedup"],
                    "gain_ci_low": g["speedup_ci_low"],
                    "gain_ci_high": g["speedup_ci_high"],
                    "good_turns_off": good.get("off", {}).get("good_turns"),
                    "good_turns_on": good.get("on", {}).get("good_turns"),
                    "p90_off_s": good.get("off", {}).get("p90_ttft_s"),
                    "p90_on_s": good.get("on", {}).get("p90_ttft_s"),
                }
            )
    return pl.DataFrame(rows, infer_schema_length=None)


def capacities(run: Run) -> dict[str, float]:
    """KV capacity per replica and the pool's, in tokens, where the target says them."""
    profile = run.meta.target.get("profile") or {}
    out: dict[str, float] = {}
    if "local_cache_tokens" in profile:
        out["replica_kv_tokens"] = float(profile["local_cache_tokens"])
    if "pool_capacity_gib" in profile and profile.get("kv_bytes_per_token"):
        out["pool_tokens"] = profile["pool_capacity_gib"] * 2**30 / profile["kv_bytes_per_token"]
    return out


def load_section(run: Run, out_dir: Path, note: str, boot: Bootstrap) -> list[Element]:
    """The load section's elements (figures saved into ``out_dir``)."""
    ttft_s, attainment = _objective(run)
    table = load.load_table(run, ttft_s, attainment)
    unit = "modeled s" if run.modeled else "s"
    name = level_name(run)
    out: list[Element] = [Heading("Load: does the pool pay at this load?")]
    gains = pool_gain_by_level(run, table, boot)
    if ttft_s is not None:
        out.append(
            Paragraph(
                f"Objective: TTFT <= {ttft_s:g} {unit} for at least {attainment:.0%} of turns. "
                f"session_gain: {SESSION_GAIN}, at each level (paired bootstrap "
                "over sessions). Goodput intervals take sessions as units (a session's "
                "turns share prompts, a replica and queueing, so they are not independent); "
                "p90 is MLPerf's early-stopping estimate on the effective sample size."
            )
        )
    unstable = table.filter(~pl.col("stable"))
    if unstable.height:
        out.append(_unstable_note(unstable, unit))
        gains = _blank_unstable(gains, unstable)
    out.append(Table(gains))
    if ttft_s is not None:
        sustained = load.sustained_load(table, attainment)
        out += [
            Paragraph(
                "Load each arm sustains within the objective: 'sustains', the last level of "
                "the leading run of levels that meet it; 'sure', the last of the leading run "
                "whose goodput interval lies at or above the target; 'fails', the first "
                "level from which every higher level's interval lies wholly below it."
            ),
            Table(sustained),
        ]
        bent = sustained.filter(~pl.col("monotone"))
        if bent.height:
            arms = ", ".join(f"{r['placement']}/{r['cache']}" for r in bent.iter_rows(named=True))
            out.append(
                Paragraph(
                    f"Not monotone: {arms} met the objective at a level above one it missed. "
                    "No capacity can be read off such a sweep: its levels disagree more than "
                    "their intervals allow (more sessions per level), or the system really "
                    "behaves better under more load."
                )
            )
    sat = save_png_svg(saturation_figure(table, note, name, unit), out_dir, "saturation")[0]
    out.append(Image(sat, "TTFT p50 and p90 against offered load, per arm"))
    if ttft_s is not None:
        fig = goodput_figure(table, note, name, ttft_s, attainment)
        out.append(Image(save_png_svg(fig, out_dir, "goodput")[0], "goodput against load"))
    out += [
        Heading("Per arm and level", 3),
        Table(_blank_unstable_rows(table.drop("p90_ttft_s"))),
        Heading("Working set against capacity", 3),
        _working_set(run),
        Heading("Reuse distance and where hits came from", 3),
        Table(load.reuse_summary(run), max_rows=80),
    ]
    return out


def _unstable_note(unstable: pl.DataFrame, unit: str) -> Paragraph:
    """Which arms are unstable at which levels, and what that means for their figures."""
    cells = ", ".join(
        f"{r['placement']}/{r['cache']} at {r['load_level']:g} "
        f"({_why(r['ttft_growth'], r['throughput_turns_s'], r['offered_turns_s'], unit)})"
        for r in unstable.sort(*load.LEVEL_KEYS).iter_rows(named=True)
    )
    return Paragraph(
        f"Unstable: {cells}. Offered load there exceeds what the arm serves: its queue "
        f"grows over the run (TTFT growing faster than {load.MAX_GROWTH:g} {unit} per "
        f"{unit} of arrivals, or fewer than {load.MIN_SERVED_SHARE:.0%} of the offered "
        "turns served per second), so its medians, tails and the pool's gain depend on "
        "how long the run was, and are left blank below. Compare arms at levels where "
        "both are stable, or read the growth as how far over capacity the load is."
    )


def _why(growth: float | None, served: float | None, offered: float | None, unit: str) -> str:
    """Why a level is unstable: its TTFT growth, and the turns served of those offered."""
    parts = []
    if growth is not None:
        parts.append(f"TTFT {growth:+.2f} {unit} per {unit} of arrivals")
    if offered is not None and served is not None:
        parts.append(f"{served:.3g} of {offered:.3g} turns/{unit} served")
    return "; ".join(parts)


_LEVEL_FIGURES = ("p50_ttft_s", "p90_note", "median_queue_s")
_GAIN_FIGURES = ("session_gain", "gain_ci_low", "gain_ci_high", "p90_off_s", "p90_on_s")


def _blank_unstable_rows(table: pl.DataFrame) -> pl.DataFrame:
    """The per-arm table with the run-length-dependent figures of unstable rows nulled."""
    keep = pl.col("stable")
    return table.with_columns(
        pl.when(keep).then(pl.col(c)).otherwise(None).alias(c)
        for c in _LEVEL_FIGURES
        if c in table.columns
    )


def _blank_unstable(gains: pl.DataFrame, unstable: pl.DataFrame) -> pl.DataFrame:
    """The gain table with a ``stable`` column, gains and tails of unstable cells nulled
    (a cell is unstable when either arm is)."""
    if gains.is_empty():
        return gains
    keys = ["placement", "context_tokens", "load_level"]
    bad = unstable.select(keys).unique().with_columns(pl.lit(False).alias("stable"))
    marked = gains.join(bad, on=keys, how="left").with_columns(pl.col("stable").fill_null(True))
    return marked.with_columns(
        pl.when(pl.col("stable")).then(pl.col(c)).otherwise(None).alias(c)
        for c in _GAIN_FIGURES
        if c in marked.columns
    )


def _working_set(run: Run) -> Table:
    ws = load.working_set(run)
    caps = capacities(run)
    for name, value in caps.items():
        ws = ws.with_columns(pl.lit(value).alias(name))
    return Table(ws)
