"""What the draft is fed at depth k >= 1 (``draft.input_ids``): serving's id against training's on the rows
where they differ, and what turns one into the other.

Training feeds the teacher's next token x_{t+1+k}, a target id (replay/record/train_state.py
``draft_input_ids_vocab``); a correct server feeds the previous step's pick mapped to the target vocabulary
(SGLang 0.5.23 eagle_worker_v2.py:757-758, :897-898 ``hot_token_id[draft id]``; hot_token_id = arange + d2t).
The rows compared are those where serving's own pick at depth k - 1 was the teacher's token
(compare/fed_path.py), so a differing row is a step fed something other than what its server picked. The
readings, each checked against the failing rows (a reading must fit ``FITS`` of them):

- ``draft_input_unmapped``: the draft id itself, the map skipped (the class of vllm-ascend PR 16166):
  training's = hot_token_id[serving's], with the serving side's recorded ``draft.d2t``;
- ``draft_input_mapped_twice``: serving's = hot_token_id[training's];
- ``draft_input_stale``: serving's is the id serving fed depth k - 1 at that position (its ``tokens`` row
  there): an input-ids buffer the step did not refresh;
- ``draft_input_not_selected``: none of those, but serving's own selection at depth k - 1
  (``draft.topk_target``, the id the verify tree holds) is training's id: the step was fed another id than
  its server selected, whatever made it.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.align.align import pack_keys
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.sample import MAX_ROWS
from specdiff.replay.diff.types import DIVERGED, Explanation, Pair, TensorComparison, side_names

NAME = "draft.input_ids"
#: the share of failing rows a reading must fit
FITS = 0.95


def explain_draft_inputs(traces: Pair, first: TensorComparison) -> list[Explanation]:
    """At a first divergence at ``draft.input_ids``: the first reading of the module doc that fits ``FITS``
    of the failing rows, with its share and one row's ids. ``first.match`` pairs the rows (int64 ids, one per
    row). [] when no serving side or no reading fits."""
    if first.name != NAME or traces.x.side == traces.y.side or "serve" not in (traces.x.side, traces.y.side):
        return []
    bad = np.flatnonzero(first.status == DIVERGED)[:MAX_ROWS]
    if not len(bad):
        return []
    serve_is_y = traces.y.side == "serve"
    serve = traces.y if serve_is_y else traces.x
    ids = first.match.rows.map(lambda r: r[bad])
    x = traces.x.take(NAME, ids.x).reshape(-1).astype(np.int64)
    y = traces.y.take(NAME, ids.y).reshape(-1).astype(np.int64)
    served, trained = (y, x) if serve_is_y else (x, y)
    serve_rows = ids.y if serve_is_y else ids.x
    labels = side_names(traces)
    s_lab, t_lab = (labels.y, labels.x) if serve_is_y else (labels.x, labels.y)
    d2t = serve.read("draft.d2t").reshape(-1).astype(np.int64) if "draft.d2t" in serve.names else np.zeros(0, np.int64)
    hot = np.arange(len(d2t)) + d2t
    before = _one_depth_up(serve, "tokens", serve_rows)  # what serving fed depth k - 1 there, -1: not recorded
    selected = _one_depth_up(serve, "draft.topk_target", serve_rows)

    def through_map(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        ok = (src >= 0) & (src < len(hot))
        return ok & (hot[np.clip(src, 0, len(hot) - 1)] == dst) if len(hot) else np.zeros(len(src), bool)

    readings = (
        ("draft_input_unmapped", through_map(served, trained),
         f"{s_lab} fed each later draft step the previous pick's draft-vocab id, never mapped to the target "
         f"vocabulary: {t_lab} feeds hot_token_id[that id] (= id + d2t[id])"),
        ("draft_input_mapped_twice", through_map(trained, served),
         f"{s_lab} mapped the previous pick to the target vocabulary twice: it fed hot_token_id[{t_lab}'s id]"),
        ("draft_input_stale", (before >= 0) & (before == served),
         f"{s_lab} fed the later draft step the id it had fed the step before it at that position, a stale "
         f"input-ids buffer: {t_lab} feeds the previous step's pick, which {s_lab}'s own selection "
         f"(draft.topk_target) also holds"),
        ("draft_input_not_selected", (selected >= 0) & (selected == trained),
         f"{s_lab} fed the later draft step another id than the one its previous step selected "
         f"(draft.topk_target, the id the verify tree holds): {t_lab} feeds that selected id"),
    )
    depth = first.match.depth[bad]
    for cause, fits, message in readings:
        share = float(fits.mean())
        if share >= FITS:
            i = int(np.argmax(fits))
            rel = {"draft_input_unmapped": f"d2t[{served[i]}] = {_entry(d2t, served[i])}",
                   "draft_input_mapped_twice": f"d2t[{trained[i]}] = {_entry(d2t, trained[i])}",
                   "draft_input_stale": f"{s_lab} fed depth {depth[i] - 1} {before[i]}",
                   "draft_input_not_selected": f"{s_lab}'s depth-{depth[i] - 1} selection {selected[i]}"}
            example = (f"e.g. pos {int(first.match.pos[bad][i])} depth {int(depth[i])}: {s_lab} fed {int(served[i])}, "
                       f"{t_lab} {int(trained[i])}; {rel[cause]}")
            return [Explanation(cause, message, (f"{share:.1%} of {len(bad)} differing rows fit this reading",
                                                 example), fix_of(cause))]
    return []


def _entry(table: np.ndarray, i: int) -> str:
    """``table[i]`` as text, "?" outside it."""
    return str(int(table[i])) if 0 <= i < len(table) else "?"


def _one_depth_up(trace, name: str, rows: np.ndarray) -> np.ndarray:
    """int64 [len(rows)]: the first id of ``name``'s first row at the same (seq, pos) as each of ``NAME``'s
    ``rows`` on ``trace`` and one depth less; -1 where ``trace`` recorded none."""
    out = np.full(len(rows), -1, np.int64)
    if name not in trace.names or not len(rows):
        return out
    k = trace.keys(NAME, columns=("seq", "pos", "depth"))
    want = pack_keys(k["seq"][rows], k["pos"][rows], k["depth"][rows] - 1)
    o = trace.keys(name, columns=("seq", "pos", "depth"))
    uniq, first = np.unique(pack_keys(o["seq"], o["pos"], o["depth"]), return_index=True)
    if not len(uniq):
        return out
    at = np.minimum(np.searchsorted(uniq, want), len(uniq) - 1)
    found = uniq[at] == want
    if found.any():
        vals = trace.take(name, first[at[found]])
        out[found] = vals.reshape(len(vals), -1)[:, 0].astype(np.int64)
    return out
