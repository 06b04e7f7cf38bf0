"""What the draft is fed at depth k >= 1 (``draft.input_ids``): serving's id against training's on the rows
where they differ, and the vocab map that turns one into the other.

Training feeds the teacher's next token x_{t+1+k}, a target id (replay/record/train_state.py
``draft_input_ids_vocab``); a correct server feeds the previous step's pick mapped to the target vocabulary
(SGLang 0.5.23 eagle_worker_v2.py:757-758, :897-898 ``hot_token_id[draft id]``; hot_token_id = arange + d2t).
On a row whose previous picks were right the two are one id; the class of vllm-ascend PR 16166 feeds the
draft id itself (the map skipped), another mistake of the class maps it twice. Both are read off the failing
rows with the recorded ``draft.d2t``: a reading must fit ``FITS`` of them.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.sample import MAX_ROWS
from specdiff.replay.diff.types import DIVERGED, Explanation, Pair, TensorComparison, side_names

NAME = "draft.input_ids"
#: the share of failing rows a reading must fit
FITS = 0.95


def explain_draft_inputs(traces: Pair, first: TensorComparison) -> list[Explanation]:
    """At a first divergence at ``draft.input_ids``: does serving's fed id map onto training's through the
    serving side's d2t (``draft_input_unmapped``: training's = hot_token_id[serving's]), or training's onto
    serving's (``draft_input_mapped_twice``: serving's = hot_token_id[training's])? ``first.match`` pairs
    the rows (int64 ids, one per row). [] when no serving side, no d2t or no reading fits."""
    if first.name != NAME or traces.x.side == traces.y.side or "serve" not in (traces.x.side, traces.y.side):
        return []
    bad = np.flatnonzero(first.status == DIVERGED)[:MAX_ROWS]
    if not len(bad):
        return []
    serve_is_y = traces.y.side == "serve"
    serve = traces.y if serve_is_y else traces.x
    if "draft.d2t" not in serve.names:
        return []
    d2t = serve.read("draft.d2t").reshape(-1).astype(np.int64)
    hot = np.arange(len(d2t)) + d2t
    ids = first.match.rows.map(lambda r: r[bad])
    x = traces.x.take(NAME, ids.x).reshape(-1).astype(np.int64)
    y = traces.y.take(NAME, ids.y).reshape(-1).astype(np.int64)
    served, trained = (y, x) if serve_is_y else (x, y)
    labels = side_names(traces)
    s_lab, t_lab = (labels.y, labels.x) if serve_is_y else (labels.x, labels.y)

    def through_map(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        ok = (src >= 0) & (src < len(hot))
        return ok & (hot[np.clip(src, 0, len(hot) - 1)] == dst)

    readings = (
        ("draft_input_unmapped", through_map(served, trained),
         f"{s_lab} fed each later draft step the previous pick's draft-vocab id, never mapped to the target "
         f"vocabulary: {t_lab} feeds hot_token_id[that id] (= id + d2t[id])"),
        ("draft_input_mapped_twice", through_map(trained, served),
         f"{s_lab} mapped the previous pick to the target vocabulary twice: it fed hot_token_id[{t_lab}'s id]"),
    )
    for cause, fits, message in readings:
        share = float(fits.mean())
        if share >= FITS:
            i = int(np.argmax(fits))
            example = (f"e.g. {s_lab} {int(served[i])}, {t_lab} {int(trained[i])}, d2t["
                       f"{int(served[i] if cause == 'draft_input_unmapped' else trained[i])}] = "
                       f"{int(d2t[served[i] if cause == 'draft_input_unmapped' else trained[i]])}")
            return [Explanation(cause, message, (f"{share:.1%} of {len(bad)} differing rows fit this reading",
                                                 example), fix_of(cause))]
    return []
