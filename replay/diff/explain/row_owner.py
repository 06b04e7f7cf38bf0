"""Aux rows that belong to another token or request: each diverging row of one side equals, within
tolerance, a *different* row of the other side, so the values are right and their assignment is wrong.

The mistake a capture path makes (anchors-5 B5): SGLang's hidden-state capture under speculative decoding
returned rows of other tokens and of neighbouring requests until PR 28496 (issue 26163); vLLM's
``extract_hidden_states`` reads a continuation token's row from the wrong column (issue 56442, open). Stored
features (``record train --features``) carry such rows into training, and a target replay of the same tokens
(``record train --replay``) shows them. The check finds each failing row's owner (its nearest row of the
other side by cosine, confirmed by the relative error within tolerance) and names:

- ``position_shift`` (the table's row for rows at t equal to rows at t +- 1, named here with the rows and,
  for stored features, the capture's fix): every owner is the same request's row ``d`` positions away;
- ``aux_rows_swapped``: the owners are another request's rows (two requests exchanged rows, or one took
  another's);

with the rows each side holds, as position ranges. A row whose owner is not found keeps the check silent
(the values themselves differ: another check's business).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from specdiff.replay.diff.align.align import match_rows
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.sample import sample_rows
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.types import Alignment, Explanation, Pair, TensorComparison, side_names
from specdiff.tracer.contract import known

__all__ = ["explain_row_owners"]

#: culprit rows examined (the failing ones of the sample) and reference rows searched at most
MAX_FAILING, MAX_CANDIDATES = 512, 16384
#: width of the projection the owner search runs on (``_nearest``)
SEARCH_DIMS = 256
#: share of the failing rows whose owner must be found for the check to speak
MIN_OWNED = 0.9


def _culprit_is_y(traces: Pair) -> bool:
    """The side whose rows are suspected: the one recorded from stored features (contract ``features``), the
    serving side against training, else B."""
    feats = traces.map(lambda t: known(t.contract, "features") is not None)
    if feats.x != feats.y:
        return feats.y
    if traces.x.side != traces.y.side:
        return traces.y.side == "serve"
    return True


def _ranges(pos) -> str:
    """'3..9, 12' for sorted ints."""
    pos = sorted(int(p) for p in pos)
    out, start = [], pos[0]
    for a, b in zip(pos, pos[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}..{a}")
            start = b
    return ", ".join(out)


def _nearest(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Index into ``c`` [m, D] of the row nearest by cosine to each row of ``x`` [n, D]: on a fixed random
    projection to ``SEARCH_DIMS`` when D is wider (a production width, 3 x 7168, would cost n*m*D), which
    keeps cosines within a few percent; the caller confirms each owner on the full rows."""
    if x.shape[1] > SEARCH_DIMS:
        proj = np.random.default_rng(0).standard_normal((x.shape[1], SEARCH_DIMS)).astype(np.float32)
        x, c = x @ proj, c @ proj
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    cn = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    return (xn @ cn.T).argmax(1)


