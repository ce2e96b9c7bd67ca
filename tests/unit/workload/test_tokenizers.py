"""Sessions stay token-exact under other tokenizers: a tokenizer.json and a server's /tokenize."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import start_sim
from sessiongen.text import probes
from sessiongen.text.tokenize import HFTokenizer, ServerTokenizer
from sessiongen.workload import sessions, textgen


@functools.cache
def _trained_tokenizer_json(folder: str) -> Path:
    """A byte-level BPE trained on our own prose: a real tokenizer that is not cl100k."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    gen = textgen.default_generator()
    rng = np.random.default_rng(0)
    corpus = [gen.prose(rng, 400) for _ in range(60)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1200, show_progress=False))
    path = Path(folder) / "tokenizer.json"
    tok.save(str(path))
    return path


def _scenario(tokenizer: str, **sessions_kw: object) -> scenario.Scenario:
    raw = {
        "name": "tok",
        "model": {"tokenizer": tokenizer},
        "sessions": {"count": 2, "turns": 3, "initial_context_tokens": 1500, **sessions_kw},
    }
    return scenario.from_dict(raw, "tok.toml")


@pytest.mark.parametrize("probe", ["none", "needle"])
def test_hf_tokenizer_json_is_exact(tmp_path_factory: pytest.TempPathFactory, probe: str) -> None:
    path = _trained_tokenizer_json(str(tmp_path_factory.mktemp("tok")))
    tok = HFTokenizer(path)
    sc = _scenario(str(path), probe=probe, question_tokens=40, answer_tokens=70)
    builder = sessions.SessionBuilder(sc, "salt")
    assert builder.identity()["tokenizer"].startswith("hf:tokenizer.json:")
    for session in builder.sessions():
        for req in session.requests():
            counted = sum(len(tok.encode(content)) for _role, content in req.messages)
            assert counted == req.content_tokens
            if probe == "needle":
                text = "".join(c for _r, c in req.messages)
                assert probes.answer_needle(text) == req.expected


def test_server_tokenizer_counts_with_the_served_model() -> None:
    with start_sim(SimProfile(time_scale=0.01), "sim-27b", True) as sim:
        gen = textgen.generator_for("server", server_url=sim.urls[0], model="sim-27b")
        sc = _scenario("server", count=1, turns=2)
        (session,) = sessions.SessionBuilder(sc, "salt", gen).sessions()
        server = ServerTokenizer(sim.urls[0], "sim-27b")
        for req in session.requests():
            counted = sum(len(server.encode(content)) for _role, content in req.messages)
            assert counted == req.content_tokens


def test_server_tokenizer_needs_an_endpoint() -> None:
    with pytest.raises(ScenarioError, match="endpoint"):
        textgen.generator_for("server")


def test_missing_tokenizer_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="tokenizer file not found"):
        textgen.generator_for(str(tmp_path / "nope.json"))
