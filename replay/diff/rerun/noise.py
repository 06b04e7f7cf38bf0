"""The limit at which a re-run "reproduces" serving on a float stage: the stage's measured noise, not its tolerance.

The narrowing (rerun/narrow.py) scores each re-run of the training draft by the mean relative error of its
rows against the rows serving recorded at the failing positions, and re-execution (rerun/reexec.py) moves a
stage past as inherited when the re-run on serving's inputs reproduces serving there. Judged at the stage's
tolerance (rel 0.05 for bf16), a re-run that computes something else passes whenever the difference is a
shift inside the tolerance. Measured on the committed demo pair, serving's draft config with
``rms_norm_eps`` 7e-05 (training 1e-06): ``draft.attn_in`` diverges as a shift (4.0x its floor 0.0040, 278
rows above it, all inside 0.05), the re-run with training's eps scored 0.0147 on its failing rows, and the
report said "not a divergence ... inherited from serving's target.aux_cat" although serving's aux rows were
training's own.

A float stage is reproduced when the run's mean row error stays inside the tolerance and its rows' errors,
each in units of that row's noise floor, average at most ``FLOOR_RATIO`` (judge/shift.py: the ratio at which
a shift diverges, so a re-run that only shows the shift that made the stage diverge does not reproduce it).
A row's floor is the larger of

- the pair's floor (judge/shift.py ``pair_floor``: the median per-row error of ``record train``'s forward
  re-run at the other precision, at least one rounding of the looser dtype), and
- the row's own noise: the re-run's own relative error on that row between the recorded precision and the
  other one (the same measurement, on exactly the rows judged). Failing rows are
  a pair's tail, not its median: on the correct Qwen3-MoE family pair (random tiny Qwen3MoeForCausalLM,
  SGLang 0.5.23 on the CPU) the 11 failing ``draft.hidden_out`` rows have a pair floor of 0.0064 but a
  bf16-vs-float32 error of 0.0078-0.127 (median 0.013) in the re-run itself; the re-run on serving's aux
  rows scored 0.0326 against serving, 1.5x the rows' floors on average, training's own inputs 0.0963, 7.5x.
  At the pair floor alone that correct pair would be "proven" divergent (0.0326 = 5.1x 0.0064).

Where the pair's floor is not measured (``record train --no-noise-floor``, traces recorded before the floor
existed) the tolerance alone judges, as before, and ``Limit.words`` says so.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from specdiff.eagle3.row_error import relative_error
from specdiff.replay.diff.judge import stage_floor
from specdiff.replay.diff.judge.shift import FLOOR_RATIO

__all__ = ["Limit", "limit", "other_precision", "row_noise"]


@dataclass(frozen=True)
class Limit:
    """How a re-run's rows of one float stage are judged against serving's at the failing rows.

    Attributes:
        tolerance: the stage's relative tolerance: a run reproduces only with a mean row error inside it.
        floors: float64 [n], each failing row's noise floor (the pair's floor, raised to the row's own noise
            where that is larger), in the order of serving's recorded rows; None where the pair's floor is
            not measured (the tolerance alone judges, as before).
        words: how the limit was set, one clause.
    """

    tolerance: float
    floors: np.ndarray | None
    words: str

    def judge(self, rel: np.ndarray) -> tuple[float | None, bool]:
        """(mean of ``rel`` / the rows' floors, or None where unmeasured; whether the run reproduces serving):
        ``rel`` float [n], the run's per-row relative error against serving's rows. Reproduces: mean error
        inside the tolerance and, where measured, a mean ratio to the rows' floors of at most ``FLOOR_RATIO``."""
        mean = float(rel.mean()) if len(rel) else 0.0
        if self.floors is None or len(rel) != len(self.floors):
            return None, mean <= self.tolerance
        ratio = float((rel / self.floors).mean()) if len(rel) else 0.0
        return ratio, mean <= self.tolerance and ratio <= FLOOR_RATIO


def limit(traces, stage: str, tolerance: float, own: np.ndarray | None, rows: int) -> Limit:
    """The ``Limit`` of float ``stage`` on ``rows`` failing rows of the pair ``traces`` (types.Pair):
    ``tolerance``, and where the pair's floor is measured, each row's floor: the pair's, raised to ``own``
    (float [rows], the re-run's own error at the other precision, ``row_noise``; None: not measured)."""
    pair = stage_floor(stage, traces)
    if pair is None:
        return Limit(tolerance, None, f"the tolerance rel <= {tolerance:g}: the pair's noise floor of {stage} is "
                                      "not measured (record train --no-noise-floor, or a trace older than the floor)")
    floor, how = pair
    floors = np.full(rows, floor, np.float64)
    words = f"{FLOOR_RATIO:g}x the noise floor per row: the pair's {floor:.3g} ({how})"
    if own is not None and len(own) == rows:
        floors = np.maximum(floors, own.astype(np.float64))
        raised = int((own > floor).sum())
        words += (f", raised to the row's own error of the re-run at the other precision on {raised} of {rows} "
                  f"rows (median {float(np.median(own)):.3g})") if raised else ""
    return Limit(tolerance, floors, words)


@contextmanager
def other_precision(model):
    """Draft ``model`` computing at the other precision inside the block (float32 for a bf16/fp16 draft, bf16
    for a float32 one), as replay/record/noise_floor.py re-runs the recorded forward: the same object, its
    tensors cast in place and put back as they were on exit (replay/model/other_precision.py ``cast_whole``:
    no copy of the draft, whose embedding alone is 4.4 GiB at float32 at the Kimi-K2 width)."""
    # imported here: torch loads only where a re-run runs, not with the diff
    from specdiff.replay.model.other_precision import cast_whole, other_dtype

    with cast_whole(model, other_dtype(next(model.parameters()).dtype)) as same:
        yield same


def row_noise(xs: np.ndarray, other: np.ndarray) -> np.ndarray | None:
    """float32 [n]: the per-row relative error between the re-run's rows ``xs`` and the same rows of its
    re-run at the other precision ``other`` (float [n, ...] each; non-finite as 0); None when they differ
    in shape."""
    if xs.shape != other.shape:
        return None
    rel = relative_error(xs, other) if len(xs) else np.zeros(0, np.float32)
    return np.where(np.isfinite(rel), rel, 0.0).astype(np.float32)
