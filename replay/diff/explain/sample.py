"""Reading rows for the explanation checks: a memo of the rows each check reads again, a sample of
aligned rows taken in runs of neighbours (chunk by chunk), and the mean relative error of two tensors on it."""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.align.align import match_rows
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.types import Alignment, Pair

MAX_ROWS = 2048
SAMPLE_WINDOWS = 8


class Memo:
    """A trace whose row keys and sampled rows are read once per explanation: the checks read the
    same tensors again and again (an aux slot against every candidate layer), and every other
    attribute is the trace's own. Lives for one ``explain`` call (its memory is the samples and
    the keys of the tensors explained)."""

    def __init__(self, trace):
        self._trace = trace
        self._seen: dict = {}

    def __getattr__(self, name):
        return getattr(self._trace, name)

    def _once(self, key, read):
        if key not in self._seen:
            self._seen[key] = read()
        return self._seen[key]

    def keys(self, name: str, start: int = 0, stop: int | None = None, *, columns=("seq", "pos", "depth", "iter")):
        return self._once(("keys", name, start, stop, tuple(columns)),
                          lambda: self._trace.keys(name, start, stop, columns=columns))

    def take_float(self, name: str, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        return self._once(("float", name, rows.tobytes()), lambda: self._trace.take_float(name, rows))


def sample_rows(m, n=MAX_ROWS, windows=SAMPLE_WINDOWS):
    """At most ``n`` aligned row pairs of RowMatch ``m``: ``rows.x`` int [k], ``rows.y`` int [k].

    Taken as ``windows`` runs of neighbouring rows (by side x's row index) spread over the trace,
    not as ``n`` rows spread evenly: rows are read chunk by chunk, and ``n`` spread rows would sit
    in ``n`` different chunks, decoding the whole tensor for each check (at 1 GiB, 91 of a
    121 s report). A run of neighbours shares a few chunks on side x; side y's matching rows
    are spread at most by its batch interleaving.
    """
    if len(m.pair) <= n:
        return m.rows.x, m.rows.y
    order = np.argsort(m.rows.x, kind="stable")
    run = n // windows
    starts = np.linspace(0, len(order) - run, windows).astype(np.int64)
    idx = np.sort(order[(starts[:, None] + np.arange(run)).reshape(-1)])
    return m.rows.x[idx], m.rows.y[idx]


def mean_rel(traces: Pair, alignment: Alignment, name_x: str, name_y: str) -> tuple[float, int]:
    """Mean row relative error of ``name_x`` (side x) vs ``name_y`` (side y) on aligned rows."""
    m = match_rows(traces, alignment, name_x, name_y)
    if not len(m.pair):
        return float("nan"), 0
    rx, ry = sample_rows(m)
    x, y = traces.x.take_float(name_x, rx), traces.y.take_float(name_y, ry)
    ok = ~(traces.x.unreadable(name_x, rx) | traces.y.unreadable(name_y, ry))  # damaged chunks
    if not ok.any():
        return float("nan"), 0
    return float(metrics.relative_error(x[ok], y[ok]).mean()), int(ok.sum())


def at_depth(m, depth):
    """The rows of RowMatch ``m`` at draft depth ``depth`` (all rows when none is there)."""
    keep = m.depth == (depth or 0)
    if not keep.any():
        return m
    return type(m)(m.rows.map(lambda r: r[keep]), m.pair[keep], m.pos[keep], m.depth[keep], m.only)