def explain_row_owners(traces: Pair, alignment: Alignment, comp: TensorComparison) -> list[Explanation]:
    """The rows of ``comp.name`` (a ``target.aux*`` tensor) one side holds for other tokens or requests
    (module doc); [] when the failing rows are not the other side's rows."""
    if comp.tolerance is None or not len(comp.match.pair):
        return []
    tol = comp.tolerance.rel
    # rows are told apart by the whole concat where both sides have it: one slot alone (the embedding output)
    # is the same for every occurrence of a token, so it cannot say which position a row belongs to
    name = "target.aux_cat" if all("target.aux_cat" in t.names for t in (traces.x, traces.y)) else comp.name
    match = comp.match if name == comp.name else match_rows(traces, alignment, name)
    cy = _culprit_is_y(traces)
    culprit, ref = (traces.y, traces.x) if cy else (traces.x, traces.y)
    lab = side_names(traces)
    c_lab, r_lab = (lab.y, lab.x) if cy else (lab.x, lab.y)
    rx, ry = sample_rows(match)
    rc, rr = (ry, rx) if cy else (rx, ry)
    vc, vr = culprit.take_float(name, rc), ref.take_float(name, rr)
    failing = rc[metrics.relative_error(vc, vr) > tol][:MAX_FAILING]
    if len(failing) < 2:
        return []
    kc, kr = culprit.keys(name), ref.keys(name)
    # the reference's sequences paired with the failing rows' sequences: where their owners are looked for
    to_ref = {(p.seq.y if cy else p.seq.x): (p.seq.x if cy else p.seq.y) for p in alignment.seq_pairs}
    seqs = {to_ref[s] for s in np.unique(kc["seq"][failing]).tolist() if s in to_ref}
    cand = np.flatnonzero(np.isin(kr["seq"], list(seqs)) & (kr["depth"] == 0))[:MAX_CANDIDATES]
    if not len(cand):
        return []
    x = culprit.take_float(name, failing).reshape(len(failing), -1)
    c = ref.take_float(name, cand).reshape(len(cand), -1)
    best = _nearest(x, c)
    ok = metrics.relative_error(x, c[best]) <= tol
    if ok.mean() < MIN_OWNED:
        return []
    own_seq, own_pos = kr["seq"][cand[best]][ok], kr["pos"][cand[best]][ok]
    row_seq, row_pos = kc["seq"][failing][ok], kc["pos"][failing][ok]
    same = np.array([to_ref.get(int(s)) == int(o) for s, o in zip(row_seq, own_seq)])
    ev_rel = f"{int(ok.sum())} of {len(failing)} failing rows each equal one {r_lab} row within rel {tol:g}"
    if same.all():
        shifts = Counter((own_pos - row_pos).tolist())
        d, n = shifts.most_common(1)[0]
        if d == 0 or n != len(row_pos):
            return []
        per = defaultdict(list)
        for s, p in zip(row_seq.tolist(), row_pos.tolist()):
            per[s].append(p)
        where = [f"{c_lab} seq {s} pos {_ranges(ps)} hold {r_lab}'s rows at pos {_ranges([p + d for p in ps])}"
                 for s, ps in sorted(per.items())]
        msg = (f"{name}: rows shifted by {abs(d)} position{'s' if abs(d) > 1 else ''} — {c_lab}'s row at position t "
               f"is {r_lab}'s row at t{d:+d} (the hidden state of token t{d:+d}): " + "; ".join(where[:3])
               + (f" (+{len(where) - 3} more sequences)" if len(where) > 3 else ""))
        fix = fix_of("position_shift")
        if known(culprit.contract, "features") is not None:
            fix = ("regenerate the stored features with a capture that keeps row t for token t (SGLang before PR "
                   "28496 returned rows of other tokens under speculative decoding, issue 26163; vLLM "
                   "extract_hidden_states, issue 56442), or re-record them with record train --replay")
        return [Explanation("position_shift", msg, (ev_rel, *where), fix)]
    per = defaultdict(list)
    for s, p, o, q in zip(row_seq.tolist(), row_pos.tolist(), own_seq.tolist(), own_pos.tolist()):
        per[(s, o)].append((p, q))
    where = [f"{c_lab} seq {s} pos {_ranges(p for p, _ in pq)} hold {r_lab} seq {o}'s rows at pos "
             f"{_ranges(q for _, q in pq)}" for (s, o), pq in sorted(per.items())]
    from_ref = {v: k for k, v in to_ref.items()}
    pairs = {(s, o) for s, o in per}
    swapped = sorted({tuple(sorted((s, from_ref.get(o, o)))) for s, o in pairs
                      if to_ref.get(s) != o and (from_ref.get(o), to_ref.get(s)) in pairs})
    what = (" and ".join(f"requests {a} and {b} exchanged rows" for a, b in swapped) if swapped
            else "rows of another request")
    msg = f"{name}: rows swapped between requests — {what} on {c_lab}: " + "; ".join(where[:4])
    return [Explanation("aux_rows_swapped", msg, (ev_rel, *where), fix_of("aux_rows_swapped"))]
