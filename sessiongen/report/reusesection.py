"""The report's section on a trace's reuse: shown for trace runs only.

What the trace itself implies (the share of prompt tokens an infinite cache could have
served, the same per replica under the placement used, the reuse distances, the working
set over time against the replicas' KV cache and the pool), then what each arm got from
its local prefix cache and from the pool, so a reader sees how much of the possible
reuse the pool recovered. Definitions are in :mod:`sessiongen.analysis.reuse` and are
written into the section itself.

The per-replica share and the working set need each line's hash ids, which the records
do not hold: the trace is read again from the manifest's ``[sessions.trace]`` and checked
against the records' own ``trace_shared_tokens``; where it cannot be read or no longer
matches, those figures say "not enough data" and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
from matplotlib.figure import Figure

from sessiongen.analysis import reuse
from sessiongen.analysis.arms import pool_chunk_tokens
from sessiongen.analysis.frames import partition
from sessiongen.analysis.structure import structure
from sessiongen.errors import SessiongenError
from sessiongen.records.run import Run
from sessiongen.report import figures
from sessiongen.report.document import Bullets, Element, Heading, Image, Paragraph, Table
from sessiongen.report.plots import CACHE_STYLE, COLORS
from sessiongen.workload.trace import read_trace

HEADING = "Reuse: what the trace allows and what each arm got"


def _spec(run: Run) -> Mapping[str, Any]:
    return run.meta.sessions.get("trace") or {}


def trace_path(run: Run) -> Path:
    """The trace file as the replay found it: as given (absolute, or from the working
    directory), else beside the scenario file; a relative scenario path is tried from the
    working directory, then from the folder that holds the runs folder (where the replay
    ran when the runs are in its default ``runs/``)."""
    given = Path(str(_spec(run).get("file", "")))
    if given.is_absolute() or given.exists():
        return given
    source = Path(str(run.manifest.get("scenario_source", "")))
    beside = source.parent / given
    if beside.exists() or beside.is_absolute():
        return beside
    from_root = run.path.resolve().parent.parent / beside
    return from_root if from_root.exists() else beside


def load_lines(run: Run) -> tuple[pl.DataFrame | None, str]:
    """The trace's kept lines (``trace_line``, ``hash_ids``), or None and why not."""
    spec = _spec(run)
    window = tuple(spec.get("window_ms") or ())
    path = trace_path(run)
    try:
        kept = read_trace(
            path,
            block_tokens=int(spec.get("block_tokens", 512)),
            limit=spec.get("limit"),
            window=None if not window else window[0] if len(window) == 1 else window,
            speedup=float(spec.get("speedup", 1.0)),
        )
        rows = [(r.line, list(r.hash_ids), r.input_length) for r in kept]
    except (SessiongenError, OSError) as exc:
        return None, f"the trace cannot be read again ({exc})"
    schema = {"trace_line": pl.Int64(), "hash_ids": pl.List(pl.Int64()), "input_length": pl.Int64()}
    lines = pl.DataFrame(rows, schema=schema, orient="row")
    if not _matches(run, lines, int(spec.get("block_tokens", 512))):
        return None, f"{path} no longer matches the records (it changed since the run)"
    return lines, ""


def _matches(run: Run, lines: pl.DataFrame, block_tokens: int) -> bool:
    """The re-read trace says what the records say: every line's shared tokens."""
    said = reuse.trace_lines(run.requests).select("trace_line", "trace_shared_tokens")
    mine = lines.sort("trace_line").with_columns(
        mine=pl.Series(
            reuse.leading_seen_tokens(
                lines["hash_ids"].to_list(), lines["input_length"].to_list(), block_tokens
            )
        )
    )
    joined = said.join(mine, on="trace_line", how="left")
    return bool(joined.height) and bool(
        (joined["mine"] == joined["trace_shared_tokens"].fill_null(0)).all()
    )


def capacities(run: Run) -> dict[str, float | None]:
    """KV bytes per token, each replica's KV cache and the pool, in tokens, where known."""
    found = structure(run.meta)
    kv = (run.meta.target.get("profile") or {}).get("kv_bytes_per_token")
    pool_gib = found.get("pool_capacity_gib")
    return {
        "kv_bytes_per_token": float(kv) if kv else None,
        "replica_kv_tokens": float(found["local_cache_tokens"])
        if "local_cache_tokens" in found
        else None,
        "pool_tokens": float(pool_gib) * 2**30 / float(kv) if pool_gib and kv else None,
        "pool_gib": float(pool_gib) if pool_gib else None,
    }


