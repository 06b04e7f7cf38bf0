"""The vocab map: how each side turned draft ids into target ids, tested against the recorded d2t."""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.align.align import match_rows, pack_keys
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.sample import sample_rows
from specdiff.replay.diff.types import Alignment, Explanation, Pair, side_names

#: the share of sampled rows (and of d2t entries, for a reading) that must fit a vocab-map reading
FITS = 0.99


#: the stages where the vocab map is applied (draft ids -> target ids): a map can explain only these
MAPPED = ("draft.topk_target", "verify")


def explain_vocab_map(traces: Pair, alignment: Alignment, first: str) -> list[Explanation]:
    """Test how each side turned draft ids into target ids, using the recorded ``draft.d2t``;
    ``first``: the first divergence's tensor (another offset map is tested only where the map is
    applied, ``MAPPED``)."""
    if "draft.d2t" not in traces.x.names or "draft.d2t" not in traces.y.names:
        return []
    labels = side_names(traces)
    d2t = traces.map(lambda t: t.read("draft.d2t").reshape(-1).astype(np.int64))
    if len(d2t.x) != len(d2t.y) or np.array_equal(d2t.x, d2t.y):
        return []
    ar = np.arange(len(d2t.x))
    out = []
    for lab, mine, other in ((labels.y, d2t.y, d2t.x), (labels.x, d2t.x, d2t.y)):
        olab = labels.x if lab == labels.y else labels.y
        checks = [
            ("d2t_direct_ids", np.mean(mine == other + ar),
             f"{lab}'s d2t holds direct target ids (= {olab}'s offsets + arange) but is read as offsets: "
             "target = draft + d2t[draft] lands on wrong ids",
             fix_of("d2t_direct_ids")),
            ("d2t_missing", np.mean(mine == 0),
             f"{lab} has no usable d2t (all zeros: identity map), so draft id i is served as target id i",
             fix_of("d2t_missing")),
            ("d2t_arange", np.mean(mine == ar),
             f"{lab}'s d2t is arange (draft id i -> target id 2i)", fix_of("d2t_arange")),
        ]
        for cause, frac, msg, fix in checks:
            if frac >= FITS and not np.mean(other == mine) >= FITS:
                out.append(Explanation(cause, msg, (f"{frac:.1%} of d2t entries fit this reading",), fix))
    return out or (explain_other_map(traces, alignment, d2t) if first in MAPPED else [])


def explain_other_map(traces: Pair, alignment: Alignment, d2t: Pair) -> list[Explanation]:
    """``d2t_other_map``: both sides read d2t as offsets, correctly, but hold different maps (a d2t
    rebuilt from other data, or another draft's): the draft's ids agree, and each side's mapped ids
    are its own ``draft id + d2t[draft id]`` (SGLang 0.5.23 ``hot_token_id = d2t + arange``).

    Proven on the aligned rows of ``draft.topk`` and ``draft.topk_target`` (int ids [rows, k]): the
    draft ids agree on at least ``FITS`` of the sampled rows, each side's own map reproduces its
    mapped ids there, and the other side's map does not reproduce serving's. ``d2t``: both sides'
    d2t, int64 [Vd] each, of one length. Returns [] when the rows are not recorded on both sides or
    do not show this.
    """
    names = ("draft.topk", "draft.topk_target")
    if not all(n in t.names for n in names for t in (traces.x, traces.y)):
        return []
    ids, mapped = (match_rows(traces, alignment, n) for n in names)
    key = [pack_keys(m.pair, m.pos, m.depth) for m in (ids, mapped)]
    _, i_ids, i_mapped = np.intersect1d(key[0], key[1], assume_unique=True, return_indices=True)
    if not len(i_ids):
        return []
    pick = sample_rows(ids)[0]  # sampled rows of side x, in runs of neighbours
    keep = np.isin(ids.rows.x[i_ids], pick)
    i_ids, i_mapped = i_ids[keep], i_mapped[keep]

    def take(t, name: str, rows: np.ndarray) -> np.ndarray:
        return t.take(name, rows).astype(np.int64).reshape(len(rows), -1)

    draft = Pair(take(traces.x, names[0], ids.rows.x[i_ids]), take(traces.y, names[0], ids.rows.y[i_ids]))
    target = Pair(take(traces.x, names[1], mapped.rows.x[i_mapped]), take(traces.y, names[1], mapped.rows.y[i_mapped]))
    vd = len(d2t.x)
    same = np.all(draft.x == draft.y, axis=1) & np.all((draft.x >= 0) & (draft.x < vd), axis=1)
    if same.mean() < FITS:
        return []
    dx = draft.x[same]
    own = Pair(np.all(target.x[same] == dx + d2t.x[dx], axis=1).mean(),
               np.all(target.y[same] == dx + d2t.y[dx], axis=1).mean())
    crossed = np.all(target.y[same] == dx + d2t.x[dx], axis=1).mean()
    if own.x < FITS or own.y < FITS or crossed >= FITS:
        return []
    labels = side_names(traces)
    differ = np.flatnonzero(d2t.x != d2t.y)
    shown = "; ".join(f"draft id {i}: {labels.x} target {i + d2t.x[i]}, {labels.y} target {i + d2t.y[i]}"
                      for i in differ[:3])
    return [Explanation(
        "d2t_other_map",
        f"{labels.x} and {labels.y} hold different d2t vocab maps ({len(differ)} of {vd} draft ids map to other "
        "target tokens); each reads its own as offsets, so the same draft ids become other target ids",
        (f"the draft ids agree on {same.mean():.1%} of {len(same)} sampled rows; there each side's own d2t gives "
         f"its mapped ids ({labels.x} {own.x:.1%}, {labels.y} {own.y:.1%}) and {labels.x}'s d2t gives "
         f"{labels.y}'s on {crossed:.1%}", shown),
        fix_of("d2t_other_map"))]
