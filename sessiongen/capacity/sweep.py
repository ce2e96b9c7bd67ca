"""A sweep's independent tasks spread out: over this machine's cores, or a Ray cluster.

The configurations of a ``--vary`` grid share nothing: each is its own scenario, seeded
by its own ``seed``, replayed on its own virtual cluster. :func:`run_all` runs one task
per item

- ``local``, one job: in this process, one after another (block progress bars and all);
- ``local``, ``jobs`` > 1: in a pool of that many processes started with ``spawn`` (no
  fork of a process whose numpy, polars or tqdm threads may hold a lock);
- ``ray``: one Ray task per item, on the cluster at ``address`` (``ray.init``'s
  argument: ``auto``, ``ray://HOST:10001``, ...; none starts a local instance, or
  connects to ``RAY_ADDRESS``). Every node needs sessiongen and its dependencies
  installed; results come back to this process, which writes them, so the nodes need
  no shared file system.

and returns the results in the items' order, whatever order they finish in, calling
``on_done`` as each finishes: results are the same whatever the executor and the job
count. A task's :class:`~sessiongen.errors.UserError` comes back as one (its message
kept); anything else keeps its traceback. An error or an interrupt stops the tasks
still running (a day's configuration takes minutes) and drops those not started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from sessiongen.errors import MissingDependencyError, UserError

T = TypeVar("T")
R = TypeVar("R")

Executor = Literal["local", "ray"]

RAY_MISSING = "--executor ray needs Ray: pip install 'sessiongen[ray]'"


def default_jobs() -> int:
    """The cores this process may run on (its CPU affinity, which a container or
    ``taskset`` narrows; ``os.cpu_count()`` where the platform has none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class SweepOptions:
    """Where a sweep's tasks run: ``jobs`` processes here (None: :func:`default_jobs`),
    or Ray tasks on the cluster at ``address``."""

    jobs: int | None = None
    executor: Executor = "local"
    address: str | None = None

    def check(self) -> None:
        """A one-line :class:`UserError` for options that cannot run, before any work:
        Ray absent, an address without Ray."""
        if self.executor == "ray":
            _import_ray()
        elif self.address is not None:
            raise UserError("--address: a Ray cluster's address; it needs --executor ray")

    def workers(self, tasks: int) -> int:
        """How many processes a local sweep of ``tasks`` tasks starts (1: none)."""
        return max(1, min(self.jobs or default_jobs(), tasks))


@dataclass(frozen=True)
class _Outcome(Generic[R]):
    """What a task sends back: its result, or the message of the user error it raised
    (a :class:`~sessiongen.errors.ScenarioError` does not survive pickling as itself)."""

    result: tuple[R] | None = None  # boxed: a task may return None itself
    user_error: str | None = None


def _call(task: Callable[[T], R], item: T) -> _Outcome[R]:
    try:
        return _Outcome(result=(task(item),))
    except UserError as exc:
        return _Outcome(user_error=str(exc))


def _unwrap(outcome: _Outcome[R]) -> R:
    if outcome.result is None:
        raise UserError(outcome.user_error or "a task failed without a message")
    return outcome.result[0]


def run_all(
    task: Callable[[T], R],
    items: Sequence[T],
    options: SweepOptions,
    on_done: Callable[[int, R], None] | None = None,
) -> list[R]:
    """``[task(item) for item in items]`` spread out as ``options`` says (module doc);
    ``on_done(index, result)`` as each finishes. ``task`` must be a module-level
    function and the items picklable, unless the sweep runs here."""
    done = on_done or (lambda _i, _r: None)
    if options.executor == "ray":
        return _on_ray(task, items, options.address, done)
    if options.workers(len(items)) == 1:
        out = []
        for i, item in enumerate(items):
            out.append(task(item))
            done(i, out[-1])
        return out
    return _on_processes(task, items, options.workers(len(items)), done)


def _on_processes(
    task: Callable[[T], R], items: Sequence[T], jobs: int, done: Callable[[int, R], None]
) -> list[R]:
    results: dict[int, R] = {}
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
    try:
        pending: dict[Future[_Outcome[R]], int] = {
            pool.submit(_call, task, item): i for i, item in enumerate(items)
        }
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                i = pending.pop(future)
                results[i] = _unwrap(future.result())
                done(i, results[i])
    except BaseException:
        # an error, Ctrl-C or SIGTERM: what runs stops now, not when its configuration
        # ends (minutes, for a day); the pool has no public way to say so before 3.14
        workers: dict[int, Any] = getattr(pool, "_processes", None) or {}
        for process in list(workers.values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [results[i] for i in range(len(items))]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(RAY_MISSING) from None
    return ray


def _on_ray(
    task: Callable[[T], R],
    items: Sequence[T],
    address: str | None,
    done: Callable[[int, R], None],
) -> list[R]:
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False if address is None else None)
    pending: dict[Any, int] = {}
    try:
        remote = ray.remote(num_cpus=1)(_call)
        pending = {remote.remote(task, item): i for i, item in enumerate(items)}
        results: dict[int, R] = {}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                i = pending.pop(ref)
                results[i] = _unwrap(ray.get(ref))
                done(i, results[i])
        return [results[i] for i in range(len(items))]
    finally:
        for ref in pending:  # an error or Ctrl-C: nothing left running on the cluster
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
