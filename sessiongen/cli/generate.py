"""``sessiongen generate``: a scenario's requests as JSON lines."""

from __future__ import annotations

from pathlib import Path

import click

from sessiongen.cli.common import SALT_OPTION, SERVER_OPTION, load_scenario, set_option


@click.command("generate")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), required=True, help="JSONL file to write."
)
@SALT_OPTION
@SERVER_OPTION
@set_option
def generate(
    scenario_file: str, output: str, salt: str, server: str | None, overrides: tuple[str, ...]
) -> None:
    """Write every (session, turn) request of SCENARIO_FILE as JSON lines.

    Each line has session_id, turn, context_tokens, content_tokens, expected and body
    (the exact request body replay sends). Frozen and no-history modes only: live
    history depends on the server's answers.
    """
    from sessiongen.workload.generate import write_jsonl

    sc = load_scenario(scenario_file, overrides)
    stats = write_jsonl(sc, salt, Path(output), server_url=server)
    click.echo(
        f"wrote {stats['requests']} requests ({stats['sessions']} sessions, "
        f"{stats['content_tokens']:,} content tokens) to {output}"
    )
