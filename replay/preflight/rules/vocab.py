"""The vocab-map rules: d2t present, in range, offsets and not direct ids, consistent with t2d; its
coverage of the target vocab and of the eos tokens. d2t is read as offsets
(``specdiff.eagle3.vocab_map.read_d2t``), as the engines read it.
"""

from __future__ import annotations

import numpy as np

from specdiff.eagle3.vocab_map import as_array, read_d2t, t2d_from_d2t
from specdiff.replay.preflight.report import Finding

__all__ = ["check_vocab"]


def check_vocab(d2t, t2d, *, draft_vocab_size: int,
                vocab_size: int, eos_token_ids=()) -> list[Finding]:
    """d2t present, in range, consistent with t2d; direct ids / arange; coverage
    (d2t read as offsets, ``specdiff.eagle3.vocab_map.read_d2t``). ``d2t`` [Vd] / ``t2d`` [V]: numpy
    arrays (as ``replay.model.weight_files`` reads them) or torch tensors; None when absent."""
    Vd, V = draft_vocab_size, vocab_size
    out: list[Finding] = []
    if d2t is None:
        if Vd < V:
            out.append(Finding("vocab.d2t_missing", "error", "all",
                               f"no d2t but the draft vocab ({Vd}) is smaller than the target's ({V}): draft id i "
                               f"is served as target id i, so only tokens 0..{Vd - 1} can be proposed",
                               "ship the d2t (offsets) written at training time"))
        else:
            out.append(Finding("vocab.identity", "info", "all",
                               f"no d2t and draft vocab = target vocab ({V}): identity mapping", ""))
        return out
    d2t = as_array(d2t).reshape(-1)
    if d2t.dtype.kind == "f":
        return out  # reported by check_weights; values are meaningless
    d2t = d2t.astype(np.int64)
    if d2t.size != Vd:
        out.append(Finding("vocab.d2t_shape", "error", "all",
                           f"d2t has {d2t.size} entries but draft_vocab_size is {Vd}",
                           "d2t must have one offset per draft id"))
        return out
    r = read_d2t(d2t, t2d, vocab_size=V)
    if r.t2d_size is not None and r.t2d is None:
        out.append(Finding("vocab.t2d_shape", "warn", "all",
                           f"t2d has {r.t2d_size} entries but the target vocab is {V} (engines ignore t2d)", ""))
    mapped, t2d = r.mapped, r.t2d  # t2d: bool [V], None when absent or of the wrong length
    in_range, is_arange, direct_valid = r.in_range, r.is_arange, r.direct_valid
    offsets_match, direct_match, looks_direct = r.offsets_match, r.direct_match, r.looks_direct
    if looks_direct:
        ev = ("t2d marks exactly the ids d2t holds" if direct_match else
              f"read as offsets, draft id {int(np.argmax(mapped))} maps to {int(mapped.max())} >= V={V}")
        out.append(Finding("vocab.d2t_direct", "error", "all",
                           f"d2t holds direct target ids, not offsets ({ev}); engines use d2t + arange, so "
                           f"draft id i is served as d2t[i] + i",
                           "store offsets: d2t = target_ids - arange(Vd)"))
        return out
    if direct_valid and t2d is None and Vd > 2 and in_range and not is_arange:
        out.append(Finding("vocab.d2t_direct", "warn", "all",
                           f"d2t is strictly increasing ({int(d2t[0])}, {int(d2t[1])}, {int(d2t[2])}, ...) and "
                           "there is no t2d to confirm: offsets of a sorted vocab usually repeat, so these "
                           "may be direct target ids", "ship t2d, or check that d2t = target_ids - arange(Vd)"))
    if not in_range:
        bad = r.out_of_range
        i = int(bad[0])
        out.append(Finding("vocab.d2t_range", "error", "all",
                           f"d2t + arange maps {bad.size} draft id(s) outside [0, {V}) (first: draft {i} -> "
                           f"{int(mapped[i])}): an out-of-range index on the first proposal",
                           "rebuild d2t from the training vocab map"))
        return out
    if is_arange and not offsets_match:
        out.append(Finding("vocab.d2t_arange", "warn", "all",
                           "d2t equals arange(Vd): as offsets it maps draft id i to 2i (a placeholder or "
                           "direct ids?)", "store offsets: d2t = target_ids - arange(Vd)"))
    if r.distinct != Vd:
        out.append(Finding("vocab.d2t_duplicate", "error", "all",
                           f"d2t + arange maps {Vd} draft ids onto only {r.distinct} target ids",
                           "rebuild d2t: each draft id must map to a distinct target id"))
    if t2d is not None and not offsets_match:
        marked = t2d_from_d2t(d2t, V)
        extra = np.flatnonzero(marked & ~t2d)
        unreached = np.flatnonzero(t2d & ~marked)
        parts = []
        if not bool(t2d.any()):
            parts.append("t2d marks no token at all (an unfilled placeholder?)")
        elif extra.size:
            tid = int(extra[0])
            did = int(np.flatnonzero(mapped == tid)[0])
            parts.append(f"{extra.size} draft id(s) map to tokens t2d does not mark (first: draft {did} -> {tid})")
        if unreached.size:
            parts.append(f"{unreached.size} token(s) t2d marks are reached by no draft id (first: {int(unreached[0])})")
        out.append(Finding("vocab.t2d_mismatch", "error", "all",
                           "d2t + arange disagrees with t2d: " + "; ".join(parts) + " (engines follow d2t only)",
                           "write d2t and t2d from the same vocab map (t2d[d2t + arange] = True, nothing else)"))
    # coverage
    pct = 100.0 * r.distinct / V
    out.append(Finding("vocab.coverage", "info", "all",
                       f"draft vocab covers {r.distinct} of {V} target tokens ({pct:.1f}%)", ""))
    miss_eos = [e for e in eos_token_ids if 0 <= e < V and not bool((mapped == e).any())]
    if miss_eos:
        out.append(Finding("vocab.eos", "warn", "all",
                           f"target eos id(s) {miss_eos} are not in the draft vocab: the draft can never "
                           "propose the end of a reply", "include the eos tokens when building the draft vocab"))
    return out
