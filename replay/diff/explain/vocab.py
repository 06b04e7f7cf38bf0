"""The vocab map: how each side turned draft ids into target ids, tested against the recorded d2t."""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.types import Alignment, Explanation, Pair, side_names


def explain_vocab_map(traces: Pair, alignment: Alignment) -> list[Explanation]:
    """Test how each side turned draft ids into target ids, using the recorded ``draft.d2t``."""
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
            if frac >= 0.99 and not np.mean(other == mine) >= 0.99:
                out.append(Explanation(cause, msg, (f"{frac:.1%} of d2t entries fit this reading",), fix))
    return out
