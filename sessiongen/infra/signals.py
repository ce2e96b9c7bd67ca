"""Stopping on a signal: SIGTERM and SIGHUP stop sessiongen as Ctrl-C does, and a second
signal hurries the clean-up instead of cutting it short.

sessiongen owns process groups (simulators, vLLM replicas, LMCache, routers) that must
not outlive it. Python's defaults unwind cleanly only on SIGINT: SIGTERM (``kill``, a CI
job's timeout, systemd) and SIGHUP (a closed terminal) end the process at once and leave
the groups running, and a second Ctrl-C raises a second ``KeyboardInterrupt`` inside the
clean-up of the first. Once :func:`install` ran (the CLI), the first of SIGINT,
SIGTERM and SIGHUP interrupts as Ctrl-C does and each later one only sets the flag
:func:`hurried`, which :func:`sessiongen.infra.procs.stop_groups` reads to skip its grace
period and SIGKILL what is left. The exit status is 128 plus the first signal's number
(130, 143, 129), as a shell reports a process that a signal ended.

:func:`run` is ``asyncio.run`` where that first signal cancels the main task instead, so
it lands at an ``await`` (where clean-up can run) and never in the event loop's own
machinery. Without :func:`install` (a notebook), :func:`run` answers SIGINT only and
leaves SIGTERM and SIGHUP to the host.

A signal ignored when the process started stays ignored: ``nohup`` ignores SIGHUP so that
a closed terminal does not stop the run, and a shell starts a script's background job
with SIGINT ignored (Python itself then installs no Ctrl-C handler). SIGTERM, the way
such a job is stopped, is still answered unless it too was ignored.

Nothing here can help against SIGKILL: the children watch for their parent's death
themselves (the simulator and the reference server exit when their stdin closes, replay
workers when their parent's sentinel does).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import types
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _State:
    def __init__(self) -> None:
        self.first: int | None = None  # the signal that started the stop
        self.hurry = threading.Event()
        self.active = False  # install() is in force
        self.deferring = 0  # depth of deferred() sections in the main thread
        self.deferred = False  # the interrupt waits for the end of deferred()


_state = _State()


def received() -> int | None:
    """The signal that interrupted this process, if one did."""
    return _state.first


def hurried() -> bool:
    """True once a signal came after the one that interrupted: stop without grace."""
    return _state.hurry.is_set()


def reset() -> None:
    """Forget any signal received (for a process that goes on, such as a test run)."""
    _state.first, _state.active, _state.deferred = None, False, False
    _state.hurry.clear()


def exit_status(default: int = 130) -> int:
    """128 plus the interrupting signal's number; ``default`` when no signal came."""
    return 128 + _state.first if _state.first is not None else default


def answered(sigs: tuple[int, ...] = STOP_SIGNALS) -> tuple[int, ...]:
    """Those of ``sigs`` this process may answer: all but the ones it was told to ignore
    (their disposition is ``SIG_IGN``, as ``nohup`` or a shell's background job sets)."""
    return tuple(sig for sig in sigs if signal.getsignal(sig) is not signal.SIG_IGN)


def _note(signum: int) -> bool:
    """Record a stop signal; True when it is the first."""
    if _state.first is None:
        _state.first = signum
        return True
    _state.hurry.set()
    return False


def _on_signal(signum: int, frame: types.FrameType | None) -> None:
    if _note(signum):
        if _state.deferring:
            _state.deferred = True
            return
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """An interrupt that arrives inside waits until its end, so that starting a child
    and recording it (for clean-up) cannot be split by a ``KeyboardInterrupt``.

    Only the signals of :func:`install` wait, and only in the main thread (the only one
    Python raises them in); keep the section to a few statements.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and _state.deferred:
            _state.deferred = False
            raise KeyboardInterrupt


def install() -> None:
    """SIGINT, SIGTERM and SIGHUP interrupt once (``KeyboardInterrupt``), then hurry, for
    the rest of this process: its exit hooks (the last clean-up) included.

    For the main thread of a command line; elsewhere (another thread) it does nothing.
    """
    if _install():
        atexit.register(_ignore_once_stopped)  # registered first, so it runs last


def _ignore_once_stopped() -> None:
    """The last exit hook of a process that a signal stopped: its clean-up is done, so it
    ends here with :func:`exit_status`, its streams flushed.

    Ending now, not through the interpreter's teardown, keeps that status whatever
    happened on the way: a signal during the teardown (which puts back the default
    handlers) would replace it by death from that signal, and CPython run as
    ``python -m`` ends by SIGINT (status -2) once a ``KeyboardInterrupt`` was raised
    inside source text it ran with ``exec`` (a dataclass's generated methods, made as a
    module imports), caught or not: a SIGTERM early in start-up ended that way."""
    if _state.first is None:
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(exit_status())


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """:func:`install` for a while; the previous handlers come back at its end."""
    previous = _install()
    try:
        yield
    finally:
        _state.active = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _install() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {sig: signal.signal(sig, _on_signal) for sig in answered()}
    _state.first, _state.active = None, True
    _state.hurry.clear()
    return previous


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where the first stop signal cancels ``main`` at an ``await``
    and later ones hurry the clean-up; ``KeyboardInterrupt`` is raised once ``main`` has
    unwound (its ``finally`` blocks ran) and the loop's worker threads have finished."""
    import asyncio  # here, not at import: every command installs signals, few run a loop

    outcome: list[T] = []
    asyncio.run(_cancel_on_signals(main, outcome))
    if not outcome:
        raise KeyboardInterrupt
    return outcome[0]


async def _cancel_on_signals(main: Coroutine[Any, Any, T], outcome: list[T]) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    cancelled_by_us = False

    def on_signal(signum: int) -> None:
        nonlocal cancelled_by_us
        if _note(signum):
            cancelled_by_us = True
            task.cancel()

    installed: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        if not _state.active:  # a library call: each run stops afresh on Ctrl-C
            _state.first = None
            _state.hurry.clear()
        for wanted in answered(STOP_SIGNALS if _state.active else (signal.SIGINT,)):
            installed[wanted] = signal.getsignal(wanted)
            loop.add_signal_handler(wanted, on_signal, wanted)
    try:
        outcome.append(await main)
    except asyncio.CancelledError:
        if not cancelled_by_us:
            raise
        task.uncancel()
    finally:
        for sig, handler in installed.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
