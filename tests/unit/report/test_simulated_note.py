"""The report's note on which simulator the replicas were: only the embedded pair is the
embedded simulator; a served pair (``sim serve`` endpoints) and a plan say what they were."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sessiongen.report.describe import _simulated_note


def _run(kind: str) -> Any:
    return SimpleNamespace(meta=SimpleNamespace(target_kind=kind), modeled=True, time_scale=0.5)


def test_only_the_embedded_pair_is_called_embedded() -> None:
    assert "embedded simulator" in _simulated_note(_run("sim"))
    for kind in ("endpoints", "endpoint-pairs", "switched"):
        note = _simulated_note(_run(kind))
        assert "were the embedded simulator" not in note, kind
        assert "endpoints said they are simulated replicas" in note, kind
    assert "virtual clock" in _simulated_note(_run("plan"))
