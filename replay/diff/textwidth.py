"""The width text output wraps at: the terminal's, or ``DEFAULT_WIDTH`` when the output is not a
terminal. Its own module so ``specdiff info`` wraps as the diff report does without importing the
report (which imports every explain check)."""

from __future__ import annotations

import shutil

#: the width the text report wraps at when the output is not a terminal (tests, pipes, CI logs)
DEFAULT_WIDTH = 120


def output_width(width: int | None = None) -> int:
    """``width`` when given, else the terminal's columns (``DEFAULT_WIDTH`` when not a terminal)."""
    return width or shutil.get_terminal_size((DEFAULT_WIDTH, 40)).columns
