"""Whether serving's draft ids are what a re-run's logits give, up to the two kernels' logit noise.

The re-execution (rerun/narrow.py, reexec.py) re-runs the training draft on serving's inputs and
asks whether it reproduces what serving recorded. For float stages that is a relative error; for
the id stages (``draft.logits_topk.ids``, ``draft.topk``, ``draft.topk_target``) a plain set
comparison fails a row on any id, and a random or barely trained draft's logits are nearly flat,
so the id at rank k is often a near tie that the re-run's kernel (torch on the CPU, fp32 or bf16)
and the engine's kernel round into different ids. Measured on ``make test-seeds`` seed 2's tiny
DeepSeek-V3 pair: the re-run on serving's inputs reproduced ``draft.hidden_out`` (mean rel 0.007)
and 16 of the 17 failing ``draft.logits_topk.ids`` rows; the 17th held another id at rank 8 whose
logit sat within the row's measured logit noise of the boundary, and the stage was "proven" the
first divergence.

The proof used here has the re-run's whole logit row ``L`` [Vd] (not only its top ids) and
serving's recorded top-K logits (``draft.logits_topk.ids`` / ``.values``) at the same row. The
row's kernel noise ``eps`` is measured, not assumed: the largest ``|L[i] - serving[i]|`` over
serving's K ids, at most ``FLOOR_RATIO`` (judge/shift.py) times the re-run's own logit error on those ids
between its precision and the other one (rerun/limits.py measures it on the rows judged), so a wrong
draft cannot widen its own band. Capped at the values' tolerance instead (as where the own error is not
measured), a draft whose logits serving shifted by 3 % -- inside the 5 % bf16 tolerance, 7x a bf16
rounding -- had that shift as its band and the ids it moved read as ties, while an ill-conditioned row of
a correct pair whose own bf16 logits move by more than the tolerance was no tie (Qwen3-MoE correct pair,
seed 2, prompts 8-15: a rank-8 id 0.81 above serving's weakest, own error 0.305, tolerance cap 0.29).
Serving's id set ``S`` (k ids) is reproduced when it is the top-k of
some logits within ``eps`` of ``L`` on both sides: every id the re-run ranks in its top-k and
serving does not has ``L[j] - min_{i in S} L[i] <= 2 eps``, or is a near tie of it in the compute
dtype (``tolerance.is_near_tie``), and every id of ``S`` is among serving's recorded top-K logits.
A wrong lm_head, hidden state or vocab map moves logits by far more than that band.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from specdiff.eagle3.vocab_map import hot_token_ids
from specdiff.replay.diff.judge.shift import FLOOR_RATIO
from specdiff.replay.diff.measure.tolerance import compute_dtype, is_near_tie, looser_dtype
from specdiff.replay.diff.runner import LOGITS, computed_rows

TOPK_IDS, TOPK_VALUES = "draft.logits_topk.ids", "draft.logits_topk.values"
ID_STAGES = (TOPK_IDS, "draft.topk", "draft.topk_target")


def is_id_stage(name: str) -> bool:
    """Whether stage ``name`` holds draft ids (compared as sets, judged by the tie proof)."""
    return name in ID_STAGES


def measured_noise(logits: np.ndarray, top_ids: np.ndarray, top_values: np.ndarray, rel: float,
                   own: float | None = None) -> float:
    """The largest ``|logits[i] - top_values[r]|`` over serving's recorded top-K (``top_ids`` int
    [K] draft ids, ``top_values`` float32 [K]); ``logits``: the re-run's float32 [Vd] row. At most
    ``FLOOR_RATIO * own`` where ``own`` (the re-run's own logit error on those ids at the other precision)
    is measured, else at most ``rel`` of the smallest magnitude among serving's recorded logits."""
    ids = top_ids.astype(np.int64)
    if not len(ids):
        return 0.0
    # measured, the row's own noise bounds the band alone: an ill-conditioned row's bf16 logits move by
    # more than the tolerance (0.305 on a 5.8 logit, Qwen3-MoE correct pair, module doc), and serving
    # cannot widen a band the re-run measured on itself; unmeasured, the tolerance bounds it
    cap = FLOOR_RATIO * own if own is not None else rel * float(np.abs(top_values).min())
    return min(float(np.max(np.abs(logits[ids] - top_values))), cap)


def set_reproduced(logits: np.ndarray, served: np.ndarray, top_ids: np.ndarray, top_values: np.ndarray, *,
                   rel: float, dtype: str, own: float | None = None) -> bool:
    """Whether serving's draft ids ``served`` (int [k]) are a top-k of the re-run's ``logits``
    (float32 [Vd]) perturbed by at most the row's measured kernel noise (module doc).

    ``top_ids`` / ``top_values``: serving's recorded ``draft.logits_topk`` row (int [K], float32
    [K], K >= k); ``rel``: the values' relative tolerance; ``dtype``: the draft's compute dtype; ``own``:
    the re-run's own logit noise on the row (``measured_noise``; None: not measured).
    """
    served = served.astype(np.int64).reshape(-1)
    k = len(served)
    recorded = set(top_ids.astype(np.int64).tolist())
    if k == 0 or any(i not in recorded for i in served.tolist()) or int(top_ids.max()) >= len(logits) or top_ids.min() < 0:
        return False  # an id serving chose outside its own recorded top-K, or outside the re-run's vocab
    eps = measured_noise(logits, top_ids, top_values, rel, own)
    floor = float(logits[served].min())  # the re-run's logit of serving's weakest chosen id
    rerun_top = np.argpartition(-logits, k - 1)[:k] if k < len(logits) else np.arange(len(logits))
    for j in set(rerun_top.tolist()) - set(served.tolist()):
        v = float(logits[j])
        # each side's logit may move by eps: j above serving's weakest id by at most 2 eps
        if not (v - floor <= 2 * eps or is_near_tie(v, floor, dtype=dtype)):
            return False
    return True


def rows_reproduced(logits: np.ndarray, served: np.ndarray, top_ids: np.ndarray, top_values: np.ndarray, *,
                    rel: float, dtype: str) -> np.ndarray:
    """``set_reproduced`` row by row: bool [n] for ``logits`` float32 [n, Vd], ``served`` int [n, k],
    ``top_ids`` int [n, K], ``top_values`` float32 [n, K]."""
    return np.array([set_reproduced(logits[r], served[r], top_ids[r], top_values[r], rel=rel, dtype=dtype)
                     for r in range(len(served))], bool)


def to_draft_ids(target_ids: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """Target ids (int [n, k]) -> the draft ids the vocab map sends there (``hot`` int64 [Vd]: each
    draft id's target id, ``vocab_map.hot_token_ids``); -1 where no draft id maps to it."""
    back = {int(t): d for d, t in enumerate(hot.tolist())}
    flat = [back.get(int(t), -1) for t in target_ids.reshape(-1).tolist()]
    return np.asarray(flat, np.int64).reshape(target_ids.shape)


@dataclass
class TieProof:
    """Serving's recorded ``draft.logits_topk`` at the re-run's rows, to tell an id set that only a
    near tie keeps from the re-run's (``set_reproduced``) from one that differs."""

    rows: dict  # (batch row, position) -> (ids int [K], values float32 [K])
    rel: float
    dtype: str
    #: (batch row, position) -> the re-run's own logit error on the row's serving top-K ids at the other
    #: precision (``with_own_noise``); a row missing here is capped at the tolerance only
    own: dict = field(default_factory=dict)

    def with_own_noise(self, keys: list, logits: np.ndarray, other: np.ndarray) -> TieProof:
        """This proof with each row's own logit noise: ``keys`` (batch row, position) of ``rows``, ``logits``
        and ``other`` float32 [n, Vd] the re-run's logits there at its precision and at the other one. The
        noise of a row is the largest ``|logits - other|`` over serving's recorded top-K ids."""
        own = {}
        for r, key in enumerate(keys):
            ids = self.rows[key][0]
            if len(ids) and int(ids.max()) < logits.shape[1] and int(ids.min()) >= 0:
                own[key] = float(np.max(np.abs(logits[r, ids] - other[r, ids])))
        return replace(self, own=own)

    @classmethod
    def load(cls, traces, comparisons: dict, ids, vals, strace) -> TieProof:
        """From serving's ``draft.logits_topk.ids`` / ``.values`` rows at the re-run's positions
        (``ids``, ``vals``: (batch rows, positions, rows) each, or None); ``traces``, ``comparisons``
        (name -> TensorComparison): the diff's."""
        rows = {}
        if ids is not None and vals is not None:
            at = {k: i for i, k in enumerate(zip(vals[0].tolist(), vals[1].tolist(), strict=True))}
            for i, k in enumerate(zip(ids[0].tolist(), ids[1].tolist(), strict=True)):
                if k in at:
                    rows[k] = (ids[2][i].astype(np.int64), vals[2][at[k]])
        comp = comparisons.get(TOPK_VALUES)
        # a side may lack the top-k logits (``record train --capture full`` keeps the whole logits):
        # the dtype is then the serving side's own, or bf16
        sides = [t for t in (traces.x, traces.y) if TOPK_VALUES in t.names]
        dtype = looser_dtype(*(compute_dtype(t, TOPK_VALUES) for t in sides)) if sides else "bfloat16"
        return cls(rows, comp.tolerance.rel if comp is not None else 0.05, dtype)

    def reproduced(self, out, d2t, stage: str, b: np.ndarray, t: np.ndarray, depth: int,
                   served: np.ndarray) -> np.ndarray:
        """bool [n]: serving's id set of ``stage`` at (b, t) is the re-run's top-k up to the row's
        measured logit noise; False where serving recorded no top-k logits there."""
        if not len(b) or not self.rows:
            return np.zeros(len(b), bool)
        logits = computed_rows(out, d2t, LOGITS, b, t, np.full(len(b), depth))
        if stage == "draft.topk_target":
            served = to_draft_ids(served, hot_token_ids(d2t).cpu().numpy())
        got = np.zeros(len(b), bool)
        for r, key in enumerate(zip(b.tolist(), t.tolist(), strict=True)):
            if key in self.rows:
                got[r] = set_reproduced(logits[r], served[r], *self.rows[key], rel=self.rel, dtype=self.dtype,
                                        own=self.own.get(key))
        return got


__all__ = ["ID_STAGES", "TieProof", "is_id_stage", "measured_noise", "set_reproduced", "rows_reproduced",
           "to_draft_ids"]
