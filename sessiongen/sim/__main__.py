"""``python -m sessiongen.sim``: the ``sessiongen sim serve`` command (see :mod:`.cli`)."""

import sys

import click

from sessiongen.errors import UserError
from sessiongen.sim.cli import serve_command

if __name__ == "__main__":
    try:
        serve_command.main(prog_name="python -m sessiongen.sim", standalone_mode=False)
    except UserError as exc:
        print(f"python -m sessiongen.sim: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)
