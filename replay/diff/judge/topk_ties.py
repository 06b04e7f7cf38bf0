"""Top-k boundary near-ties: a named, legitimate difference in the draft's top-k id sets.

The draft keeps the k largest logits of each row (``draft.logits_topk.ids``, k = the capture's
``logits_topk``; ``draft.topk``, k = the speculative topk). Two engines compute those logits with
different bf16 rounding, so when the k-th and (k+1)-th logits are a near tie
(``tolerance.is_near_tie``) each side keeps another id at rank k: the id *sets* differ while every
logit agrees within noise. A random or barely trained draft has nearly flat logits, so this is
common (measured: random drafts on tiny Qwen3 / Qwen3-MoE / DeepSeek-V3 targets served by SGLang
0.5.23: 10-22 of 144 ``draft.logits_topk.ids`` rows, every swap at rank 8 of 8, the two logits
equal or one bf16 step apart).

``boundary_ties`` names a failing row when every id that one side holds and the other does not
has, on its own side, a logit within a near tie of the *other* side's k-th logit: swapping it in
or out is a rounding decision at the boundary. The tie band is the wider of the bf16 near tie and
the row's own *measured* logit disagreement: the largest difference between the two sides' logits
of the ids both hold, at most the tensor's relative tolerance of the k-th logit. When the draft's
inputs differ within tolerance (on an MoE target, routing near-ties carried by the target's
attention move aux rows by a few percent: measured on tiny DeepSeek-V3, 38 of 144 rows with swaps
0.0625 from the k-th logit 1.844, shared ids' logits up to 0.07 apart), the logits move by that
much and so may the ids at the boundary; an id the other side's logits also rank there is not a
difference of its own. A tie holds on both sides: where the other side recorded the swapped id's
logit, or kept more logits than ids (then the id lies at most at its last recorded logit), that
logit must sit at the other side's k-th within the same band. A wrong lm_head, hidden state or vocab map moves
ids by far more than a tie at some rank, so any such row is left to the tolerance and the
tensor's verdict. ``draft.topk_target`` (the same ids mapped to target ids) inherits the named
rows from ``draft.topk`` (replay/diff/judge/inherited.py: explained rows are a source).

The target's greedy token (``target.argmax``, k = 1) is judged the same way against both sides'
``target.logits_topk`` (tracer/engines/target_logits.py says why they are recorded; compare.py
``SKIP`` why they are not compared themselves), named ``target_greedy_near_tie``, row by row
(``partial``): a random target's logits are as flat as a random draft's (measured on ``make
test-seeds`` seed 2's tiny DeepSeek-V3 pair: half its positions within 0.055 of their runner-up, 19
of 180 greedy tokens flipped where every aux row agreed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.measure.tolerance import compute_dtype, is_near_tie, looser_dtype
from specdiff.replay.diff.types import row_lines

#: the id tensors chosen from a model's logits -> the recorded top-k logits they are judged by
#: (values, ids): the draft's top-k ids, and the target's greedy token (module doc)
LOGITS_OF = {"draft.logits_topk.ids": ("draft.logits_topk.values", "draft.logits_topk.ids"),
             "draft.topk": ("draft.logits_topk.values", "draft.logits_topk.ids"),
             "target.argmax": ("target.logits_topk.values", "target.logits_topk.ids")}
JUDGED = tuple(LOGITS_OF)


@dataclass(frozen=True)
class TopkBoundaryTies:
    """Rows of one id tensor whose sets differ only by near-tie swaps at rank k (JSON-safe).

    Attributes:
        tensor: ``draft.logits_topk.ids``, ``draft.topk`` or ``target.argmax``.
        rows: ``[{"seq", "pos", "depth", "rank", "gap"}]``: the swap's rank (k, 1-based) and the
            largest logit gap between a swapped id and the other side's k-th logit, and the row's
            measured logit disagreement (``_measured_noise``), in logit units.
        fraction: explained rows / counted rows; dtype: the compute dtype the ties were judged in.
    """

    tensor: str
    rows: list
    fraction: float
    dtype: str
    partial: bool = False

    def explains(self, comp) -> np.ndarray | None:
        """bool [n]: the rows of ``comp`` named (``rows``) when only some failing rows are
        (``partial``); None: every failing row whose inputs agree."""
        if not self.partial:
            return None
        named = {(r["seq"], r["pos"], r["depth"]) for r in self.rows}
        m = comp.match
        return np.fromiter(((int(a), int(b), int(c)) in named for a, b, c in zip(m.pair, m.pos, m.depth, strict=True)),
                           bool, len(m.pair))

    @property
    def cause(self) -> str:
        """The explanation's name in reports: the target's own near ties are their own kind."""
        if self.tensor.startswith("target."):
            return "target_greedy_near_tie"
        return "topk_boundary_near_tie"

    @property
    def message(self) -> str:
        """One sentence: how many rows, and that each swap is a tie at rank k."""
        gap = max((r["gap"] for r in self.rows), default=0.0)
        if self.tensor.startswith("target."):
            return (f"target greedy near-ties: {len(self.rows)} {self.tensor} row(s) ({self.fraction:.1%} of the rows "
                    f"whose inputs agree) hold another id where its logit is within a {self.dtype} near tie, or the "
                    f"row's measured target logit disagreement, of the other side's (largest gap {gap:.3g}): the "
                    "target's own logits tie there, the two kernels round them apart")
        return (f"top-k boundary near-ties: {len(self.rows)} {self.tensor} row(s) ({self.fraction:.1%} of the rows "
                f"whose inputs agree) keep another id at the last rank only; each swapped id's logit is within a "
                f"{self.dtype} near tie, or the row's measured logit disagreement, of the other side's k-th logit "
                f"(largest gap {gap:.3g})")

    def evidence(self, limit: int = 8) -> list[str]:
        """The first ``limit`` named rows (seq, pos, depth, rank, gap), then how many more."""
        return row_lines(self.rows, lambda r: (f"seq {r['seq']} pos {r['pos']} depth {r['depth']}: swap at rank "
                                               f"{r['rank']}, gap {r['gap']:.3g}"), limit)


def _logit_rows(trace, name: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids [n, K], values float32 [n, K]) of the top-k logits ``name`` is chosen from
    (``LOGITS_OF``) at the rows of ``name`` given (matched by seq / pos / depth), or None when some
    row has no top-k logits on this side."""
    values_name, ids_name = LOGITS_OF[name]
    if values_name not in trace.names or ids_name not in trace.names:
        return None
    cols = ("seq", "pos", "depth")
    want = trace.keys(name, columns=cols)
    have = trace.keys(values_name, columns=cols)
    # First occurrence wins, as in align.match_rows: tree siblings at one depth repeat a key, and
    # the row compared is the first one recorded (a last-wins table read a sibling's logits).
    index: dict = {}
    for i, k in enumerate(zip(*(have[c] for c in cols))):
        index.setdefault(k, i)
    at = [index.get(k) for k in zip(*(want[c][rows] for c in cols))]
    if any(i is None for i in at):
        return None
    at = np.asarray(at, np.int64)
    return trace.take(ids_name, at), trace.take_float(values_name, at)


