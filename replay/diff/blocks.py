"""Per-row metrics of one block of aligned rows, computed from raw storage on every core.

A block is read as stored (bf16 as raw uint16 bits, the trace format) and compared in sub-blocks
of ~256 KiB of float32 per side: the bf16 bits are shifted into a reused thread-local float32
buffer (no allocation per block, no copy beyond the decode itself) and every metric pass over a
sub-block runs while it is in the core's cache. Blocks run on a shared thread pool: zarr's chunk
decode (blosc) and numpy's loops release the GIL, so reads and compares overlap on every core.

The per-row arithmetic is the same whatever the block or sub-block size (each row's numbers come
from that row alone), so results do not depend on how the rows were split.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff import metrics
from specdiff.tracer.arrays import from_storage

#: float32 bytes per side of one sub-block: both sides and their difference stay in L2 across the
#: ~7 metric passes (measured on a 1 MiB-L2 EPYC: 512 KiB ~2x faster than 16 MiB blocks)
SUB_BLOCK_BYTES = 512 << 10
#: float32 bytes per side of one block (one read); blocks under glibc's 32 MiB mmap threshold
#: reuse freed memory instead of faulting in fresh pages
BLOCK_BYTES = 16 << 20
#: blocks in flight at once, whatever the core count: bounds peak memory (each block holds both
#: sides' raw rows and small per-row results; ~3 x BLOCK_BYTES at most)
MAX_IN_FLIGHT = 8

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def workers() -> int:
    """Threads comparing blocks: every core this process may run on, or ``SPECDIFF_DIFF_THREADS``."""
    if os.environ.get("SPECDIFF_DIFF_THREADS", "").isdigit() and int(os.environ["SPECDIFF_DIFF_THREADS"]) > 0:
        return int(os.environ["SPECDIFF_DIFF_THREADS"])
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def pool() -> ThreadPoolExecutor:
    """The shared block pool (created on first use; threads live for the process)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="specdiff-block")
        return _pool


def in_flight() -> int:
    """Blocks submitted ahead of the one being consumed (one per core plus one, at most MAX_IN_FLIGHT)."""
    return min(workers() + 1, MAX_IN_FLIGHT)


