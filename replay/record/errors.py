"""The one error type of ``specdiff record train``: bad input, said in one line."""

from __future__ import annotations

from specdiff.tracer.errors import SpecdiffError

__all__ = ["RecordTrainError"]


class RecordTrainError(SpecdiffError):
    """Bad input to ``record train`` (one clear line)."""
