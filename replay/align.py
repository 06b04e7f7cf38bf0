"""Align two traces: sequences by token content, then rows by (pos, depth).

Serving and training record the same sequences in different batch layouts, row orders and
request ids, so nothing but the tokens is trusted: a sequence pairs with the other side's
sequence whose tokens are equal, or one a prefix of the other (a replay may stop early).
Rows then pair on ``(pos, depth)`` within the common length. Serving records depth > 0 only
along drafted paths, so alignment is sparse there; ``coverage`` says how sparse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from specdiff.tracer.errors import SpecdiffError

T = TypeVar("T")


class AlignmentError(SpecdiffError):
    """The two traces cannot be aligned (no common sequence)."""


@dataclass(frozen=True)
class Pair(Generic[T]):
    """Something that exists once per side: ``x`` (side A, e.g. training), ``y`` (side B, serving)."""

    x: T
    y: T

    def map(self, fn) -> Pair:
        return Pair(fn(self.x), fn(self.y))


@dataclass(frozen=True)
class SeqPair:
    """Two aligned sequences: ids on each side and the common token length."""

    index: int  # position in Alignment.seq_pairs, the "seq" the report shows
    seq: Pair[int]
    length: int
    prompt_len: int


@dataclass(frozen=True)
class Alignment:
    """Which sequences pair up, and which did not (a plan: printable, no tensors)."""

    seq_pairs: tuple[SeqPair, ...]
    unmatched: Pair[tuple[int, ...]]

    def summary(self) -> str:
        return (f"{len(self.seq_pairs)} aligned sequences; unmatched: {len(self.unmatched.x)} on A, "
                f"{len(self.unmatched.y)} on B")


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


def align_sequences(traces: Pair, *, min_common: int = 2) -> Alignment:
    """Pair sequences of two traces by token content.

    A pair needs one side's tokens to be a prefix of the other's (equal included), with at least
    ``min_common`` tokens. Each sequence pairs at most once; the longest common prefix wins.

    Raises:
        AlignmentError: the traces share no sequence (one line naming both paths).
    """
    xs, ys = traces.x.sequences, traces.y.sequences
    by_head: dict[tuple, list] = {}
    for s in ys:
        by_head.setdefault(tuple(s.tokens[:min_common].tolist()), []).append(s)
    used: set[int] = set()
    pairs: list[SeqPair] = []
    unmatched_x: list[int] = []
    for sx in xs:
        best, best_len = None, 0
        for sy in by_head.get(tuple(sx.tokens[:min_common].tolist()), ()):
            if sy.id in used:
                continue
            n = _common_prefix(sx.tokens, sy.tokens)
            if n == min(len(sx.tokens), len(sy.tokens)) and n > best_len:
                best, best_len = sy, n
        if best is None or best_len < min_common:
            unmatched_x.append(sx.id)
            continue
        used.add(best.id)
        pairs.append(SeqPair(len(pairs), Pair(sx.id, best.id), best_len,
                             min(sx.prompt_len, best.prompt_len, best_len)))
    if not pairs:
        raise AlignmentError(
            f"{traces.x.path} and {traces.y.path} share no token sequence ({len(xs)} vs {len(ys)} "
            "sequences): record the training side with `specdiff record train --replay SERVE_TRACE`")
    unmatched_y = tuple(s.id for s in ys if s.id not in used)
    return Alignment(tuple(pairs), Pair(tuple(unmatched_x), unmatched_y))


@dataclass(frozen=True)
class RowMatch:
    """Row pairing of one tensor: ``rows.x[i]`` on A pairs with ``rows.y[i]`` on B.

    ``pair``/``pos``/``depth`` [n] int give the aligned key of each pair (``pair`` indexes
    Alignment.seq_pairs). ``only`` counts rows present on one side only (within common length).
    """

    rows: Pair[np.ndarray]
    pair: np.ndarray
    pos: np.ndarray
    depth: np.ndarray
    only: Pair[int]

    @property
    def coverage(self) -> float:
        """Fraction of the rows either side holds that found a partner."""
        n = len(self.pair)
        total = n + max(self.only.x, self.only.y)
        return n / total if total else 1.0


def _keyed(trace, name: str, seq_to_pair: dict[int, tuple[int, int]]):
    keys = trace.keys(name, columns=("seq", "pos", "depth"))
    seq = keys["seq"]
    out = np.full(len(seq), -1, np.int64)
    for s, (pair_idx, length) in seq_to_pair.items():
        sel = (seq == s) & (keys["pos"] < length)
        out[sel] = pair_idx
    valid = out >= 0
    # First occurrence wins when keys repeat (tree siblings at one depth).
    return pack_keys(out, keys["pos"], keys["depth"]), valid


def pack_keys(pair: np.ndarray, pos: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """One sortable int64 per row: pair << 40 | pos << 8 | depth (depth < 256, pos < 2**32)."""
    return (pair.astype(np.int64) << 40) | (pos.astype(np.int64) << 8) | depth.astype(np.int64)


def match_rows(traces: Pair, alignment: Alignment, name: str, name_y: str | None = None) -> RowMatch:
    """Pair the rows of tensor ``name`` on (aligned seq, pos, depth).

    ``name_y`` pairs ``name`` on side A with another tensor on side B (e.g. an aux slot against a
    layer probe, for layer identification).

    Rows whose (seq, pos, depth) repeats on one side (several tree branches at one depth) keep
    their first occurrence. Rows beyond a pair's common length are ignored.
    """
    maps = Pair({p.seq.x: (p.index, p.length) for p in alignment.seq_pairs},
                {p.seq.y: (p.index, p.length) for p in alignment.seq_pairs})
    kx, vx = _keyed(traces.x, name, maps.x)
    ky, vy = _keyed(traces.y, name_y or name, maps.y)
    ix, iy = np.nonzero(vx)[0], np.nonzero(vy)[0]
    ux, fx = np.unique(kx[ix], return_index=True)
    uy, fy = np.unique(ky[iy], return_index=True)
    common, cx, cy = np.intersect1d(ux, uy, assume_unique=True, return_indices=True)
    rows_x, rows_y = ix[fx[cx]], iy[fy[cy]]
    order = np.argsort(common, kind="stable")  # (pair, pos, depth) order
    common = common[order]
    return RowMatch(Pair(rows_x[order], rows_y[order]), common >> 40, (common >> 8) & 0xFFFFFFFF,
                    common & 0xFF, Pair(len(ux) - len(common), len(uy) - len(common)))
