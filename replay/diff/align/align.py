"""Align two traces: sequences by token content, then rows by (pos, depth).

Serving and training record the same sequences in different batch layouts, row orders and
request ids, so nothing but the tokens is trusted: a sequence pairs with the other side's
sequence whose tokens are equal, or one a prefix of the other (a replay may stop early).
Rows then pair on ``(pos, depth)`` within the common length. Serving records depth > 0 only
along drafted paths, so alignment is sparse there; ``coverage`` says how sparse.

When a sequence has no exact partner, the two sides may have tokenized the same text in
different formats (BOS added or dropped, a chat template's role markers, a space-prefixed first
token, a template suffix). Such sequences pair by content: the longest common token run, found
by ``difflib.SequenceMatcher`` among the candidates that share the most 4-grams. The pair then
carries a ``TokenFormat`` (what precedes and follows the common run on each side), and rows pair
on the positions of the common run (``SeqPair.start`` per side), so the stages are compared on
the overlapping part while ``tokens`` is the first divergence.
"""

from __future__ import annotations

from collections import Counter
from difflib import SequenceMatcher

import numpy as np

from specdiff.replay.diff.types import Alignment, Pair, RowMatch, SeqPair, TokenFormat
from specdiff.tracer.errors import SpecdiffError


class AlignmentError(SpecdiffError):
    """The two traces cannot be aligned (no common sequence)."""


NGRAM = 4  # content pairing: candidates share the most 4-grams
CANDIDATES = 4  # content pairing: longest-run search on this many candidates per sequence
TAIL = 8  # tokens after the common run kept for the report


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


def _ngrams(tokens: np.ndarray) -> set[tuple[int, ...]]:
    t = tokens.tolist()
    return {tuple(t[i:i + NGRAM]) for i in range(len(t) - NGRAM + 1)}


