"""Positions: rows at position t on one side equal rows at t +- 1 on the other, and the draft's rope
positions shifted by a constant or by a step per draft depth."""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.sample import MAX_ROWS, at_depth, sample_rows
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.types import Alignment, Explanation, Pair, TensorComparison, side_names


def explain_position_shift(traces: Pair, alignment: Alignment, comp: TensorComparison) -> list[Explanation]:
    """Do rows at position t on one side equal rows at t+-1 on the other?"""
    if comp.match.rows.x.dtype.kind != "i" or comp.name.startswith("verify") or not len(comp.match.pair):
        return []
    name = comp.name
    kx, ky = traces.x.keys(name), traces.y.keys(name)
    seq_y = {p.seq.x: p.seq.y for p in alignment.seq_pairs}
    sample = comp.match.rows.x[:MAX_ROWS]
    # Index only side y's rows of the sampled sequences: a Python dict over every row of a large
    # trace would cost seconds.
    wanted = np.flatnonzero(np.isin(ky["seq"], [seq_y.get(int(s), -1) for s in np.unique(kx["seq"][sample])]))
    index = {(int(ky["seq"][r]), int(ky["pos"][r]), int(ky["depth"][r])): int(r) for r in wanted}
    for shift in (1, -1):
        pairs = []
        for r in sample:
            key = (seq_y.get(int(kx["seq"][r]), -1), int(kx["pos"][r]) + shift, int(kx["depth"][r]))
            if key in index:
                pairs.append((r, index[key]))
        if len(pairs) < 4 or comp.tolerance is None:
            continue
        rx, ry = np.array(pairs).T
        if traces.x.info(name).dtype in ("int64", "bool"):
            ok = float((traces.x.take(name, rx) == traces.y.take(name, ry)).all(-1).mean() if traces.x.take(name, rx).ndim > 1
                       else (traces.x.take(name, rx) == traces.y.take(name, ry)).mean())
            closes = ok >= 0.95
            ev = f"match rate {ok:.1%} after shifting by {shift:+d}"
        else:
            rel = float(metrics.relative_error(traces.x.take_float(name, rx), traces.y.take_float(name, ry)).mean())
            closes = rel <= comp.tolerance.rel
            ev = f"rel err {rel:.2e} after shifting by {shift:+d} (unshifted {comp.stats.get('mean_rel', 0):.2e})"
        if closes:
            lab = side_names(traces)
            return [Explanation("position_shift", f"{name}: {lab.x} position t equals {lab.y} position t{shift:+d}",
                                (ev,), fix_of("position_shift"))]
    return []


def _offsets(traces: Pair, m, name: str) -> tuple[int, float, int]:
    """(most common serving - training offset, its share, rows) of int tensor ``name`` on RowMatch ``m``."""
    rx, ry = sample_rows(m)
    x = traces.x.take(name, rx).reshape(-1).astype(np.int64)
    y = traces.y.take(name, ry).reshape(-1).astype(np.int64)
    off, counts = np.unique(y - x, return_counts=True)
    return int(off[np.argmax(counts)]), float(counts.max() / len(x)), len(x)


def explain_positions(traces: Pair, first: TensorComparison) -> list[Explanation]:
    """``draft.positions``: one side's rope positions = the other's + an offset, judged per draft
    depth (three quarters of the rows are depth 0, where a draft-step bug leaves them right: the
    most common offset over all rows hides a +1 every deeper row shares)."""
    if first.name != "draft.positions" or not len(first.match.pair):
        return []
    lab = side_names(traces)
    per = {int(d): _offsets(traces, at_depth(first.match, int(d)), first.name) for d in np.unique(first.match.depth)}
    clean = {d: v for d, v in per.items() if v[1] >= 0.95}
    if len(clean) != len(per):
        return []
    offs = {d: v[0] for d, v in clean.items()}
    ev = tuple(f"depth {d}: {v[1]:.1%} of {v[2]} rows differ by exactly {v[0]:+d}" for d, v in sorted(clean.items()))
    fix = fix_of("position_offset")
    vals = set(offs.values())
    if vals == {0}:
        return []
    if len(vals) == 1:
        best = vals.pop()
        return [Explanation("position_offset",
                            f"the draft's rope positions on {lab.y} are {lab.x}'s {best:+d}: row t at depth k is "
                            f"rotated at t + k {best:+d} instead of t + k", ev, fix)]
    wrong = sorted(d for d, o in offs.items() if o)
    k0 = wrong[0]
    if all(offs[d] == 0 for d in offs if d < k0) and len({offs[d] for d in wrong}) == 1 and wrong == \
            sorted(d for d in offs if d >= k0):
        c = offs[k0]
        ahead = "ahead of" if c > 0 else "behind"
        return [Explanation("position_offset_depth",
                            f"draft positions at depth >= {k0} are {abs(c)} {ahead} {lab.x} ({c:+d} at depth >= {k0}) "
                            f"on {lab.y}, depth < {k0} agree: rope positions "
                            + ("advanced before each draft step instead of after" if c > 0 else
                               "not advanced for each draft step"), ev, fix)]
    d0, ds = min(offs), sorted(offs)
    step = offs[ds[1]] - offs[d0] if len(ds) > 1 else 0
    if step and all(offs[d] == offs[d0] + step * (d - d0) for d in ds):  # the offset grows with the depth
        return [Explanation("position_offset_depth",
                            f"the draft's rope positions on {lab.y} drift by {step:+d} per draft depth from {lab.x}'s "
                            f"(offset {offs[d0]:+d} at depth {d0}): the position is advanced by the wrong amount "
                            "per draft step", ev, fix)]
    return []
