"""A block's sessions as a script that a driver steps through, whatever its clock.

The script owns the experiment's rules; the driver owns time and the wire:

- **starts**: after :meth:`BlockScript.started` (the warm-ups are done at ``t``), session
  ``i`` is ready at ``t`` plus its scheduled offset (open loop, a trace's timestamps), or
  ``i`` :data:`~sessiongen.design.arrivals.START_STAGGER_S` apart (closed loop), ties in
  the sessions' order; the driver calls :meth:`BlockScript.start_next` when the next one
  is due (:meth:`BlockScript.next_start`);
- **slots**: a ready session takes one of the block's slots
  (:func:`~sessiongen.design.load.concurrency`), or waits in order for one; its first
  turn's queue time is the wait;
- **turns**: each later turn is due its think time (:meth:`Session.pauses
  <sessiongen.workload.sessions.Session.pauses>`) after the previous turn's end; a failed
  turn ends its session (later prompts would build on a missing answer), which frees its
  slot at the failure's time;
- **where**: a client placement's replica (:func:`~sessiongen.design.placement.replica_for`),
  or the block's router (``replica`` None); the driver says which replica served it and
  the script marks cross-replica turns (unknown when either replica is).

Every due request leaves as a :class:`Send`; the driver reports its end with
:meth:`BlockScript.finished`, which says how the turn was placed (:class:`~.facts.Placed`)
and what is due next. Times are modeled seconds on the driver's clock.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from sessiongen.design.arrivals import START_STAGGER_S
from sessiongen.design.placement import replica_for
from sessiongen.experiment.facts import Placed


class Scripted(Protocol):
    """What the script needs of a session (:class:`sessiongen.workload.sessions.Session`)."""

    @property
    def index(self) -> int: ...
    @property
    def turns(self) -> int: ...
    def pauses(self) -> list[float]: ...
    def home_key(self, turn: int) -> int: ...


class Send(NamedTuple):
    """A request that is due: turn ``turn`` of the script's session ``session`` (its
    position in the script's list) at ``at``, to ``replica`` (None: the block's router
    picks), with ``noise_key`` naming it for the simulator's service-time noise."""

    session: int
    turn: int
    at: float
    replica: int | None
    noise_key: str


def turn_key(seed: int, block: int, session_index: int, turn: int) -> str:
    """The identity of one session turn, ``seed/block/session/turn``: the same in every
    run of the scenario, whatever the order of arrivals."""
    return f"{seed}/{block}/{session_index}/{turn}"


@dataclass(slots=True)
class _Live:
    """A session between its start and its last turn."""

    ready: float
    offset_s: float | None
    think: list[float]
    queue_s: float = 0.0
    previous: int | None = None


@dataclass
class BlockScript:
    """One block's sessions (module doc): events in, sends out."""

    sessions: Sequence[Scripted]
    offsets: Sequence[float] | None  # scheduled starts by session index (None: closed loop)
    concurrency: int
    placement: str
    routed: bool  # a router picks each turn's replica
    replicas: int
    seed: int
    block: int
    _starts: list[tuple[float, int]] = field(default_factory=list, init=False)
    _live: dict[int, _Live] = field(default_factory=dict, init=False)
    _waiting: collections.deque[int] = field(default_factory=collections.deque, init=False)
    _slots: int = field(default=0, init=False)

    def started(self, t: float) -> None:
        """The block's sessions begin at ``t``: every session's start, latest first."""
        offsets = self.offsets
        starts = [
            (t + (i * START_STAGGER_S if offsets is None else offsets[s.index]), i)
            for i, s in enumerate(self.sessions)
        ]
        starts.sort(reverse=True)
        self._starts = starts
        self._slots = self.concurrency

    def next_start(self) -> float | None:
        """When the next session is ready (None: every session has started)."""
        return self._starts[-1][0] if self._starts else None

    def start_next(self) -> Send | None:
        """The next session is ready: its first turn if a slot is free, else it waits."""
        ready, i = self._starts.pop()
        session = self.sessions[i]
        offset = None if self.offsets is None else self.offsets[session.index]
        self._live[i] = _Live(ready, offset, session.pauses())
        if self._slots > 0:
            self._slots -= 1
            return self._begin(i, ready)
        self._waiting.append(i)
        return None

    def finished(
        self, send: Send, *, replica: int | None, ok: bool, end_t: float
    ) -> tuple[Placed, Send | None]:
        """``send`` ended at ``end_t`` on ``replica`` (None: unknown): how the turn was
        placed, and the request due next (the session's next turn, or a waiting
        session's first when this one is over), if any."""
        live = self._live[send.session]
        k = send.turn
        first = k == 1
        if first:
            cross: bool | None = False
        elif live.previous is None or replica is None:
            cross = None
        else:
            cross = live.previous != replica
        placed = Placed(
            cross_replica=cross,
            queue_s=live.queue_s if first else 0.0,
            arrival_s=live.offset_s,
            think_s=live.think[k - 1],
        )
        live.previous = replica
        if ok and k < len(live.think):
            return placed, self._send(send.session, k + 1, end_t + live.think[k])
        del self._live[send.session]
        if self._waiting:
            return placed, self._begin(self._waiting.popleft(), end_t)
        self._slots += 1
        return placed, None

    def _begin(self, i: int, now: float) -> Send:
        live = self._live[i]
        at = max(live.ready, now)
        live.queue_s = at - live.ready
        return self._send(i, 1, at)

    def _send(self, i: int, turn: int, at: float) -> Send:
        session = self.sessions[i]
        replica = None
        if not self.routed:
            home = session.home_key(turn)
            replica = replica_for(self.placement, home, turn, self.replicas, self.seed)
        key = turn_key(self.seed, self.block, session.index, turn)
        return Send(session=i, turn=turn, at=at, replica=replica, noise_key=key)
