"""``sessiongen trace-info``: what a Mooncake-style trace implies."""

from __future__ import annotations

import click

from sessiongen.cli.common import BLOCK_TOKENS_OPTION


@click.command("trace-info")
@click.argument("trace_file", type=click.Path(dir_okay=False))
@BLOCK_TOKENS_OPTION
@click.option("--limit", type=click.IntRange(min=1), help="Read at most this many requests.")
@click.option(
    "--speedup",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Divide arrivals and delays by this, as sessions.trace.speedup does in a replay "
    "(the last arrival printed is the replay's).",
)
def trace_info(trace_file: str, block_tokens: int, limit: int | None, speedup: float) -> None:
    """Check a Mooncake-style JSONL trace line by line and say what it implies.

    Prints its requests, sessions, span, token counts, the longest prompt, and the share
    of prompt tokens an infinite prefix cache would have served (leading blocks whose
    hash id an earlier request had). A bad line is one error naming the line and field.
    """
    from sessiongen.workload.trace import read_trace
    from sessiongen.workload.tracestats import summarize

    stream = read_trace(trace_file, block_tokens=block_tokens, limit=limit, speedup=speedup)
    s = summarize(stream, block_tokens)
    single = f" ({s.single_requests:,} of one request: no session_id)" if s.single_requests else ""
    click.echo(
        f"{trace_file}: {s.requests:,} requests, {s.sessions:,} sessions{single}, "
        f"last arrival at {s.span_ms / 1000:,.1f} s\n"
        f"input tokens {s.input_tokens:,} (longest {s.longest_input:,}, line "
        f"{s.longest_line}), output tokens {s.output_tokens:,}\n"
        f"{s.distinct_blocks:,} distinct blocks of {block_tokens}; an infinite prefix cache "
        f"serves {s.reusable_share:.1%} of input tokens"
    )
