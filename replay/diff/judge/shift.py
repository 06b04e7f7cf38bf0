"""A systematic shift inside the tolerance: most rows well above the pair's own noise floor.

The fixed tolerances (measure/tolerance.py: rel 0.05 for bf16) sit far above rounding noise so
that no correct pair fails; a difference that moves *every* row a little stays under them.
Measured: a serving target with other decoder weights moved every aux row to about twice the
pair's noise and the report said "no divergence". Rounding noise is a property of the pair and the
stage, so the floor is measured, not fixed: ``record train`` re-runs its own forward at the other
precision (replay/record/noise_floor.py) and records, per float tensor, the median per-row
relative error between the two runs. A correct pair's serving rows differ from training's by about
that much (both are bf16 roundings of one float32 computation); measured ratios of the median row
to the floor on correct pairs are in the README (Performance and limits).

A float tensor whose usable rows (counted, readable, finite, not explained by a judge and not moved
by an earlier cached row) have a median relative error at least ``FLOOR_RATIO`` times its floor, on
at least ``MIN_ROWS`` rows, diverges as a *shift*, even with every row inside the tolerance. The
floor is never taken below the rounding of one value at the looser storage dtype
(``ROUNDING_FLOOR``): a stage both sides compute exactly (the embedding slot: floor 0) is then not
called diverged over one rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.tracer.contract import known

__all__ = ["AT_NOISE_RATIO", "FLOOR_RATIO", "MIN_ROWS", "ROUNDING_FLOOR", "Shift", "judge_shift", "pair_floor", "systematic_shift"]

#: median row / floor at which a shift is a divergence ("well above" the noise; see the module doc)
FLOOR_RATIO = 3.0
#: median row / floor up to which a stage inside its tolerance is at the noise, so a recorded fact acting
#: there can be ruled out as changing it (explain/differences.py). Correct pairs measured 0.57-1.3 (README);
#: a draft whose MLP weights differ by 0.3 % sat at 1.69 at draft.hidden_out, under FLOOR_RATIO, while its
#: top-k ids diverged (tests/replay/diff/explain/test_differences_above_noise.py). Between this and
#: FLOOR_RATIO a stage is not called diverged, nor taken as proof that a fact changed nothing there.
AT_NOISE_RATIO = 1.5
#: fewest usable rows a median is judged on
MIN_ROWS = 32
#: relative error of one rounding per storage dtype (half a unit in the last place: 2**-(bits+1)
#: with bits the significand's stored bits), the lowest floor a pair gets
ROUNDING_FLOOR = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


@dataclass(frozen=True)
class Shift:
    """How far a tensor's rows sit above the pair's noise floor (JSON-safe via ``as_dict``).

    Attributes:
        floor: the floor (relative error, a fraction), the larger side's measurement or the rounding
            floor; measured: the side's own words for how (``noise_floor.method``).
        shift: median relative error of the usable rows; ratio: shift / floor.
        above: fraction of the usable rows whose relative error exceeds ``FLOOR_RATIO`` x floor.
        rows: usable rows; fired: the tensor diverges because of the shift.
    """

    floor: float
    measured: str
    shift: float
    ratio: float
    above: float
    rows: int
    fired: bool

    def words(self) -> str:
        """One line: ``median row rel 0.0123 = 4.1x the pair's noise floor 0.003 (...); 93% of rows ...``."""
        return (f"median row rel {self.shift:.3g} = {self.ratio:.1f}x the pair's noise floor {self.floor:.3g} "
                f"({self.measured}); {self.above:.0%} of {self.rows} rows above {FLOOR_RATIO:g}x the floor")

    @property
    def above_noise(self) -> bool:
        """The median row is more than ``AT_NOISE_RATIO`` times the floor: not proof of agreement."""
        return self.ratio > AT_NOISE_RATIO

    def as_dict(self) -> dict:
        return {"floor": self.floor, "measured": self.measured, "shift": self.shift, "ratio": round(self.ratio, 4),
                "above": round(self.above, 4), "rows": self.rows, "fired": self.fired}


