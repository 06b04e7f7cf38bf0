"""A norm before fc on one side only: per-slot RMSNorm of the aux concat makes the fc inputs agree."""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.align.align import match_rows
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.sample import sample_rows
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.types import Alignment, Explanation, Pair, TensorComparison, side_names
from specdiff.tracer.contract import known


def _rmsnorm_chunks(x: np.ndarray, k: int) -> np.ndarray:
    c = x.reshape(len(x), k, -1)
    return (c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6)).reshape(len(x), -1)


def explain_norm_before_fc(traces: Pair, alignment: Alignment, tol: TensorComparison) -> list[Explanation]:
    """``draft.fc_in`` = per-slot RMSNorm(aux_cat) on one side and plain aux_cat on the other?"""
    if "draft.fc_in" not in traces.x.names or "draft.fc_in" not in traces.y.names:
        return []
    labels = side_names(traces)
    m = match_rows(traces, alignment, "draft.fc_in")
    if not len(m.pair):
        return []
    rx, ry = sample_rows(m)
    x, y = traces.x.take_float("draft.fc_in", rx), traces.y.take_float("draft.fc_in", ry)
    k = len(known(traces.y.contract, "aux_hf_indices") or known(traces.x.contract, "aux_hf_indices") or [0, 0, 0])
    # Per-slot normalisation removes both a whole-concat norm (norm_before_fc) and per-slot ones
    # (fc_norm) up to their weights; if that makes the sides agree, a norm is the difference.
    rel = float(metrics.relative_error(_rmsnorm_chunks(x, k), _rmsnorm_chunks(y, k)).mean())
    direct = float(metrics.relative_error(x, y).mean())
    if rel <= tol.tolerance.rel * 4 and direct > tol.tolerance.rel:
        # The normed side's per-row RMS is nearly constant (set by the norm weight); the raw side's varies.
        def spread(a):
            r = np.sqrt((a * a).mean(1))
            return float(r.std() / max(r.mean(), 1e-12))
        lab = labels.x if spread(x) < spread(y) else labels.y
        return [Explanation("norm_before_fc", f"a norm before fc (norm_before_fc / fc_norm) is applied on {lab} only",
                            (f"per-slot RMS-normalised fc inputs agree (rel err {rel:.2e}); raw fc inputs "
                             f"differ (rel err {direct:.2e})",),
                            fix_of("norm_before_fc"))]
    return []