def _pct(value: float | None) -> str:
    return "not enough data" if value is None or math.isnan(value) else f"{value:.1%}"


def definitions(block_tokens: int) -> Bullets:
    """What every figure of the section means, with its unit."""
    return Bullets(
        (
            f"Block: one hash id of the trace, {block_tokens} tokens (a prompt's last block "
            "may be partial). Tokens are the trace's prompt tokens (input_length); only "
            "requests that succeeded count.",
            "Infinite-cache share: the tokens of each request's leading blocks seen in an "
            "earlier line of the trace (trace_shared_tokens), over all prompt tokens: what "
            "one unbounded cache every replica reads could have served.",
            "Replica share: the same counting only blocks sent earlier in the same run block "
            "to the same replica (send order): what unbounded local caches serve under the "
            "placement as run. Infinite minus replica share is reuse that only another "
            "replica had seen: the most a pool can add to unbounded local caches.",
            "Local share and pool share: local prefix-cache hit tokens and pool (external) "
            "hit tokens from the replicas' counters, over prompt tokens.",
            "Beyond local: per request max(0, infinite-cache tokens - local hit tokens); "
            "over prompt tokens, the beyond-local share is the most a pool could serve of "
            "the trace's shared prefixes beside the local hits as run. It, not infinite "
            "minus replica share, bounds the pool: real local caches evict, so a pool also "
            "serves blocks a replica saw and dropped. Recovered: per request min(pool hit "
            "tokens, beyond local); over prompt tokens, the pool-within share (never above "
            "the beyond-local share; the pool share itself also counts chat-template "
            "tokens). Recovered share: recovered / beyond local, with a 95% interval over "
            "sessions as units (Wilson on the effective sample size), counting only the "
            "sessions with reuse beyond the local hits (the units resampled: "
            "interval_units); not given below 5 of them.",
            "Reuse distance (blocks): a request's largest LRU stack distance among its "
            "shared blocks over the whole trace; one LRU cache of C blocks serves its whole "
            "shared prefix exactly when the distance is below C. LRU share at C: the "
            "infinite-cache tokens of requests whose distance is below C, over all of them.",
            "Working set (blocks, GiB = blocks x block tokens x KV bytes per token / 2^30): "
            "distinct blocks referenced by the requests sent in the last W modeled seconds, "
            "at each send, over all replicas and on the busiest replica; the footprint is "
            "the distinct blocks of a whole run block. Blocks count whole, an upper bound.",
        )
    )


def _trace_paragraph(rows: pl.DataFrame) -> Paragraph:
    t = reuse.trace_totals(rows)
    return Paragraph(
        f"The trace's {t['requests']} requests carry {t['prompt_tokens']} prompt tokens; "
        f"an infinite cache shared by every replica could have served {t['infinite_tokens']} "
        f"of them (infinite-cache share {_pct(t['infinite_share'])})."
    )


def _recovered_lines(arms: pl.DataFrame) -> list[str]:
    out = []
    for r in arms.filter(pl.col("cache") == "on").iter_rows(named=True):
        if not r["beyond_local_tokens"]:
            out.append(
                f"{r['placement']}: the local caches left nothing of the infinite cache's "
                "reuse for the pool to recover."
            )
            continue
        unit = "requests" if r.get("one_request_sessions") else "sessions"
        ci = (
            f"95% interval {r['recovered_low']:.0%} to {r['recovered_high']:.0%} over the "
            f"{r['interval_units']} {unit} with reuse beyond the local hits (the units "
            f"resampled, of {r['sessions']})"
            if r["recovered_low"] is not None
            else f"interval: not enough data (fewer than 5 {unit} with reuse beyond the local hits)"
        )
        room = (
            f"unbounded local caches could serve {_pct(r['replica_share'])} of its prompt "
            f"tokens, leaving {_pct(r['infinite_share'] - r['replica_share'])} that only "
            "another replica had seen"
            if r["replica_share"] is not None
            else "the replica share is not known"
        )
        out.append(
            f"{r['placement']}: {room}. The local caches got {_pct(r['local_share'])} "
            f"(bounded: they evict), leaving at most {_pct(r['beyond_local_share'])} of the "
            f"trace's shared prefixes for a pool; the pool served {_pct(r['pool_share'])} of "
            f"the prompt tokens, {_pct(r['pool_within_share'])} within that bound (the rest "
            f"are chat-template tokens every prompt shares). The pool recovered "
            f"{r['recovered_tokens']} of the {r['beyond_local_tokens']} tokens the infinite "
            f"cache could have served beyond the local hits ({_pct(r['recovered_share'])}; "
            f"{ci})."
        )
    return out


