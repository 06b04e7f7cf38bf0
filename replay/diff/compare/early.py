"""The first divergence, said as soon as the rows read so far prove it (before the full statistics).

``compare.first_divergence`` picks, over every diverged tensor, the smallest key
``(depth, stage, not structure, slot, name)`` (``divergence_key``). ``compare_all`` compares tensors
in that dataflow order, and each tensor's rows in order, block after block; this watch says the
first divergence the moment the full-data answer can no longer change. The rule:

1. A tensor T being compared is **surely diverged at depth d** (d = the shallowest depth among
   its aligned rows) once, over the rows read so far, a row at depth d is non-finite, or
   ``failing rows at depth d / all rows at depth d > max_fail_frac`` **and** ``failing rows /
   all rows > max_fail_frac``. Both divide by every aligned row, read or not, readable or not,
   so the fractions can only grow as rows are read: ``TensorComparison.diverged`` and
   ``divergence_depth == d`` will hold on the full data.
2. Its **position is final** once the earliest failing row read so far (position, then
   sequence pair: the order of ``TensorComparison.first_failing_row``) comes before every row at
   depth d not read yet.
3. A candidate (T as above; a tensor compared in full that diverged, with its exact key; a
   ``structure`` finding; a ``tokens`` format finding) is **the first divergence** once its key
   is below the smallest key any tensor not yet compared in full could still get: that tensor's
   shallowest possible depth (the smallest depth its side-A rows hold; 0 for depthless
   tensors) with its stage and name.

Rows that do not judge the tensor (``counted`` False: their inputs already differ upstream,
replay/diff/judge/inherited.py) are left out of both fractions and of the failing rows, as the full
verdict leaves them out; every unread row at depth d, counted or not, still bounds the position
(a non-finite row always counts). A tensor whose failing rows a named cause may still explain
in full (routing.py, decided once all its rows are read) is proven only above the largest
fraction that cause may explain (``max_frac``).

Every step is a bound that the rest of the data can only confirm, so the early answer equals the
full one by construction (tests/replay/diff/compare/test_early_first.py checks it on every scenario pair). When no
candidate is proven before the end, the answer comes with the full data (the watch still says it
then, once, before explanation and narrowing run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specdiff.tracer.schema import sort_key


def divergence_key(name: str, *, kind: str, depth: int) -> tuple:
    """The first-divergence order of a diverged tensor: draft depth, stage, structure findings
    before value findings within a stage, aux slot, name (``compare.first_divergence``)."""
    stage, sub, n = sort_key(name)
    return (depth, stage, kind != "structure", sub, n)


@dataclass(frozen=True)
class EarlyFirst:
    """The first divergence as proven early: tensor ``name``, finding ``kind`` (values, structure,
    tokens), and ``where`` (``{"pair", "pos", "depth"}``, aligned keys; None for structure),
    equal to the full report's ``first.name``, ``first.kind`` and ``first.first_where``
    (``first.worst``'s keys for a tokens finding)."""

    name: str
    kind: str
    where: dict | None

    def verdict(self) -> str:
        """One line, as the full report's verdict opens (without the explanation, not known yet)."""
        if self.kind == "structure" or self.where is None:
            return f"first divergence: {self.name} (structure)"
        w = self.where
        depth = f" depth {w['depth']}" if w.get("depth") else ""
        return f"first divergence: {self.name} at seq {w['pair']} pos {w['pos']}{depth}"


class _Running:
    """Counters of the tensor being compared (rule 1 and 2 of the module doc)."""

    def __init__(self, name: str, tolerance, match, counted=None, max_frac=None):
        self.name = name
        self.max_frac = tolerance.max_fail_frac if max_frac is None else max(max_frac, tolerance.max_fail_frac)
        depth = np.asarray(match.depth)
        self.counted = np.ones(len(depth), bool) if counted is None else np.asarray(counted, bool)
        self.n = int(self.counted.sum())
        self.d = int(depth.min()) if len(depth) else 0
        at_d = depth == self.d
        self.n_d = int((at_d & self.counted).sum())
        width = int(match.pair.max()) + 1 if self.n else 1
        # packed (pos, pair) of rows at depth d, +inf elsewhere; suffix minimum = earliest unread row
        packed = np.where(at_d, match.pos.astype(np.int64) * width + match.pair, np.iinfo(np.int64).max)
        self.width = width
        self.suffix_min = np.r_[np.minimum.accumulate(packed[::-1])[::-1], np.iinfo(np.int64).max]
        self.packed = packed
        self.fail = self.fail_d = 0
        self.nonfinite_d = False
        self.best = np.iinfo(np.int64).max  # earliest failing row at depth d so far (packed)
        self.read = 0

    def add(self, a: int, b: int, fail: np.ndarray, nonfinite: np.ndarray) -> None:
        at_d = self.packed[a:b] != np.iinfo(np.int64).max
        fail = fail & (self.counted[a:b] | nonfinite)
        self.fail += int(fail.sum())
        self.fail_d += int((fail & at_d).sum())
        self.nonfinite_d |= bool((nonfinite & at_d).any())
        hit = self.packed[a:b][fail & at_d]
        if len(hit):
            self.best = min(self.best, int(hit.min()))
        self.read = b

    def proven(self) -> dict | None:
        """``where`` when this tensor surely diverges at depth d at a final position, else None."""
        diverged = self.nonfinite_d or (self.fail / self.n > self.max_frac if self.n else False)
        at_depth = self.nonfinite_d or (self.fail_d / self.n_d > self.max_frac if self.n_d else False)
        if not (diverged and at_depth) or self.best == np.iinfo(np.int64).max:
            return None
        if self.best >= self.suffix_min[self.read]:
            return None
        return {"pair": int(self.best % self.width), "pos": int(self.best // self.width), "depth": self.d}


class FirstDivergenceWatch:
    """Follows ``compare_all`` and calls ``on_first(EarlyFirst)`` once, as soon as the first
    divergence is proven (module doc); ``first`` holds it afterwards.

    Args:
        pending: tensor name -> the shallowest depth it could diverge at (rule 3), for every
            tensor still to be compared.
        known: findings known before any row is read: ``structure`` and ``tokens`` comparisons.
        on_first: callback (may be None).
    """

    def __init__(self, *, pending: dict[str, int], known: list, on_first: Callable | None):
        self.on_first = on_first
        self.first: EarlyFirst | None = None
        self.pending = {n: divergence_key(n, kind="values", depth=d) for n, d in pending.items()}
        self.candidates: list[tuple[tuple, EarlyFirst]] = []
        for c in known:
            where = None if c.kind == "structure" else {k: c.worst[k] for k in ("pair", "pos", "depth")}
            self.candidates.append((divergence_key(c.name, kind=c.kind, depth=0), EarlyFirst(c.name, c.kind, where)))
            self.pending.pop(c.name, None)  # a tokens finding replaces the tokens row comparison
        self.running: _Running | None = None

    def start(self, name: str, tolerance, match, *, counted=None, max_frac=None) -> None:
        """Tensor ``name`` starts being compared over ``match`` (its aligned rows); ``counted``:
        bool [n], the rows that judge it (None: all); ``max_frac``: prove a divergence only above
        this fail fraction (a named cause may explain up to it; None: the tolerance's)."""
        self.running = _Running(name, tolerance, match, counted, max_frac) if name in self.pending else None
        self._check()

    def block(self, a: int, b: int, fail: np.ndarray, nonfinite: np.ndarray) -> None:
        """Rows [a, b) of the running tensor are compared: ``fail`` / ``nonfinite`` bool [b - a]."""
        if self.running is not None and self.first is None:
            self.running.add(a, b, fail, nonfinite)
            self._check()

    def finished(self, comp) -> None:
        """The running tensor's full ``TensorComparison``."""
        if comp.name in self.pending:
            self.pending.pop(comp.name)
            if comp.diverged:
                key = divergence_key(comp.name, kind=comp.kind, depth=comp.divergence_depth)
                self.candidates.append((key, EarlyFirst(comp.name, comp.kind, comp.first_where)))
        self.running = None
        self._check()

    def done(self) -> None:
        """Every tensor is compared: whatever candidate is smallest is the answer."""
        self.pending.clear()
        self.running = None
        self._check()

    def _check(self) -> None:
        if self.first is not None:
            return
        cands = list(self.candidates)
        r = self.running
        where = r.proven() if r is not None else None
        if where is not None:
            cands.append((divergence_key(r.name, kind="values", depth=r.d), EarlyFirst(r.name, "values", where)))
        if not cands:
            return
        key, first = min(cands, key=lambda c: c[0])
        others = [k for n, k in self.pending.items() if where is None or n != r.name]
        if all(key < k for k in others):
            self.first = first
            if self.on_first is not None:
                self.on_first(first)


__all__ = ["EarlyFirst", "FirstDivergenceWatch", "divergence_key"]
