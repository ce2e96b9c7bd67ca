"""``sessiongen pair up / down / status``: a managed pair that outlives the command.

``pair up`` starts a :class:`~sessiongen.launch.pair.ManagedPair` and leaves it running;
its state file (``STATE_DIR/pair.json``, written atomically after every spawn) records
pids, process groups, start times, ports and logs. ``pair down`` and ``pair status``,
run later from any process, find the same process groups through it. Start times and
the boot id keep a reused pid from being mistaken for one of ours.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sessiongen.errors import EndpointError, RunDirError, ScenarioError
from sessiongen.infra import files, net, procs
from sessiongen.launch.pair import STATE_SCHEMA, ManagedPair
from sessiongen.launch.procs import ProcessRecord
from sessiongen.scenario.spec import Scenario

STATE_NAME = "pair.json"
LOG_SUBDIR = "logs"


def state_path(state_dir: Path) -> Path:
    """The state file inside ``state_dir``."""
    return Path(state_dir) / STATE_NAME


def load_state(state_dir: Path) -> dict[str, Any] | None:
    """The recorded state, or None when no pair was brought up from ``state_dir``."""
    path = state_path(state_dir)
    try:
        state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        why = "a path component is not a folder"
        raise RunDirError(f"{path}: unreadable pair state: {why}") from None
    except OSError as exc:
        raise RunDirError(f"{path}: unreadable pair state: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise RunDirError(f"{path}: unreadable pair state: {exc}") from None
    if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
        raise RunDirError(f"{path}: not a pair state of schema {STATE_SCHEMA}")
    return state


def pair_up(
    scenario: Scenario,
    state_dir: Path,
    *,
    cache_on: bool = True,
    tiny_model_dir: Path | None = None,
) -> dict[str, Any]:
    """Start the scenario's managed pair and leave it running; return the state written.

    Refuses (``EndpointError``) while a pair recorded in ``state_dir`` is still running;
    a stale state file (processes gone, or from before a reboot) is replaced. Logs go to
    ``state_dir/logs``. If start-up fails or is interrupted, nothing is left running.
    """
    target = scenario.target
    if target.kind != "managed":
        raise ScenarioError(
            scenario.source, "target.kind", f'pair up needs "managed", got "{target.kind}"'
        )
    state_dir = Path(state_dir)
    running = [row["name"] for row in pair_status(state_dir, check_health=False) if row["alive"]]
    if running:
        raise EndpointError(
            f"a pair is already up from {state_dir} ({', '.join(running)}); "
            "run sessiongen pair down first"
        )
    path = state_path(state_dir)
    path.unlink(missing_ok=True)
    files.ensure_dir(state_dir / LOG_SUBDIR)  # unwritable: fail before starting anything
    pair = ManagedPair(
        target.managed,
        scenario.model.name,
        cache_on,
        state_dir / LOG_SUBDIR,
        tiny_model_dir=tiny_model_dir,
        state_file=path,
    )
    pair.start()
    try:
        state = {**pair.detach(), "scenario": scenario.source, "scenario_name": scenario.name}
        files.atomic_write_json(path, state)
    except BaseException:
        pair.stop()
        raise
    return state


def pair_down(state_dir: Path, grace_s: float = 30.0) -> list[str]:
    """Stop the pair recorded in ``state_dir``; one line per process saying what happened.

    Returns an empty list when no pair state is there. The state file is removed unless
    a process survived SIGKILL (then a later ``pair down`` can try again).
    """
    state = load_state(state_dir)
    if state is None:
        return []
    recs = records(state)
    if state.get("boot_id") != procs.boot_id():
        outcome = {rec.name: "gone (machine rebooted)" for rec in recs}
    else:
        outcome = procs.stop_groups(recs, grace_s)
    if "left" not in outcome.values():
        state_path(state_dir).unlink(missing_ok=True)
    return [f"{rec.name} (pid {rec.pid}, port {rec.port}): {outcome[rec.name]}" for rec in recs]


def pair_status(state_dir: Path, *, check_health: bool = True) -> list[dict[str, Any]]:
    """One row per recorded process: name, role, pid, port, url, alive, healthy, log.

    ``alive`` means its process group still has living members; ``healthy`` that its
    health URL answers 200 now. Empty when no pair state is in ``state_dir``.
    """
    state = load_state(state_dir)
    if state is None:
        return []
    same_boot = state.get("boot_id") == procs.boot_id()
    rows = []
    for rec in records(state):
        alive = same_boot and procs.group_alive(rec)
        rows.append(
            {
                "name": rec.name,
                "role": rec.role,
                "index": rec.index,
                "pid": rec.pid,
                "port": rec.port,
                "url": rec.url,
                "alive": alive,
                "healthy": bool(alive and check_health and net.http_ok(rec.health_url)),
                "log": rec.log,
            }
        )
    return rows


def records(state: dict[str, Any]) -> list[ProcessRecord]:
    """The processes of a state (as :func:`pair_up` returns it, or as recorded)."""
    try:
        return [ProcessRecord.from_dict(item) for item in state["processes"]]
    except (KeyError, TypeError) as exc:
        raise RunDirError(f"pair state: malformed process entry: {exc}") from None