def pair_floor(traces, name: str, dtype: str) -> tuple[float, str] | None:
    """(floor, how measured) of tensor ``name`` for this pair, or None when no side measured it.

    Each side's contract ``noise_floor`` (replay/record/noise_floor.py) gives a median per tensor;
    the larger of the two is the pair's (the noisier side bounds what a correct pair can show),
    raised to ``ROUNDING_FLOOR[dtype]`` (``dtype``: the looser storage dtype of the pair).
    """
    found = []
    for trace in (traces.x, traces.y):
        nf = known(trace.contract, "noise_floor", None)
        entry = ((nf or {}).get("tensors") or {}).get(name)
        if entry and entry.get("median_rel") is not None:
            found.append((float(entry["median_rel"]), str(nf.get("method"))))
    if not found:
        return None
    value, method = max(found)
    low = ROUNDING_FLOOR.get(dtype, 0.0)
    if value < low:
        return low, f"one {dtype} rounding; measured {value:.3g}: {method}"
    return value, method


def judge_shift(comp, unread: np.ndarray, context_rows: np.ndarray | None, floor: tuple[float, str]) -> None:
    """Measure a compared float tensor ``comp`` (types.TensorComparison) against the pair's ``floor``
    (``pair_floor``): sets ``comp.shift`` and ``comp.stats["shift"]``, and, when the shift fires on a tensor
    not yet diverged, ``comp.shift_rows`` and ``comp.diverged``. ``unread``: bool [n], rows in damaged
    chunks; ``context_rows``: bool [n] or None, rows an earlier differing cached row moved.

    Usable rows: counted, readable, finite, not context-moved, and before the first row of their sequence
    that a judge explained or that inherits an upstream difference: a routing near-tie's flipped expert
    (GPT-OSS, measured: the rows after it at 3.8x the floor) changes its position's K/V, which every later
    position of the sequence attends to, so the rows after it sit above the floor for a legitimate reason.
    """
    n = len(comp.score)
    usable = (comp.counted if comp.counted is not None else np.ones(n, bool)) & ~unread & ~comp.nonfinite
    if context_rows is not None:
        usable &= ~context_rows
    moved = np.zeros(n, bool)
    for mask in (comp.explained, comp.inherited):
        if mask is not None:
            moved |= mask
    if moved.any():
        pairs = comp.match.pair
        first = np.full(int(pairs.max()) + 1, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, pairs[moved], comp.match.pos[moved].astype(np.int64))
        usable &= comp.match.pos < first[pairs]
    comp.shift = systematic_shift(comp.score, usable, floor)
    if comp.shift is None:
        return
    comp.stats["shift"] = comp.shift.as_dict()
    if comp.shift.fired and not comp.diverged:
        comp.shift_rows = usable & (comp.score > FLOOR_RATIO * comp.shift.floor)
        comp.diverged = True


def systematic_shift(score: np.ndarray, usable: np.ndarray, floor: tuple[float, str]) -> Shift | None:
    """The ``Shift`` of a float tensor's rows: ``score`` float32 [n] per-row relative errors,
    ``usable`` bool [n] the rows that judge it (module doc), ``floor`` from ``pair_floor``.
    None when fewer than ``MIN_ROWS`` rows are usable."""
    rows = int(usable.sum())
    if rows < MIN_ROWS:
        return None
    value, measured = floor
    rel = score[usable]
    median = float(np.median(rel))
    # a floor of 0 (a dtype without a rounding floor, measured exact): any shift is infinitely above it,
    # none is not
    ratio = median / value if value > 0 else (float("inf") if median > 0 else 0.0)
    above = float((rel > FLOOR_RATIO * value).mean())
    return Shift(value, measured, median, ratio, above, rows, fired=ratio >= FLOOR_RATIO)
