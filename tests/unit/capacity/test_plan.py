"""The planner: scenarios replayed on the virtual clock, grids of configurations, reports."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.analysis import SESSION_GAIN, load_run, session_speedup
from sessiongen.analysis.whatif import WHATIF_COLUMNS, Vary
from sessiongen.capacity.grid import configs
from sessiongen.capacity.plan import whatif_rows
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.cli import main
from sessiongen.errors import ScenarioError, UserError
from sessiongen.sim import model
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"
ALONE = ["driver.concurrency=1", 'design.blocks=["off", "on"]']


def smoke(*overrides: str) -> scenario.Scenario:
    return scenario.load(SMOKE, [*ALONE, *overrides])


def ttfts(run_dir: Path) -> pl.DataFrame:
    run = load_run(run_dir)
    keys = ["placement", "cache", "session_index", "turn"]
    return run.ok.select(*keys, "ttft_s", "local_hit_tokens", "external_hit_tokens").sort(keys)


def test_a_request_alone_takes_the_model_time_of_its_hits(tmp_path: Path) -> None:
    """Every turn that ran alone equals the calibrated formula for its own hit tokens."""
    sc = smoke()
    run = load_run(virtual_replay(sc, tmp_path))
    assert run.meta.target_kind == "plan" and run.simulated and run.time_scale == 1.0
    profile = sc.target.sim
    checked = 0
    for r in run.ok.iter_rows(named=True):
        timing = model.request_timing(
            profile, r["prompt_tokens"], r["local_hit_tokens"], r["external_hit_tokens"]
        )
        assert r["ttft_s"] == pytest.approx(timing.ttft_s, rel=1e-9)
        checked += 1
    assert checked == 2 * 2 * 3  # blocks x sessions x turns, warm-ups excluded


def test_turns_hit_where_the_placement_says(tmp_path: Path) -> None:
    """Alternate: turn 2 moves; OFF recomputes it, ON loads it from the pool; turn 3 is
    back on its first replica, a local hit either way."""
    frame = ttfts(virtual_replay(smoke(), tmp_path))
    t2 = {r["cache"]: r for r in frame.filter(pl.col("turn") == 2).iter_rows(named=True)}
    assert t2["off"]["local_hit_tokens"] == 0 and t2["off"]["external_hit_tokens"] == 0
    assert t2["on"]["external_hit_tokens"] > 1500
    t3 = frame.filter(pl.col("turn") == 3)
    assert (t3["local_hit_tokens"] > 2000).all()


def test_the_same_scenario_plans_the_same_times(tmp_path: Path) -> None:
    first = ttfts(virtual_replay(smoke(), tmp_path / "a"))
    again = ttfts(virtual_replay(smoke(), tmp_path / "b"))
    assert first.equals(again)


def test_synthetic_prompts_keep_the_exact_prompts_times(tmp_path: Path) -> None:
    """Shape mode (large runs) gives the same hits and times as exact prompts."""
    for history in ("frozen", "none", "live"):
        sc = smoke(f"sessions.history={history}", "sessions.count=3")
        exact = ttfts(virtual_replay(sc, tmp_path / f"e-{history}", tokens="exact"))
        shaped = ttfts(virtual_replay(sc, tmp_path / f"s-{history}", tokens="shape"))
        assert shaped["local_hit_tokens"].to_list() == exact["local_hit_tokens"].to_list()
        assert shaped["external_hit_tokens"].to_list() == exact["external_hit_tokens"].to_list()
        ratio = (shaped["ttft_s"] / exact["ttft_s"]).to_numpy()
        assert abs(ratio - 1).max() < 0.01, history


def test_load_queues_sessions_behind_each_other(tmp_path: Path) -> None:
    """Four sessions on one replica at once wait for each other; one at a time do not."""
    sc = smoke(
        "sessions.count=4", "placement.policies=[\"fixed\"]", "target.sim.replicas=1",
        "load.levels=[1, 4]",
    )  # fmt: skip
    run = load_run(virtual_replay(sc, tmp_path))
    first = run.ok.filter(pl.col("turn") == 1)
    alone = first.filter(pl.col("load_level") == 1)
    crowd = first.filter(pl.col("load_level") == 4)
    assert alone["server_queue_s"].max() == 0
    assert crowd["ttft_s"].max() > 2 * alone["ttft_s"].max()


def test_the_session_gain_is_replays_whole_session_time(tmp_path: Path) -> None:
    """One name, one definition: the what-if session gain is what replay's report shows
    for the same records (whole-session end-to-end time, per load level as the load
    section takes it), and the TTFT-sum gain is another, larger figure once decoding
    (which the pool does not shorten) is part of each turn."""
    sc = smoke("sessions.output_tokens=64", "sessions.count=3", "load.levels=[1, 2]")
    run = load_run(virtual_replay(sc, tmp_path))
    assert WHATIF_COLUMNS["session_gain"] == SESSION_GAIN
    planned = {r["load_level"]: r for r in whatif_rows(run).iter_rows(named=True)}
    assert sorted(planned) == [1.0, 2.0]
    for level, row in planned.items():
        at = run.filter(pl.col("load_level") == level)
        [replayed] = session_speedup(at)["speedup"].to_list()
        assert row["session_gain"] == pytest.approx(replayed, rel=1e-12)
        assert row["ttft_sum_gain"] > row["session_gain"] * 1.05 > 1.05, row


def test_routers_are_modeled_and_gateways_refused(tmp_path: Path) -> None:
    sc = smoke('placement.policies=["router:round_robin", "router:consistent_hash"]')
    run = load_run(virtual_replay(sc, tmp_path))
    moved = (
        run.ok.filter(pl.col("turn") > 1).group_by("placement").agg(pl.col("cross_replica").mean())
    )
    share = dict(moved.iter_rows())
    assert share["router:round_robin"] == 1.0  # one session at a time: every turn moves
    assert share["router:consistent_hash"] == 0.0
    assert set(run.ok["replica_source"].unique()) == {"planner"}
    with pytest.raises(ScenarioError, match="gateway"):
        gateway = smoke('placement.policies=["gateway"]', "target.gateway=http://x")
        virtual_replay(gateway, tmp_path)
    with pytest.raises(ScenarioError, match="kv_aware"):
        virtual_replay(smoke('placement.policies=["router:kv_aware"]'), tmp_path)


def test_vary_values_split_outside_brackets() -> None:
    assert Vary.parse("target.sim.replicas=2,4").values == ("2", "4")
    assert Vary.parse("load.levels=[1, 2],[4,8]").values == ("[1, 2]", "[4,8]")
    assert Vary.parse('placement.policies="a,b",c').values == ('"a,b"', "c")
    for bad in ("replicas", "=2", "x.=1", "target.sim.replicas="):
        with pytest.raises(UserError):
            Vary.parse(bad)


def test_a_bad_value_stops_the_grid_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"target\.sim\.replicas"):
        configs(SMOKE, ALONE, [Vary("target.sim.replicas", ("2", "0"))])


def test_plan_writes_configs_tables_and_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([
        "plan", str(SMOKE), "--vary", "target.sim.replicas=2,3", "--no-progress",
        "--seeds", "1", "--runs-dir", str(tmp_path), *(a for o in ALONE for a in ("--set", o)),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert "PLANNED" in out and "replicas" in out
    (folder,) = tmp_path.glob("plan-*")
    whatif = pl.read_parquet(folder / "whatif.parquet")
    assert sorted(whatif["target.sim.replicas"].to_list()) == ["2", "3"]
    assert set(WHATIF_COLUMNS) <= set(whatif.columns)
    # with alternate placement over three replicas every later turn is a first visit:
    # the pool serves turn 3 too, so the session gains more than with two replicas
    gain = dict(whatif.select("target.sim.replicas", "session_gain").iter_rows())
    assert gain["3"] > gain["2"] > 1.0
    turns = pl.read_parquet(folder / "turns.parquet")
    assert turns.filter(pl.col("turn") == 2)["pool_gain"].min() > 1.5
    report = (folder / "report" / "report.md").read_text()
    assert "PLANNED" in report and "whatif.png" in report
    configs = sorted(p.name for p in (folder / "configs").iterdir())
    assert configs == ["00-replicas=2", "01-replicas=3"]
    assert load_run(folder / "configs" / configs[0]).meta.target_kind == "plan"


def test_plan_refuses_a_repeated_key(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="each key once"):
        configs(SMOKE, ALONE, [Vary("sessions.count", ("1",)), Vary("sessions.count", ("2",))])
