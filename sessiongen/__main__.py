"""``python -m sessiongen``."""

from .cli import main

main()
