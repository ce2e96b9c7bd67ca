"""Stop a block whose replicas say they are in the other cache arm, before it is sent.

Replicas that say what they are (vLLM's ``/server_info`` in dev mode, the simulator's
info gauge: :func:`sessiongen.client.engine.reported_arm`) are read when the block
opens (:meth:`~sessiongen.targets.Target.connectors`). When one says the other arm (a
KV connector in an OFF block, none in an ON block), every request of the block would
measure the wrong arm: swapped ``--endpoints-off``/``--endpoints-on`` once ran for 73 s,
printed its table and exited 0 with eight warnings. Replay stops instead, with this
evidence in one line, unless ``target.allow_arm_mismatch`` (``--allow-arm-mismatch``)
asks it to run the block anyway; the counters still judge every block afterwards
(:mod:`sessiongen.analysis.arms`). Replicas that say nothing are not judged here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessiongen.client.engine import reported_arm

#: How the stop names the way around it.
ALLOW_FLAG = "--allow-arm-mismatch"


def _said(connector: Mapping[str, Any]) -> str:
    arm = reported_arm(connector)
    what = "a KV connector" if arm == "on" else "no KV connector"
    name = connector.get("connector")
    source = connector.get("source")
    details = ", ".join(str(x) for x in (name, f"from {source}" if source else None) if x)
    return f"{what} ({details})" if details else what


def arm_contradiction(
    block: int, placement: str, cache: str, urls: Sequence[str], said: Sequence[Mapping[str, Any]]
) -> str | None:
    """The evidence, one line, when a replica of the block (``urls``, what each ``said``
    of its KV connector, in the same order) says an arm other than ``cache``; else None."""
    wrong = [
        f"{url} says {_said(c)}"
        for url, c in zip(urls, said, strict=False)
        if reported_arm(c) not in (cache, None)
    ]
    if not wrong:
        return None
    return (
        f"block {block} ({placement}, cache {cache}) not sent: its replicas contradict the "
        f"arm at start: {'; '.join(wrong)} (are the pairs or --cache swapped? "
        f"{ALLOW_FLAG} runs it anyway)"
    )
