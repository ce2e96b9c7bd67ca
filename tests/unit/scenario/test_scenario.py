"""Scenario loading: shipped files validate, bad input gives one-line errors naming file and key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError
from sessiongen.launch.tinymodel import kv_bytes_per_token
from sessiongen.scenario import schema
from sessiongen.scenario.schema import spec
from sessiongen.scenario.spec import builtin_profiles
from tests.support.paths import ROOT

SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenarios_validate(path: Path) -> None:
    sc = scenario.load(path)
    assert sc.name == path.stem
    assert sc.source == str(path)


def test_shipped_set_is_complete() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"alt32k", "alt128k", "fixed32k", "fixed128k", "xreplica", "smoke"} <= names


def test_context_sizes_match_the_study() -> None:
    alt = scenario.load(ROOT / "scenarios/alt128k.toml")
    assert alt.sessions.initial_context_tokens == (131072,)
    assert alt.sessions.turns == 6
    assert alt.sessions.question_tokens + alt.sessions.answer_tokens == 1055
    assert scenario.load(ROOT / "scenarios/fixed32k.toml").sessions.initial_context_tokens == (
        32768,
    )
    assert scenario.load(ROOT / "scenarios/fixed32k.toml").placement.policies == ("fixed",)


BAD = [
    (
        'name = "x"\n[sessions]\nturns = "six"\n',
        "sessions.turns",
        'integer >= 1 and <= 1000, got "six"',
    ),
    ('name = "x"\n[sessions]\nturns = 0\n', "sessions.turns", "got 0"),
    ('name = "x"\nbogus = 1\n', "bogus", "unknown key"),
    ('name = "x"\n[sessions]\ncountt = 3\n', "sessions.countt", "unknown key"),
    ("seed = 1\n", "name", "missing"),
    ('name = "has space"\n', "name", "no spaces"),
    ('name = "x"\n[model]\napi = "grpc"\n', "model.api", 'one of "chat", "completions"'),
    ('name = "x"\n[model]\ntokenizer = "gpt2"\n', "model.tokenizer", "tokenizer.json"),
    ('name = "x"\n[placement]\npolicies = ["sticky"]\n', "placement.policies", "move-at:K"),
    ('name = "x"\n[placement]\npolicies = []\n', "placement.policies", "a non-empty list"),
    ('name = "x"\n[design]\nblocks = ["on", "maybe"]\n', "design.blocks[1]", '"off", "on"'),
    ('name = "x"\n[design]\ncache = ["off"]\n', "design.blocks", "not in design.cache"),
    ('name = "x"\n[target]\nkind = "endpoints"\n', "target.endpoints", "at least one URL"),
    ('name = "x"\n[target]\nendpoints = ["localhost:80"]\n', "target.endpoints", "http(s)"),
    ('name = "x"\n[target.sim]\ntime_scale = 0\n', "target.sim.time_scale", "> 0"),
    ('name = "x"\n[target.sim]\nwarp = 2\n', "target.sim.warp", "unknown key"),
    (
        'name = "x"\n[sessions]\ninitial_context_tokens = [4096, "8k"]\n',
        "sessions.initial_context_tokens[1]",
        "integer",
    ),
    ('name = "x"\n[driver]\nconcurrency = 1.5\n', "driver.concurrency", "integer"),
    ('name = "x"\nsessions = 3\n', "sessions", "expected a table"),
]


@pytest.mark.parametrize(("text", "key", "fragment"), BAD)
def test_bad_scenarios_name_file_and_key(
    tmp_path: Path, text: str, key: str, fragment: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        scenario.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: "), message
    assert fragment in message


def test_invalid_toml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('name = "x\n')
    with pytest.raises(ScenarioError, match=r"broken\.toml: not valid TOML"):
        scenario.load(path)


def test_overrides_are_type_checked_like_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\n')
    sc = scenario.load(
        path, ["sessions.turns=3", "target.sim.slowdown=1.3", "model.api=completions"]
    )
    assert sc.sessions.turns == 3
    assert sc.target.sim.slowdown == 1.3
    assert sc.model.api == "completions"
    with pytest.raises(ScenarioError, match=r"sessions\.turns: expected an integer"):
        scenario.load(path, ["sessions.turns=six"])
    with pytest.raises(ScenarioError, match=r"expected dotted\.key=value"):
        scenario.load(path, ["sessions.turns"])
    with pytest.raises(ScenarioError, match=r"sessions\.turns\.x.*unknown|not a table"):
        scenario.load(path, ["sessions.turns=3", "sessions.turns.x=1"])


def test_digest_ignores_target_but_not_sessions(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\n')
    base = scenario.load(path)
    assert base.digest() == scenario.load(path, ["target.sim.slowdown=2"]).digest()
    assert base.digest() != scenario.load(path, ["sessions.turns=2"]).digest()


def test_a_profile_file_applies_under_explicit_keys(tmp_path: Path) -> None:
    profile = tmp_path / "fitted.toml"
    profile.write_text("[target.sim]\nprefill_s_per_ktok = 0.5\nslowdown = 2.0\n")
    sc = scenario.load(
        ROOT / "scenarios" / "smoke.toml",
        [f"target.sim.profile={profile}", "target.sim.slowdown=1.5"],
    )
    sim = sc.target.sim
    assert sim.prefill_s_per_ktok == 0.5  # from the file
    assert sim.slowdown == 1.5  # --set wins over the file
    assert sim.profile == str(profile)


def test_a_bad_profile_file_names_itself(tmp_path: Path) -> None:
    profile = tmp_path / "bad.toml"
    profile.write_text("prefill_s_per_ktok = -1\n")
    with pytest.raises(
        ScenarioError, match=r"bad\.toml: prefill_s_per_ktok: expected a number >= 0"
    ):
        scenario.load(ROOT / "scenarios" / "smoke.toml", [f"target.sim.profile={profile}"])
    with pytest.raises(ScenarioError, match=r"none\.toml: no such file"):
        scenario.load(ROOT / "scenarios" / "smoke.toml", ["target.sim.profile=none.toml"])


def test_the_shipped_study_profile_is_the_built_in_default() -> None:
    """builtin:study holds exactly the defaults it documents (no drift between them)."""
    smoke = ROOT / "scenarios" / "smoke.toml"
    plain = scenario.load(smoke).target.sim
    study = scenario.load(smoke, ["target.sim.profile=builtin:study"]).target.sim
    assert dataclasses.replace(study, profile=None) == plain
    assert "study" in builtin_profiles()
    with pytest.raises(ScenarioError, match=r"builtin:nope: no such profile \(builtin:"):
        scenario.load(smoke, ["target.sim.profile=builtin:nope"])


def test_the_shipped_cpu_profile_describes_the_pair_its_probe_starts() -> None:
    """builtin:cpu-tiny was fitted on the pair scenarios/fitprobe.toml starts: its
    structure must be that pair's (vLLM's 128-token CPU block, the KV cache
    VLLM_CPU_KVCACHE_SPACE holds of builtin:tiny, LMCache's chunk and pool), so that a
    change to either shows up here rather than as a quietly wrong plan."""
    probe = scenario.load(ROOT / "scenarios" / "fitprobe.toml")
    pair = probe.target.managed
    cpu = scenario.load(ROOT / "scenarios" / "smoke.toml", ["target.sim.profile=builtin:cpu-tiny"])
    sim = cpu.target.sim
    assert "cpu-tiny" in builtin_profiles()
    assert sim.replicas == pair.replicas
    assert sim.local_block_tokens == 128
    assert sim.kv_bytes_per_token == kv_bytes_per_token()
    space_gib = float(pair.env["VLLM_CPU_KVCACHE_SPACE"])
    assert sim.local_cache_tokens == int(space_gib * (1 << 30)) // kv_bytes_per_token()
    assert (sim.pool_chunk_tokens, sim.pool_capacity_gib) == (pair.chunk_size, pair.pool_size_gb)
    assert sim.max_model_len == pair.max_model_len
    assert (sim.max_num_batched_tokens, sim.max_num_seqs) == (2048, 128)  # vLLM 0.32 on CPU


@dataclass(frozen=True)
class _Pair:
    points: tuple[int, ...] = spec((1, 2), at_least=2, any_order="test")


def test_a_list_field_can_ask_for_more_than_one_entry() -> None:
    assert schema.build(_Pair, {"points": [3, 1]}, "p.toml").points == (3, 1)
    with pytest.raises(ScenarioError, match=r"^p\.toml: points: expected at least 2 entries"):
        schema.build(_Pair, {"points": [1]}, "p.toml")
    with pytest.raises(TypeError, match="empty or at_least"):
        spec((), empty="none", at_least=2)


#: Shipped scenarios below the analysis' minimum session count, and why that is right.
SMALL_ON_PURPOSE = {
    "smoke": "two tiny sessions, for tests and for trying a target",
    "smoke-cpu": "the smoke scenario on the real CPU pair, for tests",
    "xreplica": "the study's probe chains, one table row per size; nightly sets 5",
    "fitprobe": "chains for sessiongen fit, which resamples sessions within each size",
}


def test_shipped_scenarios_meet_the_tools_own_minimum() -> None:
    # The quick start's report opened with "Limits of this run: only 4 sessions per arm".
    from sessiongen.analysis.stats import MIN_SESSIONS
    from sessiongen.trend import nightly

    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        if path.stem in SMALL_ON_PURPOSE:
            continue
        assert scenario.load(path).sessions.count >= MIN_SESSIONS, path.name
    suite = nightly.load_suite(ROOT / "nightly" / "example.toml")
    for scen in suite.scenarios:
        assert scen.sessions.count >= MIN_SESSIONS, scen.name