def _measured_noise(x_ids: np.ndarray, x_values: np.ndarray, y_ids: np.ndarray, y_values: np.ndarray) -> float:
    """The largest |x - y| between the two sides' logits of the ids both rows hold (``ids`` int64
    [K], ``values`` float32 [K], one row of ``draft.logits_topk`` each); 0.0 when they share none."""
    common, xi, yi = np.intersect1d(x_ids, y_ids, return_indices=True)
    return float(np.max(np.abs(x_values[xi] - y_values[yi]))) if len(common) else 0.0


def boundary_ties(traces, comp, candidates: np.ndarray, counted: np.ndarray | None, *,
                  dtype: str, partial: bool = False) -> TopkBoundaryTies | str | None:
    """The near-tie explanation of ``candidates`` (bool [n]: the failing rows of ``comp``, an id
    tensor of ``JUDGED``, whose inputs agree); when any does not fit (module doc) nothing is
    explained and the answer is why, in words; None when ``comp`` is not judged or nothing fails.
    ``partial``: the rows that fit are named and the others left to count (why the first did not
    fit is the answer only when none fits): the target's greedy token, whose rows after an MoE
    router flip read another context and flip by more than a tie (judge/inherited.py).

    ``traces``: the diff's Pair of traces; ``counted``: bool [n], the rows whose inputs agree
    (None: all); ``dtype``: the draft's compute dtype (the looser side's), e.g. ``bfloat16``.
    """
    if comp.name not in JUDGED or not candidates.any():
        return None
    idx = np.nonzero(candidates)[0]
    m = comp.match
    x_ids, y_ids = traces.x.take(comp.name, m.rows.x[idx]), traces.y.take(comp.name, m.rows.y[idx])
    lx = _logit_rows(traces.x, comp.name, m.rows.x[idx])
    ly = _logit_rows(traces.y, comp.name, m.rows.y[idx])
    if lx is None or ly is None:
        return (f"a side lacks {LOGITS_OF[comp.name][0].rsplit('.', 1)[0]} at these rows, so the logits at the "
                "boundary cannot be read")
    k = x_ids.reshape(len(idx), -1).shape[1]
    if lx[1].shape[1] < k or ly[1].shape[1] < k:
        return f"fewer top-k logits recorded than {comp.name}'s {k} ids"
    rows, misfit = [], None
    for r, i in enumerate(idx):
        where = f"seq {int(m.pair[i])} pos {int(m.pos[i])} depth {int(m.depth[i])}"
        got = _row_tie(x_ids[r], y_ids[r], (lx[0][r], lx[1][r]), (ly[0][r], ly[1][r]), k, comp.tolerance.rel,
                       dtype, where)
        if isinstance(got, str):
            if not partial:
                return got
            misfit = misfit or got
            continue
        rows.append({"seq": int(m.pair[i]), "pos": int(m.pos[i]), "depth": int(m.depth[i]), "rank": k, "gap": got[0],
                     "noise": got[1]})
    if not rows:
        return misfit
    total = int(counted.sum()) if counted is not None else len(m.pair)
    return TopkBoundaryTies(comp.name, rows, len(rows) / total if total else 1.0, dtype, partial and misfit is not None)


