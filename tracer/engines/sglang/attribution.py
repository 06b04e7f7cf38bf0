"""Row attribution of the SGLang EAGLE-3 recorder (in the writer process, or thread): one ``IterCapture`` -> trace rows.

Attribution (EAGLE-3 pairing: the draft row at t consumes (h_t, x_{t+1}) at depth 0, and its
own feedback with token x_{t+1+k} at depth k):

- prefill, request b with prefix p and extend e: target rows at t = p..p+e-1 (iter -1); the
  draft extend reads ``x_{t+1}`` at row t (the last one is the sampled token), depth 0; its
  logits / hidden exist only for the last row t = p+e-1 (capture LAST).
- decode iteration with committed KV length L (the root / previous bonus token sits at L),
  accept length a: accepted tree nodes are at t = L..L+a-1 (their target aux rows, predict =
  target argmax, and the draft-extend rows of the same positions, depth 0). The draft steps
  of the iteration continue from the last draft-extend row of the previous iteration, at
  t = L-1: forward i (0-based) is depth i+1; ``select_top_k_tokens(i)`` gets the mapped ids
  of depth i. With topk > 1 a (seq, pos, depth) key holds topk rows (one per branch); the
  first row of each depth continues the first row of the depth above (``_branch_order``).
- the midlayer taps (``draft_stages``: hidden_in, positions, attn_in, hidden_out) come in
  each draft forward's row order and are attributed like its input ids: every prefill row,
  the accepted draft-extend rows, every draft-step branch.
- ``verify.*`` rows are keyed by pos = L (the tree root's position), depth 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specdiff.tracer.engines import target_logits
from specdiff.tracer.engines.recorder import ServingRecorder, add_aux
from specdiff.tracer.engines.requests import sequence_id
from specdiff.tracer.engines.sglang.row_select import to_kept_rows
from specdiff.tracer.rows import RowBatch


class RecorderState(ServingRecorder):
    """What attribution reads of the SGLang recorder (``hooks.Recorder``, which sets these): the
    shared recorder state plus the served draft tree's ``topk``. Declared here, not imported, so
    that hooks (which imports this module) and attribution do not import each other."""

    topk: int


# ---- what the hot path hands over ------------------------------------------------------------
@dataclass
class DraftForward:
    """One draft ModelRunner.forward: mode, inputs and reduced outputs (host copies)."""

    mode: str  # "extend" (prefill draft extend) | "extend_v2" (decode draft extend) | "decode"
    input_ids: Any = None
    positions: Any = None
    fc_in: Any = None
    fc_out: Any = None
    hidden: Any = None
    logits: Any = None  # full (capture full)
    lt_values: Any = None
    lt_ids: Any = None
    lse: Any = None
    topk_ids: Any = None  # draft-vocab top-k computed from the logits (draft steps)
    stages: dict = field(default_factory=dict)  # midlayer taps (draft_stages), forward row order
    #: CPU server: the logits as served [rows, draft vocab], reduced by the writer (``reduce_logits``
    #: with ``reduce``: (k of the top-k, the spec top-k or None, keep the full logits))
    raw_logits: Any = None
    reduce: tuple | None = None


def reduce_logits(df: DraftForward, logits: torch.Tensor, k: int, topk: int | None, full: bool) -> None:
    """Fill ``df``'s reductions of ``logits`` [rows, vocab]: the top-``k`` values and ids, the
    logsumexp (float32), the spec ``topk`` ids (draft steps; None: not taken) and, with ``full``, the
    logits themselves. On a GPU the hot path calls it on the device (outputs then copied); on a CPU
    server the writer does, on the staged logits: there torch runs these small reductions on its
    intra-op threads, and ``logsumexp`` of [4, 1024] took 0.5-2 ms on the 2-core server (22 us on one
    thread), against ~3 us to copy the logits into the ring.

    Large draft vocabularies are staged raw too (no size cap): the copy stays 10-50x cheaper than
    this reduction on the serving thread at every size measured (2 intra-op threads, fp32; copy vs
    reduce: [4, 32000] 5 us vs 280 us, [16, 32000] 25 us vs 1.1 ms, [64, 128256] 1.4 ms vs 17 ms).
    The cost moves to the ring (rows x vocab x 4 bytes a draft forward) and the writer (one thread:
    [4, 32000] 0.5 ms, [64, 128256] 25 ms), both bounded: a writer that falls behind drops whole
    requests, counted (tracer/engines/writer/thread.py), never the server's time."""
    k = min(k, logits.shape[-1])
    df.lt_values, df.lt_ids = torch.topk(logits, k, dim=-1)
    df.lse = torch.logsumexp(logits.float(), dim=-1)
    if topk is not None:
        df.topk_ids = torch.topk(logits, min(topk, logits.shape[-1]), dim=-1).indices
    if full:
        df.logits = logits


