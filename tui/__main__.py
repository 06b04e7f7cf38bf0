"""``python -m specdiff.tui`` = the ``specdiff`` command."""

from specdiff.tui.cli import main

main()
