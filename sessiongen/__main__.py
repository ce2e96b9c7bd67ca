"""``python -m sessiongen``."""

from sessiongen.cli import main

main()
