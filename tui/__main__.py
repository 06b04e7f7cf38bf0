"""``python -m specdiff.tui`` = the ``specdiff`` command."""

from .cli import main

main()
