"""Stopping on signals: SIGTERM and SIGHUP as Ctrl-C, a second signal only hurries."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sessiongen.infra import procs, signals

pytestmark = pytest.mark.usefixtures("stop_signals_answered")


def test_the_first_signal_interrupts_and_later_ones_only_hurry() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with signals.handling():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        assert not signals.hurried()
        signal.raise_signal(signal.SIGINT)  # during the clean-up: no second interrupt
        signal.raise_signal(signal.SIGHUP)
        assert signals.hurried()
        assert signals.received() == signal.SIGTERM
        assert signals.exit_status() == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_cancels_at_an_await_and_lets_the_clean_up_finish() -> None:
    steps: list[str] = []

    async def main() -> None:
        try:
            signal.raise_signal(signal.SIGHUP)
            await asyncio.sleep(60)
            steps.append("not cancelled")
        finally:
            signal.raise_signal(signal.SIGTERM)  # a second signal while cleaning up
            await asyncio.sleep(0.01)
            steps.append("cleaned up")

    with signals.handling():
        with pytest.raises(KeyboardInterrupt):
            signals.run(main())
        assert steps == ["cleaned up"]
        assert signals.exit_status() == 128 + signal.SIGHUP and signals.hurried()


def test_run_returns_the_result_and_restores_the_handlers() -> None:
    async def main() -> int:
        return 42

    with signals.handling():
        handler = signal.getsignal(signal.SIGTERM)
        assert signals.run(main()) == 42
        assert signal.getsignal(signal.SIGTERM) is handler
        assert signals.received() is None


def test_outside_handling_run_answers_ctrl_c_and_leaves_sigterm_alone() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    async def main() -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        signal.raise_signal(signal.SIGINT)
        await asyncio.sleep(60)

    with pytest.raises(KeyboardInterrupt):
        signals.run(main())
    assert seen == [before]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_deferred_holds_the_interrupt_until_its_end() -> None:
    done: list[str] = []
    with signals.handling():
        with pytest.raises(KeyboardInterrupt), signals.deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("spawned and recorded")
        assert done == ["spawned and recorded"]


@pytest.mark.timeout(120)
def test_a_second_signal_ends_the_grace_period_of_a_stop(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    child = procs.spawn(
        [sys.executable, "-c", stubborn], {}, tmp_path / "log", stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        with signals.handling():
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # hurry: no 3600 s grace
            assert procs.stop_child("stubborn", child, grace_s=3600) == "killed"
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
