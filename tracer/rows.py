"""Canonical trace rows from batched forward tensors: the row builder of the training side.

Owns what turns a draft's batched forward tensors into trace rows (tracer/schema.py), for both
training-side recorders: ``specdiff record train`` (replay/record/, through ``ttt_rows``) and the
torch hooks on a user's training loop (tracer/training_hooks.py, through the same pieces, one
hook call at a time):

- ``RowLayout``: the (seq, pos) of every flat row of a right-padded [B, T, ...] or packed
  [sum(lengths), ...] batch, and which rows the EAGLE-3 pairing defines (the draft's input ids are
  the target's shifted left by one, SGLang 0.5.23 srt/speculative/eagle_worker_v2.py:995): target
  and fc rows at t < length (depth 0); by-depth rows at t + 1 + k < length (row t at depth k
  consumes x_{t+1+k}); the label of row t at depth k is the target argmax at t + 1 + k of the same
  sequence.
- ``draft_outputs``: one depth's draft logits as ``draft.logits`` or ``draft.logits_topk.*`` +
  ``draft.logsumexp``, ``draft.topk``, ``draft.topk_target`` and, given labels, ``draft.accept``
  / ``draft.accept_cum`` (the chain rule of ``specdiff.eagle3.acceptance``).
- ``RowBatch``: rows gathered per tensor name and appended once per name (one journal record
  per name and batch).

The SGLang recorder (tracer/engines/sglang/attribution.py) shares ``RowBatch`` only: its rows come from the
server's batch metadata (prefix / extend lengths, accept index, draft tree), not from a
[B, T] layout, and its logits are reduced on the device inside the scheduler's forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdiff.eagle3.acceptance import chain_accept
from specdiff.tracer.schema import aux_name, layer_out_name

__all__ = ["LOGITS_LEVELS", "TOPK_WIDTH", "RowLayout", "RowBatch", "AcceptChain", "draft_topk", "draft_top_ids",
           "draft_outputs", "target_rows", "ttt_rows"]

#: how draft logits are recorded: ``default`` top-k values/ids + logsumexp, ``full`` every
#: logit, ``none`` neither (``draft.topk`` / ``draft.topk_target`` always)
LOGITS_LEVELS = ("default", "full", "none")


def _ints(x) -> np.ndarray:
    return np.asarray(torch.as_tensor(x).cpu(), dtype=np.int64).reshape(-1)


@dataclass(frozen=True)
class RowLayout:
    """Keys of the flat rows of one batch.

    Attributes:
        seq: int64 [N], trace sequence id of flat row r.
        pos: int64 [N], position t of row r inside its sequence.
        length: int64 [N], the length of row r's sequence.
        T: positions per batch row of a padded layout (N = B*T); 0 when packed (N = sum(lengths)).
    """

    seq: np.ndarray
    pos: np.ndarray
    length: np.ndarray
    T: int

    @classmethod
    def padded(cls, seq_ids, lengths, T: int | None = None) -> RowLayout:
        """Right-padded [B, T] batch: row b -> sequence ``seq_ids[b]``, valid for t < lengths[b].

        Raises:
            ValueError: seq_ids and lengths differ in count, or ``T`` < the longest length.
        """
        seq_ids, lengths = _ints(seq_ids), _ints(lengths)
        if len(seq_ids) != len(lengths):
            raise ValueError(f"{len(seq_ids)} seq ids but {len(lengths)} lengths")
        longest = int(lengths.max()) if len(lengths) else 0
        T = longest if T is None else int(T)
        if T < longest:
            raise ValueError(f"T = {T} positions per row, but a sequence is {longest} long")
        return cls(np.repeat(seq_ids, T), np.tile(np.arange(T, dtype=np.int64), len(seq_ids)),
                   np.repeat(lengths, T), T)

    @classmethod
    def packed(cls, seq_ids, lengths) -> RowLayout:
        """Packed batch: the sequences back to back, [sum(lengths)] rows.

        Raises:
            ValueError: seq_ids and lengths differ in count.
        """
        seq_ids, lengths = _ints(seq_ids), _ints(lengths)
        if len(seq_ids) != len(lengths):
            raise ValueError(f"{len(seq_ids)} seq ids but {len(lengths)} lengths")
        starts = np.cumsum(lengths) - lengths
        return cls(np.repeat(seq_ids, lengths), np.arange(int(lengths.sum())) - np.repeat(starts, lengths),
                   np.repeat(lengths, lengths), 0)

    @property
    def rows(self) -> int:
        return len(self.seq)

    def defined(self, depth: int | None = None) -> np.ndarray:
        """Flat indices (ascending) of the rows the pairing defines: ``depth`` None: t < length
        (target rows, fc rows); depth k: t + 1 + k < length."""
        ok = self.pos < self.length if depth is None else self.pos + 1 + depth < self.length
        return np.nonzero(ok)[0]

    @staticmethod
    def label_index(idx: np.ndarray, depth: int) -> np.ndarray:
        """Flat index of position t + 1 + k of the same sequence, for rows ``idx`` defined at
        depth k (their label's row: it exists because t + 1 + k < length)."""
        return idx + 1 + depth

    def flat(self, x: torch.Tensor, feat_dims: int) -> torch.Tensor:
        """``x`` as [N, *feat] on its device (detached).

        ``x`` is [B, T', *feat] (padded; a forward over T' != T positions is realigned by (b, t))
        or [N', *feat] / [1, N', *feat] (packed); the flat rows are cut or zero-padded to N.
        """
        x = x.detach()
        lead, feat = x.shape[: x.dim() - feat_dims], tuple(x.shape[x.dim() - feat_dims:])
        flat = x.reshape(int(np.prod(lead)) if lead else 1, *feat)
        if self.T and len(lead) == 2 and lead[1] != self.T:
            B, Tx = lead
            full = x.new_zeros((B, self.T, *feat))
            n = min(Tx, self.T)
            full[:, :n] = x.reshape(B, Tx, *feat)[:, :n]
            flat = full.reshape(B * self.T, *feat)
        n = self.rows
        if flat.shape[0] > n:
            return flat[:n]
        if flat.shape[0] < n:
            return torch.cat([flat, flat.new_zeros((n - flat.shape[0], *feat))])
        return flat

    def take(self, x: torch.Tensor, idx: np.ndarray, feat_dims: int) -> torch.Tensor:
        """Rows ``idx`` of ``x`` (see ``flat``), gathered on x's device, returned on the host."""
        flat = self.flat(x, feat_dims)
        return flat.index_select(0, torch.as_tensor(idx, device=flat.device)).cpu()


def _concat_keys(parts: list[tuple], i: int, total: int) -> np.ndarray:
    """Key ``i`` (1..4: seq, pos, depth, iter) of every piece of one name as int64 [total]: one
    array filled in place, a scalar key by slice assignment. The writer process adds ~40 pieces a
    request an iteration; a per-piece ``np.full`` / ``np.broadcast_to`` and then a concatenate were
    a third of its CPU (profiled with py-spy on the CPU server)."""
    out = np.empty(total, np.int64)
    at = 0
    for p in parts:
        n = p[0].shape[0]
        out[at:at + n] = p[i]
        at += n
    return out


class RowBatch:
    """Rows of many canonical tensors, gathered per name; ``flush`` appends each name once,
    its pieces concatenated in the order they were added."""

    def __init__(self):
        self.parts: dict[str, list[tuple]] = {}

    def add(self, name: str, values, *, seq, pos, depth=0, iter=-1) -> None:
        """Rows ``values`` [n, ...] (torch or numpy) with keys (int, or ints [n]: kept as given
        until ``flush``, so the caller must not change them); n = 0 is a no-op.

        Raises:
            ValueError: a key array's length is not n.
        """
        values = values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
        n = values.shape[0]
        if n == 0:
            return
        for k in (seq, pos, depth, iter):
            if not isinstance(k, (int, np.integer)) and np.shape(k) not in ((n,), (), (1,)):
                raise ValueError(f"{name}: a key of shape {np.shape(k)} for {n} rows")
        self.parts.setdefault(name, []).append((values, seq, pos, depth, iter))

    def add_rows(self, name: str, values, layout: RowLayout, idx: np.ndarray, *, depth: int,
                 iter: int = -1) -> None:
        """Rows ``values`` [len(idx), ...] keyed by the layout's rows ``idx`` at ``depth``."""
        self.add(name, values, seq=layout.seq[idx], pos=layout.pos[idx], depth=depth, iter=iter)

    def _name(self, parts: list[tuple]) -> tuple:
        """(values, seq, pos, depth, iter) of one name, its pieces concatenated."""
        data = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        return (data, *(_concat_keys(parts, i, data.shape[0]) for i in range(1, 5)))

    def flush(self, writer) -> None:
        """Append every gathered name to ``writer`` (a TraceWriter) and forget them."""
        for name, parts in self.parts.items():
            data, seq, pos, depth, it = self._name(parts)
            writer.append(name, data, seq=seq, pos=pos, depth=depth, iter=it)
        self.parts = {}

    def collected(self) -> dict[str, tuple]:
        """name -> (values, seq, pos, depth, iter), each name's pieces concatenated."""
        return {name: self._name(parts) for name, parts in self.parts.items()}


class AcceptChain:
    """``draft.accept_cum`` state over the flat rows of one forward, depth after depth.

    Rows not defined at depth k are not accepted at any depth > k.
    """

    def __init__(self, rows: int):
        self.cum = torch.ones(rows, dtype=torch.bool)

    def step(self, idx: np.ndarray, top1_target: torch.Tensor, label: torch.Tensor):
        """``(accept, accept_cum)`` bool [len(idx)] of rows ``idx`` at the next depth
        (``specdiff.eagle3.acceptance.chain_accept``)."""
        i = torch.as_tensor(idx, dtype=torch.int64)
        acc, cum = chain_accept(top1_target, label, self.cum[i])
        self.cum = torch.zeros_like(self.cum)
        self.cum[i] = cum
        return acc, cum


#: width of the one top-k taken over draft logits per row (and the default ``logits_topk``)
TOPK_WIDTH = 8


def draft_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending top-k ``(values float32, ids int64)`` of draft logits [..., Vd] over a float32
    copy (bf16 values are exact in float32)."""
    lf = logits.float()
    return lf.topk(min(k, lf.shape[-1]), dim=-1)


def draft_top_ids(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """``draft.topk``: int64 [..., topk] draft ids of the largest logits, descending.

    Always the first ``topk`` of one top-``max(TOPK_WIDTH, topk)``: torch breaks ties by an order
    that depends on k, so every recorder (record train, training hooks) and graft take the same
    k and agree on tied logits.
    """
    return draft_topk(logits, max(TOPK_WIDTH, topk))[1][..., :topk]


def draft_outputs(logits: torch.Tensor, *, level: str = "default", logits_topk: int = TOPK_WIDTH, topk: int = 1,
                  hot_token_id: torch.Tensor | None = None, label: torch.Tensor | None = None,
                  chain: AcceptChain | None = None, idx: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """The draft-output tensors of n rows at one depth, by canonical name (host tensors).

    Args:
        logits: [n, Vd] draft logits (any float dtype).
        level: ``default``: ``draft.logits_topk.values`` [n, logits_topk] (logits' dtype,
            descending), ``.ids`` int64 and ``draft.logsumexp`` float32 [n]; ``full``:
            ``draft.logits`` as given; ``none``: neither.
        topk: width of ``draft.topk`` int64 [n, topk] (``draft_top_ids``; SGLang ``fast_topk``);
            ``draft.topk_target`` = ``hot_token_id[draft.topk]`` (SGLang 0.5.23
            llama_eagle3.py:350-352 ``hot_token_id = d2t + arange``; the ids themselves if None).
        label: [n] int64, the target argmax at t + 1 + k: adds ``draft.accept`` and
            ``draft.accept_cum`` (needs ``chain`` and the rows' flat indices ``idx``).

    Raises:
        ValueError: unknown level, or a label without chain / idx.
    """
    if level not in LOGITS_LEVELS:
        raise ValueError(f"logits level {level!r}: use one of {', '.join(LOGITS_LEVELS)}")
    vals, ids = draft_topk(logits, max(TOPK_WIDTH, topk))  # the draft_top_ids call
    out: dict[str, torch.Tensor] = {}
    if level == "full":
        out["draft.logits"] = logits
    elif level == "default":
        lv, li = (vals, ids) if logits_topk <= vals.shape[-1] else draft_topk(logits, logits_topk)
        out["draft.logits_topk.values"] = lv[:, :logits_topk].to(logits.dtype)
        out["draft.logits_topk.ids"] = li[:, :logits_topk]
        out["draft.logsumexp"] = torch.logsumexp(logits.float(), dim=-1)
    top = ids[:, :topk]
    out["draft.topk"] = top
    out["draft.topk_target"] = hot_token_id.cpu()[top] if hot_token_id is not None else top
    if label is not None:
        if chain is None or idx is None:
            raise ValueError("accept rows need the AcceptChain and the rows' flat indices")
        out["draft.accept"], out["draft.accept_cum"] = chain.step(idx, out["draft.topk_target"][:, 0], label)
    return out


def target_rows(batch: RowBatch, layout: RowLayout, *, aux, aux_cat, argmax=None,
                hidden_states=None, probe_positions: int = 0, logits_top=None) -> None:
    """Add the target rows of a padded batch (t < length, depth 0).

    Args:
        aux: per slot [B, T, H] (``target.aux.{j}``); aux_cat: [B, T, K*H] (``target.aux_cat``).
        argmax: int64 [B, T], the target's greedy next token (``target.argmax``).
        logits_top: (values float32 [B, T, k], ids int64 [B, T, k]) or None: the target's k largest
            logits (``target.logits_topk.values`` / ``.ids``).
        hidden_states: every HF hidden state [B, T, H] (index i -> ``target.probe.{i}``),
            recorded at t < ``probe_positions``.
    """
    from specdiff.tracer.schema import probe_name

    idx = layout.defined(None)
    for j, a in enumerate(aux):
        batch.add_rows(aux_name(j), layout.take(a, idx, 1), layout, idx, depth=0)
    batch.add_rows("target.aux_cat", layout.take(aux_cat, idx, 1), layout, idx, depth=0)
    if argmax is not None:
        batch.add_rows("target.argmax", layout.take(argmax, idx, 0), layout, idx, depth=0)
    if logits_top is not None:
        batch.add_rows("target.logits_topk.values", layout.take(logits_top[0], idx, 1), layout, idx, depth=0)
        batch.add_rows("target.logits_topk.ids", layout.take(logits_top[1], idx, 1), layout, idx, depth=0)
    if probe_positions > 0 and hidden_states is not None:
        pidx = idx[layout.pos[idx] < probe_positions]
        for i, hs in enumerate(hidden_states):
            batch.add_rows(probe_name(i), layout.take(hs, pidx, 1), layout, pidx, depth=0)


#: by-depth tensors of a TTT forward: (attribute of the forward's output, canonical name, feature dims)
_DEPTH_TENSORS = (("tokens", "tokens", 0), ("hidden_in", "draft.hidden_in", 1),
                  ("positions", "draft.positions", 0), ("attn_in", "draft.attn_in", 1),
                  ("hidden_out", "draft.hidden_out", 1))


def ttt_rows(batch: RowBatch, layout: RowLayout, out, *, level: str = "default", logits_topk: int = TOPK_WIDTH,
             topk: int = 1, hot_token_id: torch.Tensor | None = None, argmax: torch.Tensor | None = None,
             on_depth=None) -> None:
    """Add the draft rows of one teacher-forced TTT forward over a padded batch.

    Args:
        out: the forward's outputs (``replay.model.draft_model.TTTOutput`` or alike): ``fc_in``
            [B,T,K*H], ``fc_out`` [B,T,Hd]; per depth k lists ``tokens`` / ``positions`` int64
            [B,T], ``hidden_in`` / ``hidden_out`` [B,T,Hd], ``attn_in`` [B,T,2Hd], ``logits`` [B,T,Vd];
            optionally ``layer_out`` (per depth, [B,T,Hd] per decoder layer 0..N-2: ``draft.layer_out.{i}``).
        level / logits_topk / topk / hot_token_id: see ``draft_outputs``.
        argmax: int64 [B,T] target argmax: adds ``draft.accept`` / ``draft.accept_cum``.
        on_depth: called ``on_depth(k, idx, outputs, chain)`` after depth k (statistics).
    """
    idx = layout.defined(None)
    batch.add_rows("draft.fc_in", layout.take(out.fc_in, idx, 1), layout, idx, depth=0)
    batch.add_rows("draft.fc_out", layout.take(out.fc_out, idx, 1), layout, idx, depth=0)
    labels = layout.flat(argmax, 0).cpu() if argmax is not None else None
    chain = AcceptChain(layout.rows) if argmax is not None else None
    for d in range(len(out.logits)):
        idx = layout.defined(d)
        for attr, name, feat in _DEPTH_TENSORS:
            batch.add_rows(name, layout.take(getattr(out, attr)[d], idx, feat), layout, idx, depth=d)
        if d:  # what the forward embedded at depth d: the draft's input ids (schema draft.input_ids)
            batch.add_rows("draft.input_ids", layout.take(out.tokens[d], idx, 0), layout, idx, depth=d)
        for i, h in enumerate(out.layer_out[d] if getattr(out, "layer_out", None) else ()):
            batch.add_rows(layer_out_name(i), layout.take(h, idx, 1), layout, idx, depth=d)
        label = labels[torch.as_tensor(layout.label_index(idx, d))] if labels is not None else None
        outs = draft_outputs(layout.take(out.logits[d], idx, 1), level=level, logits_topk=logits_topk,
                             topk=topk, hot_token_id=hot_token_id, label=label, chain=chain, idx=idx)
        for name, v in outs.items():
            batch.add_rows(name, v, layout, idx, depth=d)
        if on_depth is not None:
            on_depth(d, idx, outs, chain)


def token_list(prompt) -> list[int]:
    """A prompt's token ids as Python ints (writer side): from what the engines hold (SGLang 0.5.23
    ``Req.origin_input_ids``: an ``array.array``; vLLM ``prompt_token_ids``: a list), a numpy array
    or a CPU tensor, in one C-level conversion; None -> []."""
    if prompt is None:
        return []
    return np.asarray(prompt, dtype=np.int64).reshape(-1).tolist()
