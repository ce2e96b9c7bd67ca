"""The block script on a fake clock: what both drivers (replay's loop, the planner's heap)
step through. A fake driver serves every request in a fixed time per turn, in time order."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import pytest

from sessiongen.design.arrivals import START_STAGGER_S
from sessiongen.experiment.facts import Placed
from sessiongen.experiment.script import BlockScript, Send
from sessiongen.experiment.warmups import warmup_tokens, warmups


@dataclass(frozen=True)
class FakeSession:
    index: int
    think: tuple[float, ...]  # pause before each turn (turn 1's first)
    home: int | None = None

    @property
    def turns(self) -> int:
        return len(self.think)

    def pauses(self) -> list[float]:
        return list(self.think)

    def home_key(self, turn: int) -> int:
        return self.index if self.home is None else self.home


@dataclass
class Served:
    send: Send
    start: float
    end: float
    replica: int | None
    placed: Placed


@dataclass
class FakeDriver:
    """Serves each request in ``took`` seconds; ``fail`` names (session, turn) that fail;
    ``unknown`` names turns whose replica the driver cannot tell."""

    script: BlockScript
    took: float = 1.0
    fail: set[tuple[int, int]] = field(default_factory=set)
    unknown: set[tuple[int, int]] = field(default_factory=set)
    served: list[Served] = field(default_factory=list)

    def run(self, t0: float = 0.0) -> list[Served]:
        script = self.script
        script.started(t0)
        due: list[tuple[float, int, Send]] = []
        seq = 0
        while True:
            start = script.next_start()
            if start is not None and (not due or start <= due[0][0]):
                send = script.start_next()
                if send is not None:
                    heapq.heappush(due, (send.at, seq, send))
                    seq += 1
                continue
            if not due:
                return self.served
            at, _, send = heapq.heappop(due)
            key = (send.session, send.turn)
            replica = None if key in self.unknown else (send.replica or 0)
            end = at + self.took
            placed, follow = script.finished(
                send, replica=replica, ok=key not in self.fail, end_t=end
            )
            self.served.append(Served(send, at, end, replica, placed))
            if follow is not None:
                heapq.heappush(due, (follow.at, seq, follow))
                seq += 1


def script(
    sessions: list[FakeSession],
    *,
    concurrency: int,
    offsets: list[float] | None = None,
    placement: str = "alternate",
    routed: bool = False,
) -> BlockScript:
    return BlockScript(
        sessions,
        offsets=offsets,
        concurrency=concurrency,
        placement=placement,
        routed=routed,
        replicas=2,
        seed=5,
        block=3,
    )


def by_turn(served: list[Served]) -> dict[tuple[int, int], Served]:
    return {(s.send.session, s.send.turn): s for s in served}


def test_a_closed_loop_queues_sessions_behind_its_slots() -> None:
    sessions = [FakeSession(i, (0.0, 2.0, 3.0)) for i in range(3)]
    served = by_turn(FakeDriver(script(sessions, concurrency=2)).run(10.0))
    assert len(served) == 9
    # sessions 0 and 1 start a stagger apart; each later turn its pause after the answer
    assert served[0, 1].start == 10.0
    assert served[1, 1].start == 10.0 + START_STAGGER_S
    assert served[0, 2].start == served[0, 1].end + 2.0
    assert served[0, 3].start == served[0, 2].end + 3.0
    # session 2 waits for session 0's slot: its queue time is the wait
    assert served[2, 1].start == served[0, 3].end
    assert served[2, 1].placed.queue_s == served[0, 3].end - (10.0 + 2 * START_STAGGER_S)
    assert served[2, 2].placed.queue_s == 0.0
    assert served[0, 1].placed.queue_s == 0.0
    assert served[1, 2].placed.think_s == 2.0
    assert all(s.placed.arrival_s is None for s in served.values())


def test_an_open_loop_starts_sessions_on_their_schedule_up_to_its_cap() -> None:
    sessions = [FakeSession(i, (0.0, 0.5)) for i in range(3)]
    offsets = [0.0, 0.2, 5.0]
    served = by_turn(FakeDriver(script(sessions, concurrency=1, offsets=offsets)).run())
    assert served[0, 1].start == 0.0
    # session 1 is due at 0.2 but the one slot is session 0's until 2.5
    assert served[1, 1].start == served[0, 2].end == 2.5
    assert served[1, 1].placed.queue_s == pytest.approx(2.3)
    assert served[1, 1].placed.arrival_s == 0.2
    # session 2 is due after the slot freed: no wait
    assert served[2, 1].start == 5.0
    assert served[2, 1].placed.queue_s == 0.0


def test_a_failed_turn_ends_its_session_and_frees_its_slot() -> None:
    sessions = [FakeSession(i, (0.0, 1.0, 1.0)) for i in range(2)]
    driver = FakeDriver(script(sessions, concurrency=1), fail={(0, 2)})
    served = by_turn(driver.run())
    assert (0, 3) not in served
    assert served[1, 1].start == served[0, 2].end
    assert {k for k in served if k[0] == 1} == {(1, 1), (1, 2), (1, 3)}


def test_turns_go_where_the_placement_says_and_moves_are_marked() -> None:
    sessions = [FakeSession(0, (0.0, 0.0, 0.0)), FakeSession(1, (0.0, 0.0), home=4)]
    driver = FakeDriver(script(sessions, concurrency=2), unknown={(0, 3)})
    served = by_turn(driver.run())
    # alternate: turn k on (k - 1 + home) mod 2; session 1's placement keys on its home key
    assert [served[0, k].send.replica for k in (1, 2, 3)] == [0, 1, 0]
    assert [served[1, k].send.replica for k in (1, 2)] == [0, 1]
    assert served[0, 1].placed.cross_replica is False
    assert served[0, 2].placed.cross_replica is True
    assert served[0, 3].placed.cross_replica is None  # the replica is unknown
    fixed = by_turn(FakeDriver(script(sessions, concurrency=2, placement="fixed")).run())
    assert all(s.placed.cross_replica is False for s in fixed.values())


def test_a_routed_block_leaves_the_replica_to_its_router_and_keys_each_turn() -> None:
    sessions = [FakeSession(7, (0.0, 1.0))]
    served = FakeDriver(script(sessions, concurrency=1, routed=True)).run()
    assert [s.send.replica for s in served] == [None, None]
    assert [s.send.noise_key for s in served] == ["5/3/7/1", "5/3/7/2"]


def test_warmups_visit_each_replica_then_the_next_and_the_router() -> None:
    plain = warmups(block=2, replicas=2, rounds=1, routed=False)
    assert [(w.key, w.replica, w.hop) for w in plain] == [
        ("b2-r0-0", 0, 0), ("b2-r0-0", 1, 1), ("b2-r1-0", 1, 0), ("b2-r1-0", 0, 1),
    ]  # fmt: skip
    routed = warmups(block=0, replicas=2, rounds=2, routed=True)
    assert [w.key for w in routed if w.replica is None] == [f"b0-gw-{i}" for i in range(4)]
    assert [(w.replica, w.hop) for w in warmups(block=0, replicas=1, rounds=1, routed=False)] == [
        (0, 0)
    ]
    assert warmup_tokens(None, 512) == 1024
    assert warmup_tokens(None, None) == 512
    assert warmup_tokens(300, 512) == 300
