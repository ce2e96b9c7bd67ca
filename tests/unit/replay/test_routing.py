"""Which replica served a routed turn: from the response, the counters, or unknown."""

from __future__ import annotations

import pytest

from sessiongen.client.counters import LOCAL_QUERIES
from sessiongen.client.result import Result
from sessiongen.replay import routing
from sessiongen.targets.base import ServedBy

SIM = ServedBy(header="x-sim-replica", names=("0", "1"))
VLLM = ServedBy(fingerprint=True, names=("sessiongen-replica-0", "sessiongen-replica-1"))


def result(headers: dict[str, str] | None = None, fingerprint: str | None = None) -> Result:
    res = Result(headers=headers or {})
    if fingerprint is not None:
        res.usage_chunk = {"usage": {}, "system_fingerprint": fingerprint}
    return res


def test_a_header_names_the_replica() -> None:
    assert routing.from_response(result({"x-sim-replica": "1"}), SIM) == (1, "header")
    assert routing.from_response(result({"x-sim-replica": " 0 "}), SIM) == (0, "header")
    # A value that is no replica's name names nobody; a missing header says nothing.
    assert routing.from_response(result({"x-sim-replica": "7"}), SIM) == (None, "header")
    assert routing.from_response(result(), SIM) == (None, None)
    # Headers are matched case-insensitively (the client lowercases their names).
    upper = ServedBy(header="X-Served-By", names=("a", "b"))
    assert routing.from_response(result({"x-served-by": "b"}), upper) == (1, "header")


def test_a_fingerprint_names_the_replica() -> None:
    assert routing.from_response(result(fingerprint="sessiongen-replica-1"), VLLM) == (
        1,
        "fingerprint",
    )
    # vLLM's default fingerprint is the same on every replica: it names none of them.
    default = result(fingerprint="vllm-0.32.0-1a2b3c4d")
    assert routing.from_response(default, VLLM) == (None, "fingerprint")
    assert routing.from_response(result(fingerprint="sessiongen-replica-1"), SIM) == (None, None)


def test_without_names_only_an_index_names_a_replica() -> None:
    assert routing.named_replica("3", ()) == 3
    assert routing.named_replica("replica-3", ()) is None
    assert routing.named_replica("-1", ()) is None


def snap(queries: float) -> dict[str, float]:
    return {LOCAL_QUERIES: queries}


def test_counters_tell_only_when_exactly_one_replica_moved() -> None:
    before = [snap(100), snap(50)]
    assert routing.from_counters(before, [snap(100), snap(2050)]) == 1
    assert routing.from_counters(before, [snap(900), snap(50)]) == 0
    assert routing.from_counters(before, [snap(100), snap(50)]) is None  # nobody prefilled
    assert routing.from_counters(before, [snap(200), snap(60)]) is None  # both did
    assert routing.from_counters(before, [snap(100), None]) is None  # one unreadable
    assert routing.from_counters([snap(1), {}], [snap(9), {}]) is None  # counter missing


@pytest.mark.parametrize(
    ("response", "counted", "expected"),
    [
        ((1, "header"), 1, (1, "header+counters")),
        ((1, "fingerprint"), None, (1, "fingerprint")),
        ((None, None), 0, (0, "counters")),
        ((None, "header"), 1, (1, "counters")),
        ((0, "header"), 1, (None, "conflict")),
        ((None, None), None, (None, "unknown")),
    ],
)
def test_resolve_never_guesses(
    response: tuple[int | None, str | None], counted: int | None, expected: tuple[int | None, str]
) -> None:
    assert routing.resolve(response, counted) == expected


def test_cross_replica_is_unknown_when_either_replica_is() -> None:
    assert routing.moved(1, None, None) is False  # a first turn moves nowhere
    assert routing.moved(2, 0, 1) is True
    assert routing.moved(2, 1, 1) is False
    assert routing.moved(3, None, 1) is None
    assert routing.moved(3, 0, None) is None
