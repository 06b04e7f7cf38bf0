"""The messages the diff worker posts to the app (toolong style: small dataclasses): progress,
the early first divergence, the partial grid, the full report, a failure. Textual routes each to
the app's ``on_<name>`` handler (``DiffProgress`` -> ``on_diff_progress``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from specdiff.replay.diff.result import DiffReport
    from specdiff.tui.view import ViewModel

__all__ = ["DiffProgress", "DiffReady", "DiffEarly", "DiffPartial", "DiffFailed"]


@dataclass
class DiffProgress(Message):
    name: str
    done: int
    total: int


@dataclass
class DiffReady(Message):
    report: DiffReport
    vm: ViewModel
    preset: str


@dataclass
class DiffEarly(Message):
    """The first divergence, proven before the full statistics (replay/diff/compare/early.py)."""

    early: object  # replay.diff.compare.early.EarlyFirst


@dataclass
class DiffPartial(Message):
    """The comparisons so far, indexed for the grid (no explanation, contract or acceptance yet)."""

    vm: ViewModel


@dataclass
class DiffFailed(Message):
    message: str