def _row_tie(x_ids, y_ids, lx, ly, k: int, rel: float, dtype: str, where: str) -> tuple[float, float] | str:
    """(largest gap, measured noise) of one failing row whose id sets differ only by near ties at
    rank k, or why not in words. ``x_ids`` / ``y_ids``: the row's ids on each side; ``lx`` / ``ly``:
    (ids [K], values float32 [K]) of each side's recorded top-K logits there; ``rel``: the ids'
    relative tolerance (caps the band); ``where``: the row, for the reason."""
    gap, noise = 0.0, _measured_noise(lx[0], lx[1], ly[0], ly[1])
    for own_ids, their_ids, own_logits, other in ((x_ids, y_ids, lx, ly), (y_ids, x_ids, ly, lx)):
        theirs = set(their_ids.reshape(-1).tolist())
        kth = float(other[1][k - 1])
        band = min(noise, rel * abs(kth))
        for t in own_ids.reshape(-1).tolist():
            if t in theirs:
                continue
            at = np.nonzero(own_logits[0] == t)[0]
            if not len(at):
                return f"id {t} at {where.rsplit(' depth', 1)[0]} is not among its side's top-k logits"
            v = float(own_logits[1][at[0]])
            if not (is_near_tie(max(v, kth), min(v, kth), dtype=dtype) or abs(v - kth) <= band):
                return (f"{where}: id {t}'s logit {v:.4g} is {abs(v - kth):.3g} from the other side's k-th logit "
                        f"{kth:.4g}, more than a {dtype} near tie and the row's measured logit disagreement {band:.3g}")
            gap = max(gap, abs(v - kth))
            # A tie is a tie on both sides: on the other side this id must sit at the boundary too. Its
            # logit there is recorded, or, when that side kept more logits (K) than ids (k), at most its
            # K-th logit (it was not among them): a greedy token the other side ranks below 8 others is
            # no tie, however close the two maxima are. With K = k nothing bounds it (the boundary).
            there = np.nonzero(other[0] == t)[0]
            if len(there) or len(other[0]) > k:
                w = float(other[1][there[0]]) if len(there) else float(np.min(other[1]))
                if not (is_near_tie(max(w, kth), min(w, kth), dtype=dtype) or abs(kth - w) <= band):
                    said = (f"on the other side {w:.4g}" if len(there)
                            else f"on the other side at most {w:.4g} (not among its {len(other[0])} top logits)")
                    return (f"{where}: id {t}'s logit {said} is {abs(kth - w):.3g} from that side's k-th logit "
                            f"{kth:.4g}, more than a {dtype} near tie and the row's measured logit disagreement "
                            f"{band:.3g}")
                gap = max(gap, abs(kth - w))
    return gap, noise


class TiesJudge:
    """``boundary_ties`` as a judge (judge/__init__.py ``JUDGES``), in the draft's looser compute
    dtype; why the rows were not named, when not, goes to the tensor's ``stats["ties_not_named"]``."""

    def applies(self, name: str, scene) -> bool:
        # the target's ids only where both sides recorded its top-k logits (traces recorded before
        # target.logits_topk are judged by their rows, as they always were)
        if name.startswith("target.") and name in JUDGED:
            values = LOGITS_OF[name][0]
            return all(values in t.names for t in (scene.traces.x, scene.traces.y))
        return name in JUDGED

    def watch_frac(self, tolerance) -> float:
        return 1.0

    def bind(self, name: str, scene):
        traces, counted = scene.traces, scene.counted

        def judge(comp, candidates):
            dtype = looser_dtype(compute_dtype(traces.x, comp.name), compute_dtype(traces.y, comp.name))
            got = boundary_ties(traces, comp, candidates, counted, dtype=dtype, partial=comp.name == "target.argmax")
            if isinstance(got, str):
                comp.stats["ties_not_named"] = got
                return None
            return got
        return judge


__all__ = ["TopkBoundaryTies", "boundary_ties", "JUDGED"]
