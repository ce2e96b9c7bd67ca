"""A block's warm-up requests: which prompts, in which order, to which replica.

Each round gives every replica a prompt of its own, sent to that replica and then to the
next one (the second hop reads the prefix from another replica: the shared pool's path
when it is on, warm before the first measured cross-replica turn); a routed block also
sends rounds times replicas prompts through its router. Warm-ups run one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Warmup:
    """One warm-up request: its prompt's key, where it goes (None: the router), its hop."""

    key: str
    replica: int | None
    hop: int  # 0: the prompt's own replica; 1: the next one (a cross-replica request)


def warmups(*, block: int, replicas: int, rounds: int, routed: bool) -> list[Warmup]:
    """The warm-ups of block ``block`` in the order they are sent."""
    out = [
        Warmup(f"b{block}-r{r}-{i}", target, hop)
        for i in range(rounds)
        for r in range(replicas)
        for hop, target in enumerate(dict.fromkeys([r, (r + 1) % replicas]))
    ]
    if routed:
        out += [Warmup(f"b{block}-gw-{i}", None, 0) for i in range(rounds * max(1, replicas))]
    return out


def warmup_tokens(given: int | None, pool_chunk_tokens: int | None) -> int:
    """Context length of each warm-up: ``design.warmup_tokens``, else two of the target's
    pool chunks (at least 256 tokens), so the pool stores whole chunks and the second hop
    reads them back: shorter than a chunk, nothing is stored and the first measured
    cross-replica request pays the cold pool path."""
    if given is not None:
        return given
    return max(256, 2 * (pool_chunk_tokens or 256))