def block_rows(trace, name: str, cap: int) -> int:
    """Rows per block of ``name``: at most ``cap``, about ``BLOCK_BYTES`` of float32 per side."""
    shape = trace.info(name).shape
    width = int(np.prod(shape)) if shape else 1
    return max(16, min(cap, BLOCK_BYTES // max(4 * width, 1)))


def _buffer(slot: str, shape: tuple[int, int]) -> np.ndarray:
    """A thread-local float32 buffer of ``shape`` (reused across blocks; grows, never shrinks)."""
    size = shape[0] * shape[1]
    buf = getattr(_local, slot, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), np.float32)
        setattr(_local, slot, buf)
    return buf[:size].reshape(shape)


def as_float32(raw: np.ndarray, dtype_name: str, slot: str) -> np.ndarray:
    """float32 [n, width] of raw storage rows [n, ...], exact for bf16 (its bits shifted left by 16)
    and float16, rounded for float64 (what ``Trace.read(as_float32=True)`` returns).

    Returns a view of a reused thread-local buffer (``slot`` names it): valid until this thread's
    next call with the same slot; float32 storage comes back as a view of ``raw`` itself.
    """
    flat = raw.reshape(raw.shape[0], -1)
    if dtype_name == "bfloat16":
        out = _buffer(slot, flat.shape)
        np.left_shift(flat, 16, out=out.view(np.uint32), dtype=np.uint32)
        return out
    if flat.dtype == np.float32:
        return flat
    out = _buffer(slot, flat.shape)
    out[...] = flat
    return out


def float_rows(x: np.ndarray, y: np.ndarray):
    """Per-row (rel error, cosine, exact, nonfinite, max |x - y|) of two float32 blocks [n, w].

    Float rows: one difference array and row dot products (no per-metric copies); NaN/Inf rows
    take the slow path (values zeroed for the metrics, |NaN - y| counted as inf).
    """
    n = len(x)
    fx, fy = x, y
    nx = np.sqrt(np.einsum("ij,ij->i", fx, fx))
    ny = np.sqrt(np.einsum("ij,ij->i", fy, fy))
    # A NaN/Inf element makes its row norm non-finite; only then scan elements (a finite row
    # whose squares overflow is a false candidate that the scan clears).
    bad = not (np.isfinite(nx).all() and np.isfinite(ny).all())
    nonfinite = metrics.nonfinite_rows(x, y) if bad else np.zeros(n, bool)
    bad = bool(nonfinite.any())
    if bad:
        fx, fy = np.nan_to_num(x), np.nan_to_num(y)
        nx = np.sqrt(np.einsum("ij,ij->i", fx, fx))
        ny = np.sqrt(np.einsum("ij,ij->i", fy, fy))
    d = fx - fy
    if not bad:
        np.abs(d, out=d)  # |d|.|d| == d.d exactly; max |d| and "all zero" then need one pass each
    rel = np.sqrt(np.einsum("ij,ij->i", d, d)) / np.maximum(np.maximum(nx, ny), metrics._EPS)
    both_zero = (nx < metrics._EPS) & (ny < metrics._EPS)
    cos = np.where(both_zero, 1.0, np.einsum("ij,ij->i", fx, fy) / np.maximum(nx * ny, metrics._EPS))
    if bad:
        ad = np.abs(np.nan_to_num(x, nan=np.inf) - np.nan_to_num(y, nan=-np.inf))
        rowmax = ad.max(1) if ad.shape[1] else np.zeros(n)
        exact = (x == y).all(1) & ~nonfinite
    else:
        rowmax = d.max(1) if d.shape[1] else np.zeros(n, np.float32)
        exact = rowmax == 0  # finite floats: x == y exactly when x - y == 0 (-0 == +0 as before)
    return rel.astype(np.float32), cos.astype(np.float32), exact, nonfinite, rowmax


@dataclass
class BlockResult:
    """What one block sends back: per-row results for rows [a, b) and the block's worst row.

    ``worst``: (key, row in block, element index, x value, y value) of the row with the largest
    score (non-finite rows first, unreadable rows never), or None when every row is unreadable.
    """

    a: int
    b: int
    score: np.ndarray
    cos: np.ndarray
    exact: np.ndarray
    nonfinite: np.ndarray
    unread: np.ndarray
    max_abs: float
    worst: tuple | None


def _raw_rows(trace, name: str, rows: np.ndarray) -> np.ndarray:
    """Rows of ``name`` in storage dtype; a contiguous ascending run is read as one slice (no
    per-row index selection), which is what aligned rows of one recorder mostly are."""
    if len(rows) and int(rows[-1]) - int(rows[0]) + 1 == len(rows) and bool((np.diff(rows) == 1).all()):
        return trace.read_storage(name, int(rows[0]), int(rows[-1]) + 1)
    return trace.take(name, rows)


def compare_block(traces, name: str, *, kind: str, rows_x: np.ndarray, rows_y: np.ndarray,
                  a: int, b: int) -> BlockResult:
    """Read aligned rows ``rows_x`` / ``rows_y`` (int64 [b - a]) of ``name`` from both traces and
    compare them row by row (thread-safe: run on the block pool).

    Float tensors: relative error and cosine over float32 (bf16 upcast exactly); ids: top-k
    overlap. Rows in a damaged chunk on either side are ``unread`` (found by the read itself).
    """
    rx, ry = _raw_rows(traces.x, name, rows_x), _raw_rows(traces.y, name, rows_y)
    n = b - a
    if kind == "float":
        dx, dy = traces.x.info(name).dtype, traces.y.info(name).dtype
        width = rx.reshape(n, -1).shape[1] if n else 1
        step = max(1, SUB_BLOCK_BYTES // max(4 * width, 1))
        score, cos = np.empty(n, np.float32), np.empty(n, np.float32)
        exact, nonfinite, rowmax = np.empty(n, bool), np.empty(n, bool), np.empty(n, np.float64)
        for s in range(0, n, step):
            e = min(s + step, n)
            out = float_rows(as_float32(rx[s:e], dx, "x"), as_float32(ry[s:e], dy, "y"))
            score[s:e], cos[s:e], exact[s:e], nonfinite[s:e], rowmax[s:e] = out
    else:
        overlap = metrics.id_overlap(rx, ry)
        score, cos = 1 - overlap, np.ones(n, np.float32)
        exact = (rx.reshape(n, -1) == ry.reshape(n, -1)).all(1)
        nonfinite, rowmax = np.zeros(n, bool), None
    # After the read: a read is what finds a chunk damaged.
    unread = traces.x.unreadable(name, rows_x) | traces.y.unreadable(name, rows_y)
    nonfinite &= ~unread
    max_abs = float(rowmax[~unread].max()) if kind == "float" and n and not unread.all() else 0.0
    worst = None
    if n and not unread.all():
        key = np.where(unread, -np.inf, np.where(nonfinite, np.inf, score))
        i = int(key.argmax())
        fx, fy = _row(traces.x, name, rx, i, kind), _row(traces.y, name, ry, i, kind)
        if kind == "float":
            bad = ~np.isfinite(fx) | ~np.isfinite(fy)
            diff = np.where(bad, np.inf, np.abs(np.nan_to_num(fx.astype(np.float64))
                                                - np.nan_to_num(fy.astype(np.float64))))
        else:
            diff = (fx != fy).astype(np.float64)
        e_idx = int(np.argmax(diff)) if diff.size else 0
        worst = (float(key[i]), i, e_idx, float(fx[e_idx]) if fx.size else None,
                 float(fy[e_idx]) if fy.size else None)
    return BlockResult(a, b, score, cos, exact, nonfinite, unread, max_abs, worst)


def _row(trace, name: str, raw: np.ndarray, i: int, kind: str) -> np.ndarray:
    """Row ``i`` of a raw block, flat: float32 for float tensors (as compared), raw ids otherwise."""
    row = raw[i:i + 1]
    if kind == "float":
        row = from_storage(row, trace.info(name).dtype, as_float32=True)
    return row.reshape(-1)


__all__ = ["BlockResult", "compare_block", "float_rows", "as_float32", "block_rows", "pool", "in_flight",
           "workers", "BLOCK_BYTES", "SUB_BLOCK_BYTES"]
