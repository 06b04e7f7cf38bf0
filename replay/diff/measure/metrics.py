"""Per-row comparison metrics for two aligned blocks of rows (numpy, float32 or int).

All functions take ``x`` and ``y`` of equal shape [n, ...] and return per-row arrays [n], so a
caller can stream row blocks and keep only per-row results (memory bounded by a block).
Non-finite values are never "close": rows holding NaN/Inf on either side are flagged apart.
"""

from __future__ import annotations

import numpy as np

from specdiff.eagle3.row_error import EPS as _EPS
from specdiff.eagle3.row_error import relative_error as relative_error  # the diff's name for it


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def nonfinite_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """bool [n]: the row holds NaN or Inf on either side."""
    return ~(np.isfinite(_flat(x)).all(1) & np.isfinite(_flat(y)).all(1))


def max_abs_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 [n]: max |x - y| over each row's elements."""
    d = np.abs(_flat(x).astype(np.float32) - _flat(y).astype(np.float32))
    return d.max(1) if d.shape[1] else np.zeros(len(d), np.float32)


def cosine(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 [n]: cosine similarity per row (1.0 for two zero rows)."""
    fx, fy = _flat(x).astype(np.float32), _flat(y).astype(np.float32)
    nx, ny = np.linalg.norm(fx, axis=1), np.linalg.norm(fy, axis=1)
    both_zero = (nx < _EPS) & (ny < _EPS)
    c = (fx * fy).sum(1) / np.maximum(nx * ny, _EPS)
    return np.where(both_zero, 1.0, c).astype(np.float32)


def id_overlap(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 [n]: fraction of row x's ids also in row y (top-k overlap; 1.0 = same set).

    For scalar ids ([n]) this is exact match (1.0 / 0.0).
    """
    fx, fy = _flat(x), _flat(y)
    if fx.shape[1] == 1:
        return (fx[:, 0] == fy[:, 0]).astype(np.float32)
    hits = (fx[:, :, None] == fy[:, None, :]).any(2)
    return hits.mean(1).astype(np.float32)


def argmax_agreement(x_ids: np.ndarray, y_ids: np.ndarray) -> np.ndarray:
    """bool [n]: the first (highest) id of each row agrees."""
    return _flat(x_ids)[:, 0] == _flat(y_ids)[:, 0]


def full_logits_argmax_agreement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """bool [n]: argmax of full logit rows agrees."""
    return _flat(x).argmax(1) == _flat(y).argmax(1)


def topk_kl(values_x: np.ndarray, ids_x: np.ndarray, lse_x: np.ndarray,
            values_y: np.ndarray, ids_y: np.ndarray, lse_y: np.ndarray) -> np.ndarray:
    """float32 [n]: KL(P_x || P_y) restricted to x's stored top-k, in nats.

    log-probs are ``values - logsumexp``; an id of x's top-k missing from y's top-k gets y's
    smallest stored log-prob (an upper bound on its true log-prob, so the KL is a lower bound).
    The remaining mass outside x's top-k is lumped into one bucket on both sides.
    """
    lpx = values_x - lse_x[:, None]
    lpy_all = values_y - lse_y[:, None]
    match = ids_x[:, :, None] == ids_y[:, None, :]
    lpy = np.where(match.any(2), (np.where(match, lpy_all[:, None, :], -np.inf)).max(2), lpy_all.min(1)[:, None])
    px, py = np.exp(lpx), np.exp(lpy)
    rest_x = np.clip(1 - px.sum(1), 1e-12, 1)
    rest_y = np.clip(1 - py.sum(1), 1e-12, 1)
    kl = (px * (lpx - lpy)).sum(1) + rest_x * (np.log(rest_x) - np.log(rest_y))
    return np.maximum(kl, 0).astype(np.float32)


def full_kl(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 [n]: KL(softmax(x) || softmax(y)) per row of full logits, in nats."""
    fx, fy = _flat(x).astype(np.float64), _flat(y).astype(np.float64)
    lx = fx - np.logaddexp.reduce(fx, axis=1, keepdims=True)
    ly = fy - np.logaddexp.reduce(fy, axis=1, keepdims=True)
    return np.maximum((np.exp(lx) * (lx - ly)).sum(1), 0).astype(np.float32)
