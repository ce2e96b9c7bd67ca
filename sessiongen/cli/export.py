"""``sessiongen export``: a scenario's requests as a trace other tools replay."""

from __future__ import annotations

from pathlib import Path

import click

from sessiongen.cli.common import (
    BLOCK_TOKENS_OPTION,
    SALT_OPTION,
    SERVER_OPTION,
    load_scenario,
    set_option,
)


@click.command("export")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), required=True, help="Trace file to write."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["mooncake"]),
    default="mooncake",
    show_default=True,
    help="Trace format (Mooncake-style JSONL: timestamp/delay, lengths, hash_ids).",
)
@BLOCK_TOKENS_OPTION
@SALT_OPTION
@SERVER_OPTION
@set_option
def export(
    scenario_file: str,
    output: str,
    fmt: str,
    block_tokens: int,
    salt: str,
    server: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Write SCENARIO_FILE's requests as a trace other tools can replay.

    One line per (session, turn): session_id (multi-turn scenarios), timestamp (ms) on a
    session's first turn and delay (ms, the think time) on later ones, input_length,
    output_length and hash_ids of the real token ids, chained so equal ids mean equal
    prefixes. Frozen and no-history modes only.
    """
    from sessiongen.workload.export import write_mooncake

    sc = load_scenario(scenario_file, overrides)
    stats = write_mooncake(sc, salt, Path(output), block_tokens=block_tokens, server_url=server)
    click.echo(
        f"wrote {stats['requests']} requests ({stats['sessions']} sessions, "
        f"{stats['input_tokens']:,} input tokens, {stats['blocks']:,} distinct blocks) "
        f"as a {fmt} trace to {output}"
    )
