"""Explanations read from where the failing rows sit, needing no recorded fact: a first
divergence that agrees at every sequence's position 0 and fails after it, or at draft depth 0 and fails
from depth 1.

Position 0 is where a position-dependent computation cannot differ: rotary embedding at position 0 is the
identity (cos 1, sin 0), and attention there reads only the token itself. A difference that spares it is in
the rope table (a rotary cos/sin cache lost or rebuilt after load, another rope scaling) or in attention
over earlier positions (the KV cache). Depth 0 is fed what training feeds (the target's hidden states and
the next token); a difference from depth 1 on is in what later draft steps are fed or in their KV.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.types import Explanation, TensorComparison

#: at least this many rows after the spared ones (position > 0 / depth >= 1)
MIN_ROWS = 4
#: at least this many spared rows: one per sequence at position 0 (two sequences whose first rows agree while
#: half or more of the rest fail is no chance draw)
MIN_SPARED = 2
#: the share of the rows after (position > 0 / depth >= 1) that must fail
AFTER_FAILS = 0.5


def explain_row_structure(first: TensorComparison) -> list[Explanation]:
    """``position_dependent`` when no row at a sequence's aligned position 0 fails and at least
    ``AFTER_FAILS`` of the later positions' rows do; else ``depth_dependent`` when no depth-0 row fails and
    at least ``AFTER_FAILS`` of the deeper rows do. ``first.match.pos`` / ``depth``: aligned keys [n];
    failing = ``first.own_fail`` (counted rows, inputs agreeing). [] when neither shape holds."""
    m, fail = first.match, first.own_fail
    if not len(m.pair) or not fail.any():
        return []
    counted = first.counted if first.counted is not None else np.ones(len(fail), bool)
    start = np.zeros(len(m.pair), np.int64)  # each pair's first aligned position among this tensor's rows
    for p in np.unique(m.pair):
        sel = m.pair == p
        start[sel] = m.pos[sel].min()
    shapes = [("position_dependent", m.pos == start, ("position 0 of every sequence", "every later position")),
              ("depth_dependent", m.depth == 0, ("draft depth 0", "depth 1 on"))]
    for cause, spared, words in shapes:
        after = counted & ~spared
        if (spared & counted).sum() < MIN_SPARED or after.sum() < MIN_ROWS:
            continue
        share = float(fail[after].mean())
        if fail[spared].any() or share < AFTER_FAILS:
            continue
        evidence = (f"{int((spared & counted).sum())} rows at {words[0]} agree; {int(fail[after].sum())} of "
                    f"{int(after.sum())} rows from {words[1]} differ ({share:.0%})",)
        message = (f"{first.name} agrees at {words[0]} and differs from {words[1]}: " +
                   ("a position-dependent computation differs (the rope table, or attention over earlier "
                    "positions)" if cause == "position_dependent" else
                    "what later draft steps are fed, or their KV, differs"))
        # where, not what: the narrowing still runs (named_only)
        return [Explanation(cause, message, evidence, fix_of(cause), named_only=True)]
    return []
