"""The watch's per-request diff reads that request's rows, not the whole traces'.

``specdiff watch`` diffs each finished request of a growing serving trace against its replay in a
growing training trace (replay/watch/watcher.py ``diff_request``). Each side is a
``tracer.store.selection.Selection`` of the request's sequence, whose rows come from the row index
the ``TraceFollower`` keeps from the journal. Real ``TraceWriter`` stores with small chunks (32-row
float chunks, a commit every 4), left open like a live server's, so a request's rows lie partly in
committed zarr chunks and partly in the journalled tail.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from builders import TracePair

from specdiff.replay.diff.pipeline import diff_opened
from specdiff.replay.diff.types import Pair
from specdiff.replay.watch.watcher import diff_request
from specdiff.tracer.schema import aux_name
from specdiff.tracer.store import TraceFollower, open_trace
from specdiff.tracer.store import reader as reader_module
from specdiff.tracer.store.chunks import ArrayReader
from specdiff.tracer.store.selection import SequenceRows, select_sequences

H, PROMPT, STEPS, BATCH = 32, 6, 8, 4
CONTRACT = {"hidden_size": H, "dtype": "float32"}
TABLE = np.random.default_rng(0).standard_normal((53, H)).astype(np.float32)


def _rows(r: int, pos: np.ndarray) -> np.ndarray:
    return TABLE[(r * 7 + pos) % 53]


def write_pair(root, *, requests: int = 20, bad: int | None = None, close: bool = False):
    """(train path, serve path, writers) of ``requests`` requests decoded ``BATCH`` at a time.

    Serving: per decode step, each request of the batch re-journals its sequence and appends one
    row of ``target.aux.0``, ``target.aux.1`` and ``tokens`` (a batch's rows interleave); one
    ``draft.d2t`` row set keyed seq -1 comes first. Training (the watch's replay): per finished
    batch, each request's rows in one append per tensor. Request ``bad`` is served with
    ``target.aux.0`` off by 50 % from its third decode step on."""
    pair = TracePair(root, contract=CONTRACT, chunk_bytes=4096)
    (train, serve), (wt, ws) = pair.paths, pair.writers
    for w in (ws, wt):
        w.append("draft.d2t", np.arange(8, dtype=np.int64), seq=-1, pos=np.arange(8))
    for start in range(0, requests, BATCH):
        group = range(start, min(start + BATCH, requests))
        toks = {r: list(range(r, r + PROMPT)) for r in group}
        sid = {r: ws.add_sequence(toks[r], prompt_len=PROMPT, rid=f"r{r}") for r in group}
        for step in range(STEPS):
            for r in group:
                toks[r].append((r * 31 + len(toks[r])) % 1000)
                ws.add_sequence(toks[r], prompt_len=PROMPT, rid=f"r{r}", seq_id=sid[r])
                pos = np.array([len(toks[r]) - 2])
                x = _rows(r, pos) * (1.5 if r == bad and step >= 2 else 1.0)
                ws.append(aux_name(0), x, seq=sid[r], pos=pos)
                ws.append(aux_name(1), _rows(r + 1, pos), seq=sid[r], pos=pos)
                ws.append("tokens", np.array([toks[r][-1]], np.int64), seq=sid[r], pos=pos)
        for r in group:
            tid = wt.add_sequence(toks[r], prompt_len=PROMPT, rid=f"r{r}")
            pos = np.arange(len(toks[r]) - 1)
            wt.append(aux_name(0), _rows(r, pos), seq=tid, pos=pos)
            wt.append(aux_name(1), _rows(r + 1, pos), seq=tid, pos=pos)
            wt.append("tokens", np.array(toks[r][1:], np.int64), seq=tid, pos=pos)
        ws.flush()
        wt.flush()
    if close:
        ws.close()
        wt.close()
    return train, serve, (ws, wt)


def _whole_trace(trace, seq: int):
    """What the watch diffed before: every row, only sequence ``seq`` listed."""
    view = copy.copy(trace)
    view.sequences = [s for s in trace.sequences if int(s.id) == seq]
    return view


def _pairs(train, serve) -> list[tuple[int, int]]:
    by_rid = {s.rid: int(s.id) for s in train.sequences}
    return [(by_rid[s.rid], int(s.id)) for s in serve.sequences]


def _summary(report) -> dict:
    first = report.first
    return {"verdict": report.verdict(), "diverged": bool(report.diverged),
            "first": None if first is None else (first.name, first.kind, first.first_where),
            "causes": [e.cause for e in report.explanations],
            "acceptance": report.acceptance.map(lambda a: (a.mean_accept_length, a.samples)),
            "compared": {n: c.stats["rows"] for n, c in report.comparisons.items()}}


def test_a_selection_holds_exactly_the_requests_rows_and_the_trace_wide_ones(tmp_path):
    train, serve, writers = write_pair(tmp_path)
    followed = TraceFollower(serve)
    followed.poll()
    for trace in (followed.poll(), open_trace(serve)):  # the journal's index, then one built from keys
        assert 0 < trace._committed[aux_name(0)] < trace.rows(aux_name(0)), "rows committed and in the tail"
        for s in trace.sequences:
            sel = select_sequences(trace, [s.id])
            assert [q.id for q in sel.sequences] == [s.id]
            for name in trace.names:
                keys = trace.keys(name)
                want = np.flatnonzero((keys["seq"] == s.id) | (keys["seq"] < 0))
                assert np.array_equal(sel.base_rows[name], want), name
                got = sel.keys(name)
                assert all(np.array_equal(got[c], keys[c][want]) for c in keys)
                assert np.array_equal(sel.read_storage(name), trace.take(name, want))
    for w in writers:
        w.close()


def test_the_watch_diff_of_each_request_says_what_the_whole_trace_diff_said(tmp_path):
    train, serve, writers = write_pair(tmp_path, bad=5)
    ft, fs = TraceFollower(train), TraceFollower(serve)
    ft.poll(), fs.poll()
    t, s = ft.poll(), fs.poll()
    assert t.row_index is not None and s.row_index is not None, "followed polls carry the journal's row index"
    seen = []
    for tid, sid in _pairs(t, s):
        new = _summary(diff_request(t, s, tid, sid))
        old = _summary(diff_opened(Pair(_whole_trace(t, tid), _whole_trace(s, sid)), narrow=False))
        assert new == old, (tid, sid)
        seen.append(new["first"])
    bad = [f for f in seen if f is not None]
    assert len(bad) == 1 and bad[0][:2] == (aux_name(0), "values"), seen
    assert bad[0][2]["pos"] == PROMPT - 1 + 2, "the bad request's third decode step"
    for w in writers:
        w.close()


def test_a_request_diff_reads_only_the_key_chunks_that_hold_its_rows(tmp_path, monkeypatch):
    train, serve, writers = write_pair(tmp_path, requests=160)
    fs, ft = TraceFollower(serve), TraceFollower(train)
    fs.poll(), ft.poll()
    s, t = fs.poll(), ft.poll()
    tid, sid = _pairs(t, s)[1]  # an early request: its rows are committed, in a few of many chunks
    wanted = {name: np.flatnonzero(np.isin(s.keys(name)["seq"], [sid, -1])) for name in s.names}
    assert all(wanted[n].max() < s._committed.get(n, 0) for n in (aux_name(0), aux_name(1)))
    reads = []
    real_take, real_read = ArrayReader.take, ArrayReader.read
    monkeypatch.setattr(ArrayReader, "take", lambda self, rows: reads.append((self, np.asarray(rows)))
                        or real_take(self, rows))
    monkeypatch.setattr(ArrayReader, "read", lambda self, a, b, out=None: reads.append((self, np.arange(a, b)))
                        or real_read(self, a, b, out))
    report = diff_request(t, s, tid, sid)
    assert not report.diverged
    serve_keys = [(r, rows) for r, rows in reads if r.trace == serve and r.column != "data"]
    assert serve_keys, "the request's committed keys are read from zarr"
    for r, rows in serve_keys:
        assert set(rows.tolist()) <= set(wanted[r.tensor].tolist()), (r.tensor, r.column)
        chunks = set((rows // r.chunk_rows).tolist())
        all_chunks = -(-s._committed[r.tensor] // r.chunk_rows)
        assert chunks == set((wanted[r.tensor] // r.chunk_rows).tolist())
        assert len(chunks) < all_chunks / 2, (r.tensor, chunks, all_chunks)
    for w in writers:
        w.close()


def test_a_closed_or_per_rank_trace_is_selected_from_an_index_built_once_from_its_keys(tmp_path, monkeypatch):
    train, serve, _ = write_pair(tmp_path / "one", close=True)
    closed = TraceFollower(serve).poll()
    assert closed.closed and closed.row_index is None
    keys_read = []
    real = reader_module.Trace.keys
    monkeypatch.setattr(reader_module.Trace, "keys", lambda self, name, *a, **k: keys_read.append(name)
                        or real(self, name, *a, **k))
    for q in closed.sequences:
        select_sequences(closed, [q.id])
    assert sorted(keys_read) == sorted(closed.names), "each tensor's seq column once, not once a request"
    monkeypatch.setattr(reader_module.Trace, "keys", real)
    # a data-parallel server's rank stores: rank 1's ids shifted past rank 0's
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1):
        (tmp_path / f"r{r}").mkdir()
        _, serve_r, _ = write_pair(tmp_path / f"r{r}", requests=4 + r, close=True)
        Path(serve_r).rename(ranks / f"dp{r}")
    ranked = open_trace(str(ranks))
    assert len(ranked.sequences) == 9
    last = ranked.sequences[-1].id
    sel = select_sequences(ranked, [last])
    keys = ranked.keys("tokens")
    assert np.array_equal(sel.base_rows["tokens"], np.flatnonzero((keys["seq"] == last) | (keys["seq"] < 0)))
    assert np.array_equal(sel.keys("tokens")["seq"][sel.keys("tokens")["seq"] >= 0], np.full(STEPS, last))


def test_a_forgotten_request_is_dropped_from_the_index_and_cannot_be_selected(tmp_path):
    train, serve, writers = write_pair(tmp_path, requests=8)
    follow = TraceFollower(serve)
    trace = follow.poll()
    first = trace.sequences[0].id
    follow.forget([first])
    trace = follow.poll()
    with pytest.raises(KeyError, match="forgotten"):
        select_sequences(trace, [first])
    assert all(first not in spans for spans in trace.row_index._spans.values())
    # rows journalled for it later are not kept either; the others' still are
    ws = writers[0]
    ws.append("tokens", np.array([1], np.int64), seq=first, pos=np.array([99]))
    ws.append("tokens", np.array([2], np.int64), seq=trace.sequences[1].id, pos=np.array([99]))
    ws.flush()
    trace = follow.poll()
    assert all(first not in spans for spans in trace.row_index._spans.values())
    other = select_sequences(trace, [trace.sequences[1].id])
    assert other.keys("tokens")["pos"][-1] == 99
    for w in writers:
        w.close()


def test_row_spans_merge_and_expand_in_row_order():
    index = SequenceRows()
    index.add("t", 0, np.array([3, 3, 4, 3, -1], np.int32))
    index.add("t", 5, np.array([3, 3], np.int32))  # continues seq 3's span [3, 4)
    index.add("t", 7, np.array([4], np.int32))
    assert index.rows("t", [3], stop=100).tolist() == [0, 1, 3, 4, 5, 6]
    assert index.rows("t", [4], stop=100).tolist() == [2, 4, 7]
    assert index.rows("t", [3], stop=6).tolist() == [0, 1, 3, 4, 5]
    assert index.rows("t", [9], stop=100).tolist() == [4]
    assert index.rows("u", [3], stop=100).tolist() == []


def test_a_trace_recorded_again_at_the_same_path_does_not_inherit_what_was_forgotten(tmp_path):
    import time

    (tmp_path / "a").mkdir()
    _, serve, writers = write_pair(tmp_path / "a", requests=4)
    follow = TraceFollower(serve)
    first = follow.poll().sequences[0].id
    follow.forget([first])
    for w in writers:
        w.close()
    time.sleep(0.01)  # the journal header's creation time tells the two traces apart
    _, again, writers = write_pair(tmp_path / "a", requests=4)  # overwrite=True: the same path, its ids again
    assert again == serve
    trace = follow.poll()
    trace = follow.poll()
    assert trace.row_index is not None
    sel = select_sequences(trace, [first])
    assert len(sel.keys("tokens")["seq"]) == STEPS and sel.rows("draft.d2t") == 8
    for w in writers:
        w.close()


def test_an_alert_slice_names_rows_of_the_trace_on_disk_not_of_the_request_view(tmp_path):
    """The export's metrics.json ``cell.rows`` (tui/export.py) name rows of the traces it lists; a
    watch diff compares a Selection whose row 0 is some later row of the trace."""
    import torch

    from specdiff.tracer.store import TraceWriter, open_trace
    from specdiff.tracer.store.selection import select_sequences
    from specdiff.tui.export import _trace_row

    with TraceWriter(str(tmp_path / "t.trace"), side="serve", contract={}) as w:
        for rid in ("a", "b"):
            sid = w.add_sequence(np.arange(5), prompt_len=2, rid=rid)
            w.append("target.argmax", torch.arange(5), seq=sid, pos=np.arange(5))
    trace = open_trace(str(tmp_path / "t.trace"))
    view = select_sequences(trace, [1])
    assert [_trace_row(view, "target.argmax", i) for i in range(5)] == [5, 6, 7, 8, 9]
    assert _trace_row(trace, "target.argmax", 3) == 3  # a whole trace: its own rows
