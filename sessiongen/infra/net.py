"""Ports and health checks for the servers sessiongen starts.

Free ports are picked *below* the kernel's ephemeral range. A port picked by binding to
port 0 lies inside that range, and between our pick and the server's own bind (a minute
for vLLM) the kernel may hand the same port to one of the dozens of internal sockets
that vLLM's workers open; a port below the range is never handed out that way.
"""

from __future__ import annotations

import errno
import json
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from sessiongen.errors import EndpointError

HOST = "127.0.0.1"
"""Every server sessiongen starts listens on loopback only: the driver runs on the same host."""

_LOWEST_PICK = 20000
# Loopback health checks must never go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when a server could bind ``host:port`` now.

    Binds with SO_REUSEADDR as uvicorn and ZeroMQ do, so a port held only by
    connections in TIME_WAIT counts as free, while any listener on it (on ``host`` or
    on all interfaces) counts as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def pick_free_port(avoid: Collection[int] = (), rng: random.Random | None = None) -> int:
    """A currently free port below the ephemeral range, not in ``avoid``."""
    rng = rng or random.SystemRandom()
    low, _ = ephemeral_range()
    top = max(low - 1, _LOWEST_PICK + 1000)
    for _ in range(500):
        port = rng.randint(_LOWEST_PICK, top)
        if port not in avoid and port_is_free(port):
            return port
    raise OSError(f"no free port found in {_LOWEST_PICK}-{top}")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatically assigned ports (Linux default if unknown)."""
    try:
        low, high = _EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET url`` answers 200 within ``timeout_s``."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_json(url: str, timeout_s: float = 5.0) -> Any:
    """``GET url`` decoded as JSON; an :class:`EndpointError` when it cannot be read."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EndpointError(f"{url}: unreadable: {exc}") from None


def http_text(url: str, timeout_s: float = 30.0) -> str | None:
    """``GET url``'s body as text, or None when it cannot be read."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def http_post_json(url: str, body: Any = None, timeout_s: float = 60.0) -> tuple[int, Any]:
    """``POST url`` with a JSON body (none when ``body`` is None): the status and the
    decoded JSON answer (None when it is not JSON). An HTTP error status is returned,
    not raised; an :class:`EndpointError` when the server cannot be reached at all."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data or b"", headers=headers, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            status, raw = int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise EndpointError(f"POST {url}: unreachable: {exc}") from None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def wait_healthy(
    urls: Sequence[str],
    deadline: float,
    *,
    poll_s: float = 0.5,
    check: Callable[[], None] | None = None,
    labels: Sequence[str] | None = None,
    within: str = "time",
    note: str = "",
) -> None:
    """Poll ``GET url`` for each URL until all answer 200, or until ``deadline``.

    ``deadline`` is on ``time.monotonic()``. ``check`` runs before every round and
    raises when waiting is pointless (a process exited, start-up was cancelled). At the
    deadline an :class:`EndpointError` says ``not healthy within WITHIN: LABEL (URL),
    ...; NOTE`` for the URLs still not healthy.
    """
    names = dict(zip(urls, labels or urls, strict=True))
    pending = list(urls)
    while pending:
        if check is not None:
            check()
        pending = [url for url in pending if not http_ok(url)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            shown = ", ".join(
                f"{names[url]} ({url})" if names[url] != url else url for url in pending
            )
            tail = f"; {note}" if note else ""
            raise EndpointError(f"not healthy within {within}: {shown}{tail}")
        time.sleep(poll_s)