@dataclass
class IterCapture:
    """Everything recorded in one ``forward_batch_generation`` call."""

    iter: int
    kind: str  # "prefill" | "decode"
    rids: list[str]
    prompts: dict[str, Any] = field(default_factory=dict)  # rid -> prompt ids as SGLang 0.5.23 holds them (Req.origin_input_ids: array.array)
    prefix_lens: list[int] | None = None
    extend_lens: list[int] | None = None
    t: dict[str, Any] = field(default_factory=dict)
    draft: list[DraftForward] = field(default_factory=list)
    select: list[tuple[int, Any]] = field(default_factory=list)
    branch_parents: dict[int, Any] = field(default_factory=dict)  # select_top_k_tokens(i) tree_info[2]
    reasons: dict[str, str] = field(default_factory=dict)  # rids first recorded here -> why (requests.py)
    event: Any = None
    #: where the batch also held requests left out: ``rids`` are the recorded ones only, and
    #: ``batch_index`` their indices in the engine's batch (``batch_rids``); the hot path's
    #: ``row_select.RowSelection`` (``rows``, dropped before the hand-off) copied only their rows
    batch_index: list[int] | None = None
    batch_rids: list[str] | None = None
    rows: Any = None

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def nbytes(self) -> int:
        n = sum(v.nbytes for v in self.t.values() if isinstance(v, torch.Tensor))
        n += sum(v.nbytes for _, v in self.select if isinstance(v, torch.Tensor))
        for d in self.draft:
            n += sum(v.nbytes for v in vars(d).values() if isinstance(v, torch.Tensor))
            n += sum(v.nbytes for v in d.stages.values())
        return n


# ---- attribution (the writer) --------------------------------------------------------------
# Rows come from the server's batch metadata (prefix/extend lengths, accept index, draft tree),
# not from a [B, T] layout, so only the per-name gathering (tracer.rows.RowBatch) is shared with
# the training-side row builder; the logits were reduced on the device in the hot path (GPU) or
# are reduced here from the staged logits (CPU, ``reduce_logits``).


