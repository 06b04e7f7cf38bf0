"""Named causes for draft rows whose inputs agree but whose output differs: the draft's history.

A draft row after the attention (``draft.hidden_out`` and later) is computed from its own
attention input (``draft.attn_in``, compared row by row) and from the keys and values of every
earlier position of its sequence (the draft KV cache), which no recorded row shows. When the
attention input agrees on every failing row, the difference is in that history; where the failing
rows lie says whose history (measured on SGLang 0.5.23 with bugs put in by a plugin,
tests/server/test_injected_serving_bugs.py):

- only rows of decode iterations (after a round boundary), none of the prefill: **stale draft KV**
  — after verify the draft must rewrite the KV of the accepted positions from the target's hidden
  states (SGLang 0.5.23 srt/speculative/eagle_worker_v2.py:1110 ``_draft_extend_for_decode``);
  kept from the draft's own predicted hidden states, every later round attends to wrong KV;
- only rows of requests whose prefix hit the radix cache, from the first uncached position:
  **the draft KV of the cached prefix is missing** (the target's KV was reused, the draft's never
  written for those slots);
- only rows at draft depth >= 2 of a tree (``spec_topk`` > 1; checked before the round boundary,
  which deeper draft rows always lie after): **a re-ranked node's KV is another branch's** — SGLang's multi-step draft attention indexes a node's KV as "prefix + this
  column's draft slots", so a depth-2 node re-ranked into another column reads that column's
  depth-1 KV, not its parent's.

Each is named only when every failing row (the verdict's, ``TensorComparison.judged_fail``) fits
it and the attention input agrees on all of them; the evidence lists the rows, which rows before
them agree, and the requests and cached prefix lengths.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.align.align import pack_keys
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.judge.context import CONTEXT_STAGE, consumes_context
from specdiff.replay.diff.judge.groups import cached_prefixes, chunk_ends
from specdiff.replay.diff.types import CLOSE, Explanation, serve_side, side_names
from specdiff.tracer.contract import known


def _attn_status(comps: dict, first, idx) -> np.ndarray | None:
    """Per row of ``first`` at ``idx``: 1 where ``draft.attn_in`` agrees (MATCH or CLOSE) at the same
    (pair, pos, depth), 0 where it differs, -1 where it was not compared; None without attn_in."""
    a = comps.get(CONTEXT_STAGE)
    if a is None or a.kind != "values" or not len(a.match.pair):
        return None
    keys = pack_keys(first.match.pair[idx], first.match.pos[idx], first.match.depth[idx])
    akeys = pack_keys(a.match.pair, a.match.pos, a.match.depth)
    order = np.argsort(akeys)
    at = np.minimum(np.searchsorted(akeys[order], keys), len(akeys) - 1)
    hit = akeys[order][at] == keys
    out = np.where(a.status[order][at] <= CLOSE, 1, 0)
    return np.where(hit, out, -1)


def _inputs_agree_or_inherit(comps: dict, first) -> tuple[bool, int, int]:
    """Whether every failing row of ``first`` either has ``draft.attn_in`` agreeing, or sits at depth
    k >= 1 right below a failing row at depth k - 1 of the same (pair, pos): the draft step at depth
    k takes the depth-(k - 1) output as its input hidden state (tracer/rows.py ``ttt_rows``), so a
    history fault at depth k - 1 reaches the attention input at depth k. Returns (holds, rows
    whose attn_in agrees, rows below a failing row); holds needs at least one agreeing row."""
    bad = np.nonzero(first.judged_fail)[0]
    got = _attn_status(comps, first, bad)
    if got is None:
        return False, 0, 0
    m = first.match
    failing = set(pack_keys(m.pair[bad], m.pos[bad], m.depth[bad]).tolist())
    above = pack_keys(m.pair[bad], m.pos[bad], np.maximum(m.depth[bad] - 1, 0))
    below = (m.depth[bad] >= 1) & np.array([int(k) in failing for k in above], bool)
    agree = got == 1
    return bool(agree.any() and (agree | below).all()), int(agree.sum()), int((~agree & below).sum())


def _rows(first, idx, iters=None, limit: int = 8) -> list[str]:
    m = first.match
    out = []
    for i in idx[:limit]:
        it = f" iter {int(iters[i])}" if iters is not None else ""
        out.append(f"seq {int(m.pair[i])} pos {int(m.pos[i])} depth {int(m.depth[i])}{it}: "
                   f"rel {float(first.score[i]):.3g}")
    if len(idx) > limit:
        out.append(f"... {len(idx) - limit} more")
    return out


def explain_history(traces, alignment, comps: dict, first) -> list:
    """``types.Explanation`` of a draft divergence after the attention whose attention input
    agrees on every failing row (module doc): ``stale_draft_kv``, ``cached_prefix_draft_kv`` or
    ``tree_rerank_kv``; empty when none fits (or attn_in was not compared there)."""
    if first is None or first.kind != "values":
        return []
    chunk = explain_chunk_boundary(traces, alignment, first)
    if chunk or not consumes_context(first.name):
        return chunk
    bad = np.nonzero(first.judged_fail)[0]
    holds, n_agree, n_below = _inputs_agree_or_inherit(comps, first) if len(bad) else (False, 0, 0)
    if not holds:
        return []
    m = first.match
    order = bad[np.lexsort((m.depth[bad], m.pair[bad], m.pos[bad]))]
    sv = serve_side(traces)
    trace = getattr(traces, sv)
    iters = np.asarray(trace.keys(first.name, columns=("iter",))["iter"], np.int64)[getattr(m.rows, sv)]
    counted = first.counted if first.counted is not None else np.ones(len(m.pair), bool)
    same_in = (f"{CONTEXT_STAGE} agrees on all {len(bad)} failing rows" if not n_below else
               f"{CONTEXT_STAGE} agrees on {n_agree} of the {len(bad)} failing rows and the other {n_below} "
               "are draft steps below a failing row (their input hidden state is its output)")
    out = []

    cached = cached_prefixes(traces, alignment, sv)
    if cached:
        start = np.array([cached.get(int(p), -1) for p in m.pair], np.int64)
        hit = (start >= 0) & (m.pos >= start)
        firsts = {int(p): int(m.pos[bad][m.pair[bad] == p].min()) for p in np.unique(m.pair[bad])}
        if hit[bad].all():
            clean = int((counted & ~hit).sum())
            reqs = ", ".join(f"seq {p} (cached prefix {cached[p]}, first failing pos {firsts[p]})"
                             for p in sorted(firsts)[:6])
            out.append(Explanation(
                "cached_prefix_draft_kv",
                f"draft KV of the radix-cached prefix missing: {first.name} differs only on requests whose prefix hit "
                f"the radix cache, from the first uncached position on, while {same_in}: the draft attends to KV "
                "its own extend never wrote for the cached slots",
                (f"requests that hit the cache: {reqs}", f"{clean} counted rows of requests without a cache hit agree",
                 *_rows(first, order, iters)),
                fix_of("cached_prefix_draft_kv")))
            return out

    topk = max(int(known(t.contract, "spec_topk") or 1) for t in (traces.x, traces.y))
    if topk > 1 and (m.depth[bad] >= 2).all() and ((m.depth < 2) & counted).any():
        out.append(Explanation(
            "tree_rerank_kv",
            f"only draft-tree rows at depth >= 2 (topk {topk}) differ while {same_in}: a node that top-k "
            "re-ranking put into another branch's column attends to that column's depth-1 KV, not its parent's "
            "(SGLang's multi-step draft attention indexes KV as prefix + this column's draft slots)",
            (f"{int(((m.depth < 2) & counted).sum())} counted rows at depth 0-1 agree", *_rows(first, order, iters)),
            fix_of("tree_rerank_kv")))
        return out

    decode = iters >= 0
    if decode.any() and (~decode & counted).any() and decode[bad].all():
        first_iter = int(iters[bad].min())
        before = int((counted & (~decode | (iters < first_iter))).sum())
        out.append(Explanation(
            "stale_draft_kv",
            f"stale draft KV history: {first.name} differs only after a round boundary (decode iterations "
            f"{first_iter}..{int(iters[bad].max())}), never in the prefill, while {same_in}: the draft attends "
            "to KV of accepted positions that was not rewritten from the target's hidden states after verify",
            (f"{before} counted rows before iteration {first_iter} (prefill included) agree",
             *_rows(first, order, iters)),
            fix_of("stale_draft_kv")))
        return out

    return out


def explain_chunk_boundary(traces, alignment, first) -> list:
    """``chunk_boundary_token``: every failing row of ``first`` is a depth-0 row at the last position
    of a non-final prefill chunk of its serving request (chunks recorded per request,
    groups.chunk_ends). The draft extend of a chunk reads x_{t+1} at its row t; at the chunk's last
    row that is the first prompt token of the next chunk, which the chunk itself does not hold
    (SGLang 0.5.23 srt/speculative/eagle_utils.py:81 ``_eagle_prefill_tail_tokens``, fixed by PR
    #26329; before it the target's sampled token of the partial prompt was fed). Empty otherwise."""
    bad = np.nonzero(first.judged_fail)[0]
    if not len(bad):
        return []
    ends = chunk_ends(traces, alignment, serve_side(traces))
    if not ends:
        return []
    m = first.match
    at_end = np.array([int(m.depth[i]) == 0 and int(m.pos[i]) in ends.get(int(m.pair[i]), ()) for i in bad], bool)
    if not at_end.all():
        return []
    n_ends = sum(len(v) for v in ends.values())
    order = bad[np.lexsort((m.depth[bad], m.pair[bad], m.pos[bad]))]
    reqs = ", ".join(f"seq {p}: chunks end at pos {', '.join(map(str, v))}" for p, v in sorted(ends.items())[:6])
    what = "the draft's input token" if first.name == "tokens" else f"{first.name}"
    rows = _rows(first, order)
    if first.name == "tokens":  # ids, not a relative error: show both sides' token
        shown = order[:8]
        tx = np.asarray(traces.x.take("tokens", m.rows.x[shown])).reshape(-1)
        ty = np.asarray(traces.y.take("tokens", m.rows.y[shown])).reshape(-1)

        label = side_names(traces)
        rows = [f"seq {int(m.pair[i])} pos {int(m.pos[i])}: {label.x} {int(a)} vs {label.y} {int(b)}"
                for i, a, b in zip(shown, tx, ty, strict=True)] + rows[len(shown):]
    return [Explanation(
        "chunk_boundary_token",
        f"{what} differs only at chunked-prefill boundaries: all {len(bad)} failing rows are the last row of a "
        f"non-final prefill chunk ({n_ends} such rows in {len(ends)} requests), where the draft extend must read the "
        "next chunk's first prompt token; serving fed it another token there",
        (f"prefill chunks recorded per request: {reqs}", *rows),
        fix_of("chunk_boundary_token"))]


__all__ = ["explain_history", "explain_chunk_boundary"]


def explain_group(first) -> list:
    """``concentrated_rows``: the structural group a divergence was called in though its fail
    fraction over all rows is under the allowance (groups.py), with its failing rows; empty otherwise."""
    c = getattr(first, "concentration", None) if first is not None else None
    if c is None or not c.fired:
        return []
    rows = [f"seq {r['seq']} pos {r['pos']} depth {r['depth']}: rel {r['rel']:.3g}" for r in c.evidence_rows[:8]]
    detail = [f"{k}: {v}" for k, v in (c.detail or {}).items()]
    return [Explanation(c.cause, c.message, (*rows, *detail),
                        fix_of("concentrated_rows"))]


__all__ += ["explain_group"]
