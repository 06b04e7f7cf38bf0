"""The per-row relative error every comparison of two row sets uses: ``||x - y|| / max(||x||, ||y||)``.

One definition for the diff (replay/diff/measure/metrics.py ``relative_error``, and its streamed form
in compare/blocks.py) and for ``record train``'s noise floor (replay/record/noise_floor.py), which
measures the same quantity between its own bf16 and float32 runs: a floor in another metric would
not bound what the diff measures.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EPS", "relative_error"]

#: the norm below which a row counts as zero (two zero rows: error 0)
EPS = 1e-12


def relative_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 [n]: ``||x - y|| / max(||x||, ||y||)`` per row of ``x``, ``y`` [n, ...] (any float dtype,
    computed in float32; symmetric; 0 for two zero rows)."""
    fx = x.reshape(x.shape[0], -1).astype(np.float32)
    fy = y.reshape(y.shape[0], -1).astype(np.float32)
    num = np.linalg.norm(fx - fy, axis=1)
    den = np.maximum(np.maximum(np.linalg.norm(fx, axis=1), np.linalg.norm(fy, axis=1)), EPS)
    return (num / den).astype(np.float32)