def _add_draft_rows(rec: RecorderState, out: RowBatch, df: DraftForward, sel, seq, pos, depth, it,
                    *, has_logits=True, lsel=None, tokens=True) -> None:
    """Add the draft tensors of rows ``sel`` (inputs, fc, midlayer taps) and ``lsel`` (logits;
    hidden_out too when the final-norm tap did not record it). ``tokens=False`` leaves out the
    input tokens (see ``_branch_order``)."""
    lsel = sel if lsel is None else lsel
    if df.input_ids is not None and tokens:
        out.add("tokens", df.input_ids[sel], seq=seq, pos=pos, depth=depth, iter=it)
    if df.fc_out is not None and df.fc_out.shape[0] == df.input_ids.shape[0]:
        out.add("draft.fc_in", df.fc_in[sel], seq=seq, pos=pos, depth=depth, iter=it)
        out.add("draft.fc_out", df.fc_out[sel], seq=seq, pos=pos, depth=depth, iter=it)
    n = df.input_ids.shape[0] if df.input_ids is not None else None
    for name, t in df.stages.items():
        if t.shape[0] == n:  # the taps see the forward's rows in input_ids order
            out.add(name, (t.to(torch.int64) if name == "draft.positions" else t)[sel], seq=seq, pos=pos,
                    depth=depth, iter=it)
    if not has_logits:
        return
    lpos, ldepth = pos, depth
    if df.hidden is not None and "draft.hidden_out" not in df.stages:
        out.add("draft.hidden_out", df.hidden[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
    if df.lt_values is not None:
        out.add("draft.logits_topk.values", df.lt_values[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
        out.add("draft.logits_topk.ids", df.lt_ids[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
        out.add("draft.logsumexp", df.lse[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
    if df.logits is not None:
        out.add("draft.logits", df.logits[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)


def _parents(next_token: np.ndarray, next_sibling: np.ndarray) -> np.ndarray:
    n = next_token.shape[0]
    par = np.full(n, -1, np.int64)
    for j in range(n):
        c = int(next_token[j])
        guard = 0
        while 0 <= c < n and guard <= n:
            par[c] = j
            c = int(next_sibling[c])
            guard += 1
    return par


def reduce_staged(cap: IterCapture) -> None:
    """Reduce the draft logits a CPU server staged (``DraftForward.raw_logits``), in the writer."""
    for df in cap.draft:
        if df.raw_logits is not None:
            reduce_logits(df, df.raw_logits, *df.reduce)
            df.raw_logits = None


def write_capture(rec: RecorderState, tw, cap: IterCapture) -> None:
    """Attribute one iteration's captured tensors and append them (in the writer)."""
    reduce_staged(cap)
    out = RowBatch()
    touched: set[str] = set()
    if cap.kind == "prefill":
        _write_prefill(rec, tw, cap, out, touched)
    else:
        _write_decode(rec, tw, cap, out, touched)
    # Tokens before rows: a killed server's trace ends at any journal write, and a target row at
    # t must never be on disk without the token x_{t+1} it is compared against.
    for rid in touched:
        toks = rec.seq_tokens[rid]
        tw.add_sequence(np.asarray(toks, np.int32), prompt_len=rec.seq_prompt[rid], rid=rid,
                        seq_id=rec.seq_ids[rid])
    out.flush(tw)


def _write_prefill(rec, tw, cap, out, touched) -> None:
    aux = cap.t.get("target_aux")
    nti = cap.t.get("next_token_ids")
    de = next((d for d in cap.draft if d.mode == "extend"), None)
    de_topk = cap.t.get("de_topk_index")
    top = target_logits.top(cap.t)  # one row per request: its last position's
    if top is not None and top[0].shape[0] != len(cap.rids):
        top = None
    off = 0
    for b, rid in enumerate(cap.rids):
        p, e = cap.prefix_lens[b], cap.extend_lens[b]
        rows = slice(off, off + e)
        off += e
        if not rec.keep_rid(rid):
            continue
        sid = sequence_id(rec, tw, rid, cap.prompts.get(rid))
        pos = np.arange(p, p + e)
        prompt_len = rec.seq_prompt[rid]
        final = p + e >= prompt_len
        if aux is not None:
            add_aux(rec, out, aux[rows], sid, pos, -1)
        last = p + e - 1
        if final and nti is not None:
            tok = int(nti[b])
            out.add("target.argmax", torch.tensor([tok]), seq=sid, pos=last, depth=0, iter=-1)
            target_logits.add_rows(out, top, b, seq=sid, pos=last, it=-1)
            toks = rec.seq_tokens[rid]
            if len(toks) == last + 1:
                toks.append(tok)
                touched.add(rid)
        if de is not None:
            _add_draft_rows(rec, out, de, rows, sid, pos, 0, -1, has_logits=False)
            if final:
                tapped = "draft.hidden_out" in de.stages  # then every row's hidden_out is in already
                _add_draft_rows(rec, out, DraftForward(mode="extend", hidden=None if tapped else de.hidden,
                                                       lt_values=de.lt_values,
                                                       lt_ids=de.lt_ids, lse=de.lse, logits=de.logits),
                                slice(b, b + 1), sid, last, 0, -1)
        if final and de_topk is not None:
            out.add("draft.topk", de_topk[b:b + 1], seq=sid, pos=last, depth=0, iter=-1)


def _write_decode(rec, tw, cap, out, touched) -> None:
    t = cap.t
    bs = len(cap.rids)
    L = t["seq_lens"].to(torch.int64).numpy()
    it = cap.iter
    predict = t.get("predict")
    acc_len = t.get("accept_lens")
    acc_idx = t.get("accept_index")
    if predict is None or acc_len is None or acc_idx is None:
        return
    predict = predict.to(torch.int64)
    acc_len = acc_len.to(torch.int64).numpy()
    N = predict.shape[0] // bs
    rindex = t.get("retrieve_index")
    if cap.batch_index is not None:  # verify rows of the engine's batch -> of the recorded requests'
        acc_idx = to_kept_rows(acc_idx, cap.batch_index, N)
        rindex = None if rindex is None else to_kept_rows(rindex, cap.batch_index, N)
    acc_idx = acc_idx.to(torch.int64).view(bs, -1)
    slots = acc_idx.shape[1]
    k = rec.topk
    aux = t.get("target_aux")
    vpos = t.get("verify_positions")
    dt = t.get("draft_token")
    nxt, sib = t.get("retrieve_next_token"), t.get("retrieve_next_sibling")
    de = next((d for d in cap.draft if d.mode == "extend_v2"), None)
    de_topk = t.get("de_topk_index")
    top = target_logits.top(t)  # one row per verified tree node
    if top is not None and top[0].shape[0] != bs * N:
        top = None
    steps = [d for d in cap.draft if d.mode == "decode"]
    for b, rid in enumerate(cap.rids):
        if not rec.keep_rid(rid):
            continue
        sid = sequence_id(rec, tw, rid)
        Lb, a = int(L[b]), int(acc_len[b])
        gidx = acc_idx[b, :a]
        local = acc_idx[b].clone()
        local[local >= 0] -= b * N
        accepted = torch.full((slots,), -1, dtype=torch.int64)
        accepted[:a] = predict[gidx]
        # verify rows
        out.add("verify.accept_length", torch.tensor([a]), seq=sid, pos=Lb, depth=0, iter=it)
        out.add("verify.accept_index", local[None], seq=sid, pos=Lb, depth=0, iter=it)
        out.add("verify.accepted_tokens", accepted[None], seq=sid, pos=Lb, depth=0, iter=it)
        out.add("verify.predict", predict[b * N:(b + 1) * N][None], seq=sid, pos=Lb, depth=0, iter=it)
        if dt is not None:
            out.add("verify.draft_tokens", dt.view(bs, -1)[b][None], seq=sid, pos=Lb, depth=0, iter=it)
        if rindex is not None:
            ri = rindex.to(torch.int64).view(bs, -1)[b].clone()
            ri[ri >= b * N] -= b * N
            out.add("verify.retrieve_index", ri[None], seq=sid, pos=Lb, depth=0, iter=it)
        if nxt is not None and sib is not None:
            nt = nxt.to(torch.int64).view(bs, -1)[b].numpy()
            ns = sib.to(torch.int64).view(bs, -1)[b].numpy()
            out.add("verify.parents", torch.as_tensor(_parents(nt, ns))[None], seq=sid, pos=Lb, depth=0, iter=it)
        # accepted target rows: positions of the accepted nodes
        pos = (vpos.to(torch.int64)[gidx].numpy() if vpos is not None else Lb + np.arange(a))
        if aux is not None and aux.shape[0] == bs * N:
            add_aux(rec, out, aux[gidx], sid, pos, it)
        out.add("target.argmax", predict[gidx], seq=sid, pos=pos, depth=0, iter=it)
        target_logits.add_rows(out, top, gidx, seq=sid, pos=pos, it=it)
        # committed tokens
        toks = rec.seq_tokens[rid]
        if len(toks) == Lb + 1:
            toks.extend(int(x) for x in predict[gidx])
            touched.add(rid)
        # draft extend (accepted path is at the front of the request's block), depth 0
        if de is not None and de.input_ids is not None and de.input_ids.shape[0] == bs * N:
            rows = slice(b * N, b * N + a)
            dpos = Lb + np.arange(a)
            _add_draft_rows(rec, out, de, rows, sid, dpos, 0, it)
        if de_topk is not None:
            out.add("draft.topk", de_topk[b:b + 1], seq=sid, pos=Lb + a - 1, depth=0, iter=it)
        # draft steps of this iteration, continuing from the row at L-1
        orders = _branch_order(cap, steps, b, k, committed=predict[gidx])
        for i, df in enumerate(steps):
            perm, on_path = orders[i + 1]
            rows = b * k + perm
            _add_draft_rows(rec, out, df, rows, sid, Lb - 1, i + 1, it, tokens=on_path)
            if df.input_ids is not None:  # every branch as fed (mapped by hot_token_id), on the path or not
                out.add("draft.input_ids", df.input_ids[rows], seq=sid, pos=Lb - 1, depth=i + 1, iter=it)
            if df.topk_ids is not None:
                out.add("draft.topk", df.topk_ids[rows], seq=sid, pos=Lb - 1, depth=i + 1, iter=it)
        for i, ids in cap.select:
            ids = ids.reshape(-1, k)
            per = ids.shape[0] // bs
            perm = orders[i][0] if per == k and i in orders else torch.arange(per)
            out.add("draft.topk_target", ids[b * per + perm], seq=sid, pos=Lb - 1, depth=i, iter=it)


def _branch_order(cap: IterCapture, steps: list, b: int, k: int, *, committed) -> dict[int, tuple]:
    """Row order of request ``b``'s topk branches at each draft depth d >= 1: ``{d: (perm, on_path)}``.

    The diff pairs a (seq, pos, depth) key by its first row and compares depth d only where the
    first rows' input tokens equal the teacher-forced tokens at every depth 0..d. That is sound
    only if the first rows form ONE draft path, so the first row at depth d is a child of the first
    row at depth d-1 (SGLang spec_utils.py ``_select_top_k_tokens_later``: the parent of row r of
    step i is ``(tree_info[2][r] - (k*k*(i-1) + k)) // k``; every row of step 0 descends from the
    draft-extend row). Among the children, the one whose token is the committed token
    ``committed[d-1]`` (x_{L+d}) goes first, else SGLang's best-scored. When no child survived
    SGLang's top-k, the path ends: from that depth on ``on_path`` is False and the rows are written
    without ``tokens``, so the diff does not compare them against the teacher-forced path.
    Depth 0 (one row per request) gets ``(arange(1), True)``.
    """
    orders: dict[int, tuple] = {0: (torch.arange(1), True)}
    first, on_path = 0, True
    for i, df in enumerate(steps):
        d = i + 1
        par = cap.branch_parents.get(i)
        if k == 1:  # a chain: one row per depth, one path
            orders[d] = (torch.arange(1), on_path)
            continue
        if df.input_ids is None or (i > 0 and par is None):  # parents unknown: no path can be claimed
            on_path = False
        if on_path:
            parent = (torch.zeros(k, dtype=torch.int64) if i == 0
                      else (par.to(torch.int64).view(-1, k)[b] - (k * k * (i - 1) + k)) // k)
            children = [r for r in range(k) if int(parent[r]) == first]
            on_path = bool(children)
        if not on_path:
            orders[d] = (torch.arange(k), False)
            continue
        ids = df.input_ids[b * k:(b + 1) * k].to(torch.int64)
        teacher = int(committed[i]) if i < len(committed) else None
        pick = next((r for r in children if int(ids[r]) == teacher), children[0])
        orders[d] = (torch.tensor([pick] + [r for r in range(k) if r != pick]), True)
        first = pick
    return orders