#: LMCache's default chunk (tokens), named beside the pool's own so a reader can compare.
LMCACHE_DEFAULT_CHUNK = 256


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def recovery_lines(
    rows: pl.DataFrame, chunk: int | None, block_tokens: int, evictions: str
) -> list[str]:
    """Per ON placement with tokens beyond the local hits: why the pool did not recover
    them all (:func:`~sessiongen.analysis.reuse.recovery_causes`), with the run's figures:
    the pool's chunk against the trace's block size, the partial chunks at the end of
    the shared prefixes, whole chunks it did not serve (``evictions``: what the capacity
    says of those)."""
    if chunk is None:
        return [
            "Why not more: the pool's chunk size is not known for this target (LMCache's "
            f"default is {LMCACHE_DEFAULT_CHUNK} tokens); the pool serves whole chunks only, "
            "so the tail of each shared prefix past its last whole chunk is never recovered."
        ]
    out = []
    causes = reuse.recovery_causes(rows, chunk)
    for r in causes.filter(pl.col("beyond_local_tokens") > 0).iter_rows(named=True):
        beyond = r["beyond_local_tokens"]
        partial, missed = r["partial_chunk_tokens"], r["missed_tokens"]
        short = (
            f"; {r['short_requests']} of the {_count(r['beyond_requests'], 'request')} with "
            f"reuse beyond the local hits share less than one chunk, so the pool can give "
            "them nothing"
            if r["short_requests"]
            else ""
        )
        said = (
            f"{r['placement']}: why the pool recovered {r['recovered_tokens']:,} of the "
            f"{beyond:,} tokens beyond the local hits: it stores and serves whole chunks of "
            f"{chunk:,} tokens ({chunk / block_tokens:.2f} of the trace's {block_tokens}-token "
            f"blocks; LMCache's default chunk is {LMCACHE_DEFAULT_CHUNK}). {partial:,} tokens "
            f"({partial / beyond:.0%}) lie in partial chunks at the end of the shared "
            f"prefixes{short}. "
        )
        if missed:
            said += (
                f"{missed:,} tokens ({missed / beyond:.0%}) were in whole chunks the pool did "
                f"not serve: {evictions}."
            )
        else:
            said += "Every whole chunk within reach was served: no eviction cost anything."
        out.append(said)
    return out


def eviction_text(footprint_tokens: int | None, pool_tokens: float | None) -> str:
    """What the pool's capacity says of whole chunks it did not serve."""
    if footprint_tokens is None or pool_tokens is None:
        return (
            "evicted, or not yet stored when asked for (the pool's capacity or the "
            "trace's footprint is not known, so the two cannot be told apart)"
        )
    share = footprint_tokens / pool_tokens
    if share <= 1:
        return (
            f"not evictions (the largest run block's footprint, {footprint_tokens:,} tokens, "
            f"is {share:.1%} of the pool), so not yet stored when asked for (the request "
            "that writes them still running)"
        )
    return (
        f"evicted (the largest run block's footprint, {footprint_tokens:,} tokens, is "
        f"{share:.0%} of the pool), or not yet stored when asked for"
    )


def _distance_part(
    rows: pl.DataFrame, caps: dict[str, float | None], block_tokens: int
) -> list[Element]:
    q = reuse.distance_quantiles(rows)
    if not q["sharing_requests"]:
        return [Paragraph("Reuse distance: not enough data (no request shares a block).")]
    parts = [
        f"{q['sharing_requests']} requests share a prefix; their reuse distance is "
        f"{q['p50']:g} blocks at the median, {q['p90']:g} at p90, {q['max']:g} at most"
    ]
    for name, key in (("a replica's KV cache", "replica_kv_tokens"), ("the pool", "pool_tokens")):
        cap = caps[key]
        if cap is None:
            parts.append(f"the LRU share at {name}: not enough data (its capacity is not known)")
        else:
            c = cap / block_tokens
            parts.append(
                f"an LRU cache the size of {name} ({c:.0f} blocks) keeps "
                f"{_pct(reuse.lru_share(rows, c))} of the infinite cache's tokens"
            )
    return [
        Paragraph("; ".join(parts) + "."),
        Table(reuse.distance_histogram(rows).drop("low")),
    ]


