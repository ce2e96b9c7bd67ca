"""A block's console progress: plain bounded lines off a terminal, one rate unit, and
logged warnings on their own lines above a terminal's bar, never inside a frame."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from sessiongen.infra.progress import BlockProgress
from sessiongen.records.format import RequestRecord


def record(ttft_s: float = 0.5, status: str = "ok") -> RequestRecord:
    return RequestRecord(
        run_id="r",
        block=0,
        block_in_placement=0,
        placement="alternate",
        cache="on",
        context_tokens=100,
        turn=1,
        warmup=False,
        status=status,
        ttft_s=ttft_s,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


LINE = re.compile(
    r"\[3\] alternate cache=on: \d+/600 turns(, [\d.e+-]+ turns/s, errors \d+"
    r"(, median TTFT [\d.e+-]+ modeled s)?)?"
)


@pytest.mark.parametrize("spacing_s", [0.2, 5.0])  # 5 turns/s and 0.2 turns/s
def test_off_a_terminal_progress_is_a_few_plain_lines_in_turns_per_second(
    spacing_s: float,
) -> None:
    out, clock = io.StringIO(), Clock()
    progress = BlockProgress(
        600,
        "[3] alternate cache=on",
        enabled=True,
        time_scale=0.05,
        unit="modeled seconds",
        stream=out,
        every_s=15.0,
        clock=clock,
    )
    for i in range(600):
        clock.now += spacing_s
        progress.update(record(status="timeout" if i == 7 else "ok"))
    progress.close()
    progress.close()  # idempotent: no second last line
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    span_s = 600 * spacing_s
    assert 3 <= len(lines) <= 2 + span_s / 15.0  # start, one per 15 s, end
    assert all(LINE.fullmatch(line) for line in lines), lines
    rate = 1 / spacing_s
    assert lines[-1] == (
        f"[3] alternate cache=on: 600/600 turns, {rate:.3g} turns/s, errors 1, "
        "median TTFT 10 modeled s"  # 0.5 wall s at time scale 0.05
    )


def test_disabled_progress_shows_nothing_and_still_counts() -> None:
    out = io.StringIO()
    progress = BlockProgress(
        2, "[1] fixed cache=off", enabled=False, time_scale=1.0, unit="seconds", stream=out
    )
    progress.update(record())
    progress.update(record(status="http_error"))
    progress.close()
    assert out.getvalue() == "" and progress.errors == 1 and progress.done == 2


def test_on_a_terminal_warnings_are_written_above_the_bar_not_into_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    handler = logging.StreamHandler()  # the console handler a program would have
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    progress = BlockProgress(50, "[1] fixed cache=on", enabled=True, time_scale=1.0, unit="seconds")
    for i in range(50):
        progress.update(record())
        if i in (10, 30):
            logging.getLogger("sessiongen.test").warning("replica 1 is short of CPU")
    progress.close()
    assert root.handlers == [handler]  # the redirection ends with the block
    text = tty.getvalue()
    assert "turns [" in text and "turns/s" in text
    assert "s/turn" not in text and "it/s" not in text
    warned = [line for line in text.split("\n") if "short of CPU" in line]
    assert len(warned) == 2
    # Each warning's line holds nothing but the warning once the bar was cleared from it.
    assert all(line.split("\r")[-1] == "replica 1 is short of CPU" for line in warned)