def _longest_run(a: np.ndarray, b: np.ndarray):
    """(start in a, start in b, size) of the longest common contiguous token run."""
    m = SequenceMatcher(None, a.tolist(), b.tolist(), autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return m.a, m.b, m.size


def _content_pair(sx, sy, run, index: int) -> SeqPair:
    a, b, size = run
    if a == 0 and b == 0:
        # A common prefix, then other tokens (e.g. another model's greedy continuation): the same
        # format, paired on the prefix like a shorter replay.
        return SeqPair(index, Pair(sx.id, sy.id), size, min(sx.prompt_len, sy.prompt_len, size))
    fmt = TokenFormat(_common_prefix(sx.tokens, sy.tokens),
                      Pair(tuple(int(t) for t in sx.tokens[:a]), tuple(int(t) for t in sy.tokens[:b])),
                      Pair(tuple(int(t) for t in sx.tokens[a + size:a + size + TAIL]),
                           tuple(int(t) for t in sy.tokens[b + size:b + size + TAIL])), size)
    plen = max(0, min(sx.prompt_len - a, sy.prompt_len - b, size))
    return SeqPair(index, Pair(sx.id, sy.id), size, plen, Pair(a, b), fmt)


def _head(tokens: np.ndarray, decode) -> str:
    ids = [int(t) for t in tokens[:6]]
    text = decode(ids) if decode else None
    return f"{ids}" + (f" ({text!r})" if text is not None else "")


def align_sequences(traces: Pair, *, min_common: int = 2, min_run: int = 4, decode=None) -> Alignment:
    """Pair sequences of two traces by token content.

    First exactly: one side's tokens a prefix of the other's (equal included), at least
    ``min_common`` tokens; each sequence pairs at most once, the longest common prefix wins. Then
    the rest by content: the longest common token run (at least ``min_run`` tokens) with one of
    the unpaired sequences sharing the most 4-grams. A run that starts both sequences pairs them on
    that prefix (the continuations part later); any other run means another token format, and the
    pair carries a ``TokenFormat``.

    Args:
        decode: optional ``ids -> str`` (the target tokenizer), only for the error message.

    Raises:
        AlignmentError: no sequence pairs even by content (one line naming both paths, the nearest
            pair and their first tokens).
    """
    xs, ys = traces.x.sequences, traces.y.sequences
    by_head: dict[tuple, list] = {}
    for s in ys:
        by_head.setdefault(tuple(s.tokens[:min_common].tolist()), []).append(s)
    used: set[int] = set()
    pairs: list[SeqPair] = []
    unmatched_x: list = []
    for sx in xs:
        best, best_len = None, 0
        for sy in by_head.get(tuple(sx.tokens[:min_common].tolist()), ()):
            if sy.id in used:
                continue
            n = _common_prefix(sx.tokens, sy.tokens)
            if n == min(len(sx.tokens), len(sy.tokens)) and n > best_len:
                best, best_len = sy, n
        if best is None or best_len < min_common:
            unmatched_x.append(sx)
            continue
        used.add(best.id)
        pairs.append(SeqPair(len(pairs), Pair(sx.id, best.id), best_len,
                             min(sx.prompt_len, best.prompt_len, best_len)))
    # Content pass: candidates by shared 4-grams, then the longest common run.
    grams = {s.id: _ngrams(s.tokens) for s in ys if s.id not in used} if unmatched_x else {}
    index: dict[tuple, list[int]] = {}
    for sid, g in grams.items():
        for ng in g:
            index.setdefault(ng, []).append(sid)
    ys_by_id = {s.id: s for s in ys}
    still: list[int] = []
    nearest = (0, None, None)
    for sx in unmatched_x:
        hits = Counter(sid for ng in _ngrams(sx.tokens) for sid in index.get(ng, ()) if sid not in used)
        best, best_run = None, (0, 0, 0)
        for sid, _ in hits.most_common(CANDIDATES):
            run = _longest_run(sx.tokens, ys_by_id[sid].tokens)
            if run[2] > best_run[2]:
                best, best_run = ys_by_id[sid], run
        if best is not None and best_run[2] > nearest[0]:
            nearest = (best_run[2], sx, best)
        if best is None or best_run[2] < min_run:
            still.append(sx.id)
            continue
        used.add(best.id)
        pairs.append(_content_pair(sx, best, best_run, len(pairs)))
    if not pairs:
        if nearest[1] is None and xs and ys:  # no shared 4-gram: compare the first sequences' heads
            nearest = (_longest_run(xs[0].tokens, ys[0].tokens)[2], xs[0], ys[0])
        near = ""
        if nearest[1] is not None:
            run, sx, sy = nearest
            near = (f"; nearest pair: A seq {sx.id} and B seq {sy.id} share {run} token(s) in a row, "
                    f"A starts {_head(sx.tokens, decode)}, B starts {_head(sy.tokens, decode)}")
        raise AlignmentError(
            f"{traces.x.path} and {traces.y.path} share no token sequence, not even by content "
            f"({len(xs)} vs {len(ys)} sequences){near}: record the training side from the serving trace's "
            "sequences (`specdiff record train --replay SERVE_TRACE`) or with the serving token format")
    unmatched_y = tuple(s.id for s in ys if s.id not in used)
    return Alignment(tuple(pairs), Pair(tuple(still), unmatched_y))


def _keyed(trace, name: str, seq_to_pair: dict[int, tuple[int, int, int]]):
    """Packed (pair, aligned pos, depth) keys of ``name``'s rows [rows] and which rows lie in a
    pair's common part. ``seq_to_pair``: seq id -> (pair index, common length, start)."""
    keys = trace.keys(name, columns=("seq", "pos", "depth"))
    seq, pos = keys["seq"].astype(np.int64), keys["pos"].astype(np.int64)
    valid = np.zeros(len(seq), bool)
    pair_of, start_of = np.full(len(seq), -1, np.int64), np.zeros(len(seq), np.int64)
    if seq_to_pair and len(seq):
        # One sorted lookup for every row (a mask per sequence was rows x sequences: 27 s at 20 GiB).
        ids = np.fromiter(seq_to_pair, np.int64, len(seq_to_pair))
        table = np.array(list(seq_to_pair.values()), np.int64).reshape(-1, 3)
        order = np.argsort(ids)
        ids, table = ids[order], table[order]
        at = np.minimum(np.searchsorted(ids, seq), len(ids) - 1)
        pair_idx, length, start = table[at].T
        valid = (ids[at] == seq) & (pos >= start) & (pos < start + length)
        pair_of[valid], start_of[valid] = pair_idx[valid], start[valid]
    # First occurrence wins when keys repeat (tree siblings at one depth).
    return pack_keys(pair_of, np.where(valid, pos - start_of, 0), keys["depth"]), valid


def rows_by_value(values: np.ndarray) -> dict[int, np.ndarray]:
    """value -> the indices (int64, ascending) where int array ``values`` [n] holds it.

    One stable sort for all groups: a mask per sequence (``values == s`` in a loop over
    sequences) costs rows x sequences, which at production size is minutes.
    """
    values = np.asarray(values).reshape(-1)
    if not len(values):
        return {}
    order = np.argsort(values, kind="stable")
    uniq, starts = np.unique(values[order], return_index=True)
    return {int(v): idx for v, idx in zip(uniq.tolist(), np.split(order, starts[1:]), strict=True)}


def pack_keys(pair: np.ndarray, pos: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """One sortable int64 per row: pair << 40 | pos << 8 | depth (depth < 256, pos < 2**32)."""
    return (pair.astype(np.int64) << 40) | (pos.astype(np.int64) << 8) | depth.astype(np.int64)


def match_rows(traces: Pair, alignment: Alignment, name: str, name_y: str | None = None) -> RowMatch:
    """Pair the rows of tensor ``name`` on (aligned seq, pos, depth).

    ``name_y`` pairs ``name`` on side A with another tensor on side B (e.g. an aux slot against a
    layer probe, for layer identification).

    Rows whose (seq, pos, depth) repeats on one side (several tree branches at one depth) keep
    their first occurrence. Rows outside a pair's common part are ignored; ``pos`` of the result
    is the aligned position (``SeqPair.start`` subtracted on each side).
    """
    maps = Pair({p.seq.x: (p.index, p.length, p.start.x) for p in alignment.seq_pairs},
                {p.seq.y: (p.index, p.length, p.start.y) for p in alignment.seq_pairs})
    kx, vx = _keyed(traces.x, name, maps.x)
    ky, vy = _keyed(traces.y, name_y or name, maps.y)
    ix, iy = np.nonzero(vx)[0], np.nonzero(vy)[0]
    ux, fx = np.unique(kx[ix], return_index=True)
    uy, fy = np.unique(ky[iy], return_index=True)
    common, cx, cy = np.intersect1d(ux, uy, assume_unique=True, return_indices=True)
    rows_x, rows_y = ix[fx[cx]], iy[fy[cy]]
    order = np.argsort(common, kind="stable")  # (pair, pos, depth) order
    common = common[order]
    return RowMatch(Pair(rows_x[order], rows_y[order]), common >> 40, (common >> 8) & 0xFFFFFFFF,
                    common & 0xFF, Pair(len(ux) - len(common), len(uy) - len(common)))
