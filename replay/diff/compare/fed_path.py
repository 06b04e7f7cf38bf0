"""Where what a later draft step was fed (``draft.input_ids``) is compared: the rows where serving's own
picks say it should have been fed what training feeds.

Rows at depth d >= 1 are compared only where both sides fed the draft the same tokens at depths 0..d
(compare.py ``_token_path_keys``): elsewhere serving's draft legitimately follows its own picks. On serving
the ``tokens`` row at depth d *is* the id the step was fed, so a bug in what a later step is fed (the id
never mapped to the target vocabulary, mapped twice, a stale input buffer) puts every row it touches off
that path, and the rows that carry it would never be compared.

What serving *meant* to feed depth d is its own selection at depth d - 1 (``draft.topk_target``: SGLang
0.5.23 ``select_top_k_tokens``' output, spec_utils.py:474, the very ids eagle_worker_v2.py:821 feeds the
next step and the verify tree holds; vLLM 0.32.0 ``propose``'s draft token d - 1, fed to step d). So
``draft.input_ids`` at depth d is compared also where the tokens agree at depths 0..d-1 and serving's
selection at depth d - 1 is training's depth-d token: there a correct server fed that very id, and any
other fed id is a divergence of its own, at its own stage. On a correct server the two path rules give the
same rows. Chains only (one selected id per row): on a top-k tree the selection holds k ids and the fed
branch that pairs first is chosen by the recorder (tracer/engines/sglang/attribution.py ``_branch_order``).
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.align.align import _keyed, pack_keys
from specdiff.replay.diff.types import Alignment, Pair, RowMatch

#: the tensor compared on the extended path
FED = "draft.input_ids"
#: serving's selection at depth d - 1: what it meant to feed depth d (target ids)
SELECTED = "draft.topk_target"


def fed_path_keys(traces: Pair, alignment: Alignment, tokens: RowMatch, good: np.ndarray) -> np.ndarray:
    """Packed (pair, aligned pos, depth) keys at which ``draft.input_ids`` is compared: ``good`` (the
    token-path keys, int64, any order) and the depth d >= 1 keys whose tokens agree at depths 0..d-1 (their
    depth d - 1 key is in ``good``) where serving's ``draft.topk_target`` row at depth d - 1 (its first row
    there; one id wide) holds training's depth-d ``tokens`` id. ``tokens``: the aligned ``tokens`` rows
    (``match_rows``). ``good`` itself when the pair is not one serving and one training trace, or serving
    recorded no one-wide ``draft.topk_target``."""
    sides = {traces.x.side: "x", traces.y.side: "y"}
    if set(sides) != {"serve", "train"} or SELECTED not in getattr(traces, sides["serve"]).names:
        return good
    sv, tr = sides["serve"], sides["train"]
    serve = getattr(traces, sv)
    if tuple(serve.info(SELECTED).shape)[-1:] != (1,):
        return good
    deep = np.nonzero(tokens.depth > 0)[0]
    parent = pack_keys(tokens.pair[deep], tokens.pos[deep], tokens.depth[deep] - 1)
    deep, parent = deep[np.isin(parent, good)], parent[np.isin(parent, good)]
    if not len(deep):
        return good
    teacher = getattr(traces, tr).take("tokens", getattr(tokens.rows, tr)[deep]).reshape(-1).astype(np.int64)
    maps = {p.seq.x if sv == "x" else p.seq.y: (p.index, p.length, p.start.x if sv == "x" else p.start.y)
            for p in alignment.seq_pairs}
    keys, valid = _keyed(serve, SELECTED, maps)
    at = np.nonzero(valid)[0]
    uniq, first = np.unique(keys[at], return_index=True)  # a repeated key pairs by its first row (match_rows)
    pos = np.minimum(np.searchsorted(uniq, parent), max(len(uniq) - 1, 0))
    has = (uniq[pos] == parent) if len(uniq) else np.zeros(len(parent), bool)
    selected = np.full(len(parent), -1, np.int64)
    if has.any():
        selected[has] = serve.take(SELECTED, at[first[pos[has]]]).reshape(-1).astype(np.int64)
    meant = deep[has & (selected == teacher)]
    return np.union1d(good, pack_keys(tokens.pair[meant], tokens.pos[meant], tokens.depth[meant]))


__all__ = ["FED", "SELECTED", "fed_path_keys"]
