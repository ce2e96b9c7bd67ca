"""A block's progress on the console: turns done, the rate, errors, the running median TTFT.

Replay shows it per block on the simulated or real pair, the planner per block of a
configuration run alone.

On a terminal it is a progress bar (tqdm), and anything logged meanwhile is written
above the bar (``logging_redirect_tqdm``), never into one of its frames. Anywhere else
(CI, ``nohup``, a file) it is plain lines: one when the block starts, one every
``every_s`` seconds while it runs, one when it ends, e.g.::

    [3] alternate cache=on: 12/30 turns, 0.41 turns/s, errors 0, median TTFT 1.18 modeled s

so a 2-minute replay writes a dozen lines, not thousands of carriage-return frames. The
rate is always turns per (wall) second, the mean since the block started.

A block's wall and CPU time, from its progress's start to its close, is its stage
``block DESC`` of :mod:`.stages` (``plan --verbose``; the planner's blocks are timed
here, from outside the engine's modules).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm


from sessiongen.infra.stages import TIMER

#: Seconds between plain progress lines when the console is not a terminal.
LINE_EVERY_S = 15.0
#: Seconds between refreshes of the bar's figures (a median over the block each time).
REFRESH_S = 0.5


class Counted(Protocol):
    """What the progress reads of a request (a :class:`sessiongen.records.format.RequestRecord`
    has it): named here, so that infrastructure knows no record format."""

    @property
    def status(self) -> str: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def loop_lag_flag(self) -> bool | None: ...


BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} turns [{elapsed}<{remaining}{postfix}]"
)


class BlockProgress:
    """One block's progress (a bar on a terminal, lines elsewhere) and its counts.

    ``enabled=False`` shows nothing and still counts. ``unit`` is what the TTFTs are
    shown in ("modeled seconds" or "seconds"): each measured TTFT is divided by
    ``time_scale``. ``stream`` (default stderr) and ``interactive`` (default: whether the
    stream is a terminal) choose the form; ``clock`` is for tests.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        enabled: bool,
        time_scale: float,
        unit: str,
        stream: TextIO | None = None,
        interactive: bool | None = None,
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.errors = 0
        self.lagged = 0
        self.done = 0
        self.total = total
        self.desc = desc
        self._ttft: list[float] = []
        self._scale = time_scale
        self._unit = "modeled s" if unit.startswith("modeled") else "s"
        self._stream = stream or sys.stderr
        self._clock = clock
        self._every_s = every_s
        self._started = clock()
        self._shown_at = self._started
        self._closed = False
        self._timed = (time.perf_counter(), time.process_time())
        self._redirect = contextlib.ExitStack()
        self._bar: tqdm[Any] | None = None
        self._lines = enabled and not (
            _is_terminal(self._stream) if interactive is None else interactive
        )
        if enabled and not self._lines:
            from tqdm import tqdm  # on a terminal only (its import is a plan's 6 ms)
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(
                total=total, desc=desc, file=self._stream, bar_format=BAR_FORMAT, leave=True
            )
            self._redirect.enter_context(logging_redirect_tqdm())
        elif self._lines:
            self._line()

    def update(self, record: Counted) -> None:
        """Count one measured (not warm-up) request and show it where it is due."""
        failed = record.status != "ok"
        self.done += 1
        self.lagged += bool(record.loop_lag_flag)
        if failed:
            self.errors += 1
        elif record.ttft_s is not None:
            self._ttft.append(record.ttft_s)
        if self._bar is not None:
            self._bar.update(1)
            # The figures cost a median over the block: refreshed twice a second at most
            # (a planned day has a million turns), and at the end and on errors.
            now = self._clock()
            if now - self._shown_at > REFRESH_S or self.done == self.total or failed:
                self._shown_at = now
                self._bar.set_postfix_str(self.figures(now))
        elif self._lines:
            now = self._clock()
            if now - self._shown_at >= self._every_s:
                self._line(now)

    def figures(self, now: float | None = None) -> str:
        """``0.41 turns/s, errors 0, median TTFT 1.18 modeled s``: what follows the counts."""
        elapsed = (self._clock() if now is None else now) - self._started
        rate = f"{self.done / elapsed:.3g} turns/s" if elapsed > 0 and self.done else "- turns/s"
        parts = [rate, f"errors {self.errors}"]
        if self.lagged:
            parts.append(f"lag-flagged {self.lagged}")
        if self._ttft:
            med = statistics.median(self._ttft) / self._scale
            parts.append(f"median TTFT {med:.3g} {self._unit}")
        return ", ".join(parts)

    def status(self, now: float | None = None) -> str:
        """The plain line: ``[3] alternate cache=on: 12/30 turns, 0.41 turns/s, ...``."""
        counts = f"{self.desc}: {self.done}/{self.total} turns"
        return f"{counts}, {self.figures(now)}" if self.done else counts

    def _line(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self._shown_at = now
        self._stream.write(self.status(now) + "\n")
        self._stream.flush()

    def close(self) -> None:
        """End the display: the bar's final frame, or the block's last line (idempotent)."""
        if self._closed:
            return
        self._closed = True
        wall, cpu = self._timed
        TIMER.add(
            f"block {self.desc}",
            wall_s=time.perf_counter() - wall,
            cpu_s=time.process_time() - cpu,
        )
        if self._bar is not None:
            self._bar.set_postfix_str(self.figures(), refresh=False)
            self._bar.close()
            self._redirect.close()
        elif self._lines:
            self._line()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object
        return False
