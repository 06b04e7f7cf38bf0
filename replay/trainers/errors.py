"""The one error type of ``specdiff record train``: bad input, said in one line. It sits with the trainers
(the lower layer: their draft loaders raise it too), and replay/record/ imports it from here."""

from __future__ import annotations

from specdiff.tracer.errors import SpecdiffError

__all__ = ["RecordTrainError"]


class RecordTrainError(SpecdiffError):
    """Bad input to ``record train`` (one clear line)."""
