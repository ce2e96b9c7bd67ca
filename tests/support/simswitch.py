"""A switch command for tests: ``python simswitch.py on|off URL [URL ...]``.

Switches a running ``sessiongen sim serve`` (replicas at the URLs) to the shared cache
``on`` or ``off`` through its admin routes, and empties every cache and the pool, as a
user's command that restarts real replicas with or without the KV connector would.
"""

from __future__ import annotations

import json
import sys
import urllib.request


def post(url: str, body: dict[str, object]) -> None:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        resp.read()


def main(argv: list[str]) -> int:
    arm, urls = argv[0], argv[1:]
    if arm not in ("on", "off") or not urls:
        print("usage: simswitch.py on|off URL [URL ...]", file=sys.stderr)
        return 2
    post(urls[0] + "/sim/config", {"shared_cache": arm == "on"})
    for i, url in enumerate(urls):
        post(url + "/sim/reset", {"pool": i == 0})
    print(f"simulated replicas switched to shared cache {arm}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
