"""``TraceFollower`` (tracer/store/reader.py): a trace a live writer appends to, polled as
``open_trace`` would open it, decoding only the journal bytes new since the last poll.

Real stores written by ``TraceWriter`` with small chunks (64-row chunks, a commit every 4), so a
poll meets uncommitted spill files, moved float chunks, blosc int chunks and commits."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch

from specdiff.tracer.store import TraceFollower, TraceWriter, open_trace
from specdiff.tracer.store import reader as reader_module
from specdiff.tracer.store.journal import JOURNAL_NAME


def _same(a, b) -> None:
    """Two opened traces hold the same facts, sequences, keys and rows."""
    assert (a.side, a.closed, a.records, a.cut_tail_bytes) == (b.side, b.closed, b.records, b.cut_tail_bytes)
    assert a.contract == b.contract
    assert [(s.id, s.tokens.tolist(), s.prompt_len, s.rid) for s in a.sequences] == \
        [(s.id, s.tokens.tolist(), s.prompt_len, s.rid) for s in b.sequences]
    assert a.names == b.names
    for name in a.names:
        assert a.rows(name) == b.rows(name)
        ka, kb = a.keys(name), b.keys(name)
        assert all(np.array_equal(ka[c], kb[c]) for c in ka)
        assert np.array_equal(a.read_storage(name, 0, a.rows(name)), b.read_storage(name, 0, b.rows(name)))


def _writer(path):
    return TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True, contract={"engine": "sglang"})


def _append(w, i: int) -> None:
    """Rows i..i+2 of one float tensor (raw chunks, moved in when full) and one int tensor (blosc)."""
    pos = np.arange(i, i + 3)
    w.append("draft.hidden_out", torch.full((3, 32), float(i % 256), dtype=torch.bfloat16), seq=0, pos=pos)
    w.append("draft.logits_topk.ids", torch.full((3, 8), i, dtype=torch.int32), seq=0, pos=pos)


def test_each_poll_holds_what_a_full_open_holds_and_decodes_only_new_bytes(tmp_path, monkeypatch):
    path = tmp_path / "live.trace"
    w = _writer(path)
    reads = []
    real = reader_module.read_journal
    monkeypatch.setattr(reader_module, "read_journal", lambda url: reads.append(url) or real(url))
    follow = TraceFollower(str(path))
    tokens = [1, 2, 3]
    w.add_sequence(tokens, prompt_len=3, rid="r0")
    for i in range(0, 600, 3):
        _append(w, i)
        if i % 60 == 0:  # the recorders journal a request's sequence again each time it grows
            tokens.append(i)
            w.add_sequence(tokens, prompt_len=3, rid="r0", seq_id=0)
            w.set_contract(sampled_requests={"r0": f"step {i}"})
        if i % 111 == 0:
            w.flush()  # let a commit land between polls too
            polled = follow.poll()
            n_reads = len(reads)
            _same(polled, open_trace(str(path)))
            reads[n_reads:] = []  # the full open above is the test's, not the follower's
    assert follow.full_opens == 1 and len(reads) == 1  # the first poll opened it; every later one followed
    assert polled.rows("draft.hidden_out") > 256 and polled._committed["draft.hidden_out"] >= 256
    w.close()
    closed = follow.poll()  # the closing writer compacted its journal into a new file: opened in full
    assert closed.closed and follow.full_opens == 2
    _same(closed, open_trace(str(path)))


def _followed(path) -> tuple[TraceWriter, TraceFollower]:
    """A live trace of one request ``a`` (3 rows), its writer left open, followed and polled once."""
    w = _writer(path)
    w.add_sequence([5, 6], rid="a")
    _append(w, 0)
    w.flush()
    follow = TraceFollower(str(path))
    assert len(follow.poll().sequences) == 1
    return w, follow


def test_an_entry_cut_between_two_polls_is_read_once_its_bytes_arrive(tmp_path):
    path = tmp_path / "cut.trace"
    _w, follow = _followed(path)
    entry = msgpack.packb({"t": "seq", "id": 1, "tokens": np.arange(4, dtype=np.int32).tobytes(),
                           "prompt_len": 2, "rid": "b"}, use_bin_type=True)
    with open(path / JOURNAL_NAME, "ab") as fh:  # a writer caught mid-write: half an entry
        fh.write(entry[:7])
    half = follow.poll()
    assert len(half.sequences) == 1 and half.cut_tail_bytes == 7
    _same(half, open_trace(str(path)))
    with open(path / JOURNAL_NAME, "ab") as fh:
        fh.write(entry[7:])
    whole = follow.poll()
    assert [s.rid for s in whole.sequences] == ["a", "b"] and whole.cut_tail_bytes == 0
    assert follow.full_opens == 1


def test_a_journal_damaged_while_followed_is_opened_in_full_and_the_damage_named(tmp_path):
    path = tmp_path / "damaged.trace"
    _w, follow = _followed(path)
    with open(path / JOURNAL_NAME, "ab") as fh:
        fh.write(msgpack.packb([1, 2, 3]))  # decodes, but is not a specdiff record
    damaged = follow.poll()
    assert follow.full_opens == 2
    full = open_trace(str(path))
    assert [(d.key, d.problem) for d in damaged.damage] == [(d.key, d.problem) for d in full.damage]
    assert damaged.damage[0].key == JOURNAL_NAME and "not a specdiff record" in damaged.damage[0].problem


@pytest.mark.parametrize("new_seqs", [1, 40], ids=["shorter", "longer"])
def test_a_trace_recorded_again_at_the_same_path_is_opened_in_full(tmp_path, new_seqs):
    # (review) deleted and recorded again at the same path, the journal can come back with the same
    # inode; the follower read on from its old offset and kept returning the old trace. Rewritten in
    # place here, so the inode is the same for certain.
    import shutil
    import time

    old, new = tmp_path / "serve.trace", tmp_path / "again.trace"
    w = _writer(old)
    for i in range(20):
        w.add_sequence([i, i + 1], rid=f"old{i}")
    w.flush()
    follow = TraceFollower(str(old))
    assert len(follow.poll().sequences) == 20
    inode = (old / JOURNAL_NAME).stat().st_ino  # the server was killed: nothing compacted its journal
    time.sleep(0.01)  # the header's creation time tells the two journals apart
    w2 = _writer(new)
    for i in range(new_seqs):
        w2.add_sequence([i, i + 2], rid=f"new{i}")
    w2.flush()
    for entry in old.iterdir():
        if entry.name != JOURNAL_NAME:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    shutil.copytree(new, old, dirs_exist_ok=True, ignore=shutil.ignore_patterns(JOURNAL_NAME))
    with open(old / JOURNAL_NAME, "r+b") as fh:
        fh.truncate(0)
        fh.write((new / JOURNAL_NAME).read_bytes())
    assert (old / JOURNAL_NAME).stat().st_ino == inode
    again = follow.poll()
    assert [s.rid for s in again.sequences] == [f"new{i}" for i in range(new_seqs)]
    assert follow.full_opens == 2
    w2.close()


def test_a_trace_closed_while_it_is_first_opened_gets_no_row_index_from_its_compacted_journal(tmp_path, monkeypatch):
    """open_trace saw the trace unclosed, then the writer closed it (compact_journal drops the rec
    entries' row keys) before the follower read the journal: an index fed from that journal would
    hold no rows, and a selection of any request would read 0 rows (a false divergence). The
    follower attaches none; the selection builds its index from the trace's keys."""
    from specdiff.tracer.store.selection import select_sequences

    w = _writer(tmp_path / "t.trace")
    sid = w.add_sequence(np.arange(40), prompt_len=3, rid="r0")
    for i in range(0, 30, 3):
        _append(w, i)
    w.flush()
    unclosed = open_trace(str(tmp_path / "t.trace"))
    assert not unclosed.closed
    w.close()
    monkeypatch.setattr(reader_module, "open_trace", lambda path: unclosed)
    trace = TraceFollower(str(tmp_path / "t.trace")).poll()
    assert trace.row_index is None
    view = select_sequences(trace, [sid])
    assert view.rows("draft.hidden_out") == 30
    assert view.keys("draft.hidden_out")["pos"].tolist() == list(range(30))
