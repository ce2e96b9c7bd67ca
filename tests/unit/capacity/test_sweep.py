"""A plan's configurations spread over processes or Ray give the tables one process gives.

Ray starts once for this module (10-20 s on a busy machine), only for the tests that
need it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from sessiongen.analysis.whatif import Vary
from sessiongen.capacity.plan import plan
from sessiongen.capacity.sweep import SweepOptions, run_all
from sessiongen.cli import main
from sessiongen.errors import MissingDependencyError, UserError
from tests.support import sweeptasks
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"
ALONE = ("driver.concurrency=1", 'design.blocks=["off", "on"]')
GRID = (Vary("target.sim.replicas", ("2", "3")), Vary("sessions.turns", ("2", "3")))

HAS_RAY = importlib.util.find_spec("ray") is not None


def tables(out: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(out / "whatif.parquet"), pl.read_parquet(out / "turns.parquet")


def planned(tmp: Path, sweep: SweepOptions) -> tuple[pl.DataFrame, pl.DataFrame]:
    seen: list[int] = []
    out = plan(
        SMOKE,
        overrides=ALONE,
        varies=GRID,
        runs_dir=tmp,
        sweep=sweep,
        on_config=lambda c, _d: seen.append(c.index),
        seeds=2,
        sensitivity=False,
    )
    assert sorted(seen) == [0, 0, 1, 1, 2, 2, 3, 3]  # a line per configuration and seed
    folders = sorted(p.name for p in (out / "configs").iterdir())
    assert folders == ["00-replicas=2_turns=2", "00-replicas=2_turns=2.r1",
                       "01-replicas=2_turns=3", "01-replicas=2_turns=3.r1",
                       "02-replicas=3_turns=2", "02-replicas=3_turns=2.r1",
                       "03-replicas=3_turns=3", "03-replicas=3_turns=3.r1"]  # fmt: skip
    return tables(out)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.DataFrame, pl.DataFrame]:
    return planned(tmp_path_factory.mktemp("jobs1"), SweepOptions(jobs=1))


def test_results_come_back_in_the_items_order() -> None:
    done: list[int] = []
    got = run_all(
        sweeptasks.square_first_last, [0, 1, 2], SweepOptions(jobs=3), lambda i, _r: done.append(i)
    )
    assert got == [0, 1, 4]
    assert sorted(done) == [0, 1, 2]


def test_a_workers_user_error_is_one_line_here() -> None:
    with pytest.raises(UserError, match=r"grid\.toml: sessions\.count: expected >= 1, got [01]"):
        run_all(sweeptasks.refuse, [0, 1], SweepOptions(jobs=2))


def test_an_error_stops_the_tasks_still_running(tmp_path: Path) -> None:
    """One configuration's error does not wait for the others to end (a day's takes
    minutes): the long task is stopped, never reaching its end."""
    items = [("long", str(tmp_path)), ("fail", str(tmp_path))]
    with pytest.raises(UserError, match=r"sessions\.count"):
        run_all(sweeptasks.long_or_failing, items, SweepOptions(jobs=2))
    assert (tmp_path / "started").exists()
    assert not (tmp_path / "ended").exists()


def test_two_jobs_plan_the_tables_one_job_plans(
    tmp_path: Path, sequential: tuple[pl.DataFrame, pl.DataFrame]
) -> None:
    whatif, turns = planned(tmp_path, SweepOptions(jobs=2))
    assert whatif["config"].to_list() == [0, 1, 2, 3]  # grid order
    assert whatif.equals(sequential[0])
    assert turns.equals(sequential[1])


def test_without_ray_the_ray_executor_is_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(MissingDependencyError):
        SweepOptions(executor="ray").check()
    with pytest.raises(SystemExit) as stop:
        main(["plan", str(SMOKE), "--executor", "ray", "--no-sensitivity", "--runs-dir",
              str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.strip().count("\n") == 0 and "sessiongen[ray]" in err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_an_address_without_ray_is_refused() -> None:
    with pytest.raises(UserError, match="--executor ray"):
        SweepOptions(address="auto").check()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'sessiongen[ray]')")
def test_ray_plans_the_tables_one_process_plans(
    tmp_path: Path, sequential: tuple[pl.DataFrame, pl.DataFrame], local_ray: None
) -> None:
    whatif, turns = planned(tmp_path, SweepOptions(executor="ray"))
    assert whatif.equals(sequential[0])
    assert turns.equals(sequential[1])
