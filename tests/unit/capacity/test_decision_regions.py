"""``--find``'s bisection reports every region it saw: fake verdict
functions, no planning."""

from __future__ import annotations

from sessiongen.capacity.decision import Bracket, Region, bisect


def _three(x: float) -> str:
    """Does not pay below 2, pays from 2 to 6, unstable from 6 (the reported example)."""
    if x < 2:
        return "does not pay"
    return "pays" if x < 6 else "unstable (OFF queue grows)"


def test_every_region_is_reported_in_order_with_the_values_that_paid() -> None:
    b = bisect(_three, 1, 8, integer=True)
    assert b.regions == (
        Region("does not pay", 1, 1),
        Region("pays", 2, 5),
        Region("unstable (OFF queue grows)", 6, 8),
    )
    text = b.text("replicas")
    assert text.startswith(
        "does not pay at replicas=1; pays at replicas=2..5; "
        "unstable (OFF queue grows) at replicas=6..8"
    )
    assert b.monotone and b.interior_checked and "NOT MONOTONE" not in text
    assert (b.below, b.above) == (1, 6)


def test_a_float_key_brackets_both_edges_of_the_middle_region() -> None:
    b = bisect(_three, 0.5, 16.0, steps=8)
    does_not, pays, unstable = b.regions
    assert does_not.high < 2 <= pays.low and pays.high < 6 <= unstable.low
    assert 2 - does_not.high < 0.1 and 6 - pays.high < 0.1
    # every planned value is written with at most four significant digits
    assert all(len(f"{x:.12g}".replace(".", "").lstrip("0")) <= 4 for x, _v in b.points)


def test_the_interior_is_planned_even_where_both_ends_agree() -> None:
    """Pays at both ends, does not pay in a hole between: the interior grid (16) finds the
    hole, the bisection brackets both its edges, and the sequence is flagged."""
    calls: list[float] = []

    def hole(x: float) -> str:
        calls.append(x)
        return "does not pay" if 10 <= x <= 40 else "pays"

    b = bisect(hole, 1, 256, integer=True)
    assert calls[:5] == [1, 256, 4, 16, 64]  # ends, then the geometric interior
    assert not b.flips and [r.verdict for r in b.regions] == ["pays", "does not pay", "pays"]
    assert b.regions[1] == Region("does not pay", 10, 40)
    assert not b.monotone
    assert "NOT MONOTONE: does not pay at gib=40 but pays at gib=41" in b.text("gib")


def test_interior_not_checked_when_the_steps_run_out() -> None:
    b = bisect(lambda x: "pays", 1.0, 10.0, steps=1)
    assert not b.interior_checked and (b.interior, b.wanted) == (1, 3)
    assert "interior not checked (1 of 3 interior values planned" in b.text("x")
    none = bisect(lambda x: "pays", 1.0, 10.0, steps=0)
    assert len(none.points) == 2 and "interior not checked (0 of 3" in none.text("x")
    # an integer range with one value inside wants only that one
    small = bisect(lambda x: "pays", 1, 3, integer=True)
    assert small.interior_checked and (small.interior, small.wanted) == (1, 1)


def test_a_step_back_on_the_verdict_scale_is_not_monotone() -> None:
    """An arm that misses at one value but is undecided at a larger one (the reported
    0.0176 and 0.02) is flagged, though no verdict comes back."""

    def arm(x: float) -> str:
        if x < 0.015:
            return "meets"
        return "misses" if x < 0.019 else "undecided"

    b = bisect(arm, 0.01, 0.03)
    assert [r.verdict for r in b.regions] == ["meets", "misses", "undecided"]
    assert not b.monotone
    assert "NOT MONOTONE: misses at load=" in b.text("load")
    fine = bisect(lambda x: "meets" if x < 0.02 else "undecided" if x < 0.025 else "misses",
                  0.01, 0.03)  # fmt: skip
    assert fine.monotone


def test_the_point_estimate_crossing_stands_beside_the_intervals_edges() -> None:
    """A gain x / 10 whose interval (+-0.3) decides only far from 1.1: the verdicts'
    edges are wide apart, the point estimate crosses 1.1 at 11 exactly (interpolated)."""

    def gain(x: float) -> float:
        return x / 10

    def verdict_at(x: float) -> str:
        g = gain(x)
        return "pays" if g - 0.3 >= 1.1 else "does not pay" if g + 0.3 < 1.1 else "undecided"

    b = bisect(verdict_at, 2, 32, integer=True, estimate_at=gain, threshold=1.1)
    assert b.crossings == (11.0,) or abs(b.crossings[0] - 11) < 0.2  # log-interpolated
    assert b.below < 8 and b.above > 14
    text = b.text("replicas")
    assert "point estimate crosses 1.1 at replicas=~11" in text
    assert "move with --seeds" in text


def test_a_geometric_crossing_interpolates_on_the_log_scale() -> None:
    b = Bracket("does not pay", "pays", 1, 100, None, ((1, "does not pay"), (100, "pays")))
    assert b.regions == (Region("does not pay", 1, 1), Region("pays", 100, 100))
    out = bisect(
        lambda x: "pays" if x >= 10 else "does not pay", 1.0, 100.0, steps=0,
        estimate_at=lambda x: 1.0 if x < 10 else 2.0, threshold=1.5,
    )  # fmt: skip
    (crossing,) = out.crossings
    assert 1 < crossing < 100  # between the two planned values, geometric midpoint: 10
    assert abs(crossing - 10) < 1e-9