def _working_part(
    run: Run, lines: pl.DataFrame, caps: dict[str, float | None], block_tokens: int
) -> tuple[list[Element], pl.DataFrame]:
    ws = reuse.working_set(run.requests, lines)
    kv = caps["kv_bytes_per_token"]
    peaks = ws.group_by("block", "placement", "cache", "window_s", maintain_order=True).agg(
        peak_blocks=pl.col("all_blocks").max(), peak_replica_blocks=pl.col("replica_blocks").max()
    )
    table = peaks.join(reuse.footprint(run.requests, lines), on=["block", "placement", "cache"])
    table = table.rename({"all_blocks": "footprint_blocks", "replica_blocks": "footprint_replica"})
    if kv:
        table = table.with_columns(
            peak_gib=pl.col("peak_blocks") * block_tokens * kv / 2**30,
            peak_replica_gib=pl.col("peak_replica_blocks") * block_tokens * kv / 2**30,
            footprint_gib=pl.col("footprint_blocks") * block_tokens * kv / 2**30,
        )
    said = []
    rep, pool = caps["replica_kv_tokens"], caps["pool_tokens"]
    said.append(
        "KV cache per replica: "
        + (
            f"{rep:.0f} tokens ({rep / block_tokens:.0f} blocks"
            + (f", {rep * kv / 2**30:.3g} GiB)" if kv else ")")
            if rep
            else "not known"
        )
    )
    said.append(
        "pool: "
        + (
            f"{caps['pool_gib']:.3g} GiB ({pool / block_tokens:.0f} blocks)"
            if pool and caps["pool_gib"]
            else "not known"
        )
    )
    text = (
        "Working set with W a tenth of each run block's span of sends (window_s, "
        f"{run.seconds}), its peak over all replicas and on the busiest replica, and the "
        "footprint; "
        + "; ".join(said)
        + ("." if kv else "; KV bytes per token not known, so no GiB.")
    )
    return [Paragraph(text + _fits(table, block_tokens, rep, pool)), Table(table)], ws


def _fits(table: pl.DataFrame, block_tokens: int, replica: float | None, pool: float | None) -> str:
    """The largest peaks as shares of the capacities (tokens) they must fit in."""
    out = []
    busiest = table["peak_replica_blocks"].max()
    footprint = table["footprint_blocks"].max()
    if replica and isinstance(busiest, int):
        out.append(
            f"the busiest replica's peak is {busiest * block_tokens / replica:.1%} of its KV cache"
        )
    if pool and isinstance(footprint, int):
        out.append(f"the largest footprint is {footprint * block_tokens / pool:.1%} of the pool")
    return (" At most, " + "; ".join(out) + ".") if out else ""


def _figure(
    ws: pl.DataFrame,
    hist: pl.DataFrame,
    caps: dict[str, float | None],
    block_tokens: int,
    note: str,
) -> Figure:
    fig, (left, right) = figures.panels(
        "Working set and reuse distance of the trace", ncols=2, note=note
    )
    kv = caps["kv_bytes_per_token"]
    scale = block_tokens * kv / 2**30 if kv else 1.0
    unit = "GiB" if kv else "blocks"
    first = ws.group_by("placement", maintain_order=True).agg(pl.col("block").min())["block"]
    shown = ws.filter(pl.col("block").is_in(first.to_list()))
    placements = shown["placement"].unique(maintain_order=True).to_list()
    for key, sub in partition(shown, ["placement", "cache"]):
        color = COLORS[placements.index(key["placement"]) % len(COLORS)]
        t = sub["t_s"].to_list()
        name = key["placement"]
        everywhere = (sub["all_blocks"] * scale).to_list()
        left.step(t, everywhere, where="post", color=color, label=f"{name}: all replicas")
        if sub["replica_blocks"].null_count() == 0:
            busiest = (sub["replica_blocks"] * scale).to_list()
            dashed = CACHE_STYLE["off"]
            label = f"{name}: busiest replica"
            left.step(t, busiest, where="post", color=color, linestyle=dashed, label=label)
    for name, cap, style in _caps_lines(caps):
        left.axhline(cap / block_tokens * scale, color="#444444", linestyle=style, label=name)
    figures.log_axis(left)
    left.set_xlabel("time from the run block's first send (modeled s)")
    left.set_ylabel(f"working set ({unit})")
    left.legend(fontsize=7, loc="center right")
    _histogram(right, hist, caps, block_tokens)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=7)
    return fig


