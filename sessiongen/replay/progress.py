"""A block's progress on the console: turns done, errors, the running median TTFT."""

from __future__ import annotations

import statistics
import time
from typing import Any

from tqdm import tqdm

from sessiongen.records.format import RequestRecord


class BlockProgress:
    """One block's progress bar (tqdm) and its counts of measured requests."""

    def __init__(
        self, total: int, desc: str, *, enabled: bool, time_scale: float, simulated: bool
    ) -> None:
        self.errors = 0
        self.lagged = 0
        self._ttft: list[float] = []
        self._scale = time_scale
        self._unit = "modeled s" if simulated else "s"
        self._bar: tqdm[Any] = tqdm(total=total, desc=desc, unit="turn", disable=not enabled)
        self._enabled = enabled
        self._shown_at = 0.0

    def update(self, record: RequestRecord) -> None:
        """Count one measured (not warm-up) request and move the bar."""
        failed = record.status != "ok"
        self.lagged += bool(record.loop_lag_flag)
        if failed:
            self.errors += 1
        elif record.ttft_s is not None:
            self._ttft.append(record.ttft_s)
        bar = self._bar
        bar.update(1)
        if not self._enabled:
            return
        # The postfix costs a median over the block: refresh it twice a second at most
        # (a planned day has a million turns), and at the end and on errors.
        now = time.monotonic()
        if now - self._shown_at > 0.5 or bar.n == bar.total or failed:
            self._shown_at = now
            bar.set_postfix_str(self.postfix())

    def postfix(self) -> str:
        """``errors=N median TTFT=X s``: what the bar shows after the counts."""
        lag = f" lag-flagged={self.lagged}" if self.lagged else ""
        if not self._ttft:
            return f"errors={self.errors}{lag}"
        med = statistics.median(self._ttft) / self._scale
        return f"errors={self.errors}{lag} median TTFT={med:.3f} {self._unit}"

    def close(self) -> None:
        self._bar.close()