def _bin_index(blocks: float) -> float:
    """Where ``blocks`` falls on an axis of power-of-two bins: bin 0 holds 0, bin k >= 1
    holds 2^(k-1) to 2^k - 1 (a bar's centre is its index, so a bin starts at k - 0.5)."""
    return -0.5 if blocks < 1 else math.log2(blocks) + 0.5


def _histogram(
    ax: Any, hist: pl.DataFrame, caps: dict[str, float | None], block_tokens: int
) -> None:
    """Requests per reuse-distance bin, every bin from 0 to the largest capacity drawn,
    so a capacity's line falls where it is."""
    counts = dict(zip(hist["low"].to_list(), hist["requests"].to_list(), strict=True))
    marks = [(n, c / block_tokens, st) for n, c, st in _caps_lines(caps)]
    top = max([*counts, *(int(b) for _, b, _ in marks), 0])
    lows = [0] + [2**k for k in range(int(math.log2(top)) + 1 if top >= 1 else 0)]
    ax.bar(range(len(lows)), [counts.get(v, 0) for v in lows], color=COLORS[0])
    labels = [str(v) if v < 2 else f"{v}-{2 * v - 1}" for v in lows]
    ax.set_xticks(range(len(lows)), labels, rotation=60, fontsize=6)
    ax.set_xlabel("reuse distance (blocks, LRU stack distance)")
    ax.set_ylabel("requests")
    for name, blocks, style in marks:
        ax.axvline(_bin_index(blocks), color="#444444", linestyle=style, label=f"{name} capacity")


def _caps_lines(caps: dict[str, float | None]) -> list[tuple[str, float, str]]:
    """(name, capacity in tokens, line style) of the capacities known."""
    out = []
    for name, key, style in (
        ("replica KV", "replica_kv_tokens", ":"),
        ("pool", "pool_tokens", "-."),
    ):
        cap = caps[key]
        if cap is not None:
            out.append((name, cap, style))
    return out


def reuse_section(run: Run, out_dir: Path, note: str) -> list[Element]:
    """The section's elements for a trace run (figures saved into ``out_dir``); none for
    any other run."""
    if not run.trace:
        return []
    block_tokens = int(_spec(run).get("block_tokens", 512))
    caps = capacities(run)
    lines, why = load_lines(run)
    empty = pl.DataFrame(schema={"trace_line": pl.Int64(), "hash_ids": pl.List(pl.Int64())})
    rows = reuse.with_replica_reuse(run.requests, empty if lines is None else lines, block_tokens)
    arms = reuse.arm_reuse(rows)
    out: list[Element] = [Heading(HEADING), _trace_paragraph(rows)]
    out.append(Table(arms))
    out += [Paragraph(line) for line in _recovered_lines(arms)]
    feet = None if lines is None else reuse.footprint(run.requests, lines)["all_blocks"].max()
    footprint = int(feet) * block_tokens if isinstance(feet, int) else None
    evictions = eviction_text(footprint, caps["pool_tokens"])
    chunk = pool_chunk_tokens(run)
    out += [Paragraph(line) for line in recovery_lines(rows, chunk, block_tokens, evictions)]
    if lines is None:
        out.append(Paragraph(f"Replica share and working set: not enough data: {why}."))
    out += [Heading("Reuse distance", 3), *_distance_part(rows, caps, block_tokens)]
    hist = reuse.distance_histogram(rows)
    if lines is not None:
        out.append(Heading("Working set against capacity", 3))
        elements, ws = _working_part(run, lines, caps, block_tokens)
        out += elements
        fig = _figure(ws, hist, caps, block_tokens, note)
        png = figures.save_png_svg(fig, out_dir, "reuse")[0]
        out.append(Image(png, "working set over time against capacity; reuse distances"))
    out += [Heading("Definitions", 3), definitions(block_tokens)]
    return out
