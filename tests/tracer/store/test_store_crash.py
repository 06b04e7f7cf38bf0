"""A trace writer killed (SIGKILL) at any point of an append or a chunk commit keeps every row it
journalled; a closed trace holds each row once (zarr), not a second copy in its journal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch

from specdiff.tracer.store import TraceWriter, open_trace
from specdiff.tracer.store.journal import SPILL_DIR

# chunk_bytes=4096 and [3, 32] bf16 appends: 64-row chunks, a commit (4 chunks) every 256 rows
# (appends of 3 rows do not end on a chunk edge). "raw": float chunks stored raw, each spill file
# moved to its chunk key once full; "blosc": float chunks compressed (as int tensors are), each
# spill file kept until the commit that writes its rows through zarr.
_WRITER = """
import sys, time, numpy as np, torch, zarr
from specdiff.tracer import store
from specdiff.tracer.store import layout
from specdiff.tracer.store.journal import JournalWriter, SpillWriter

path, codec, point, at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if codec == "blosc":
    layout.data_codecs = lambda name: layout.compressors(np.dtype(np.uint16))
w = store.TraceWriter(path, side="serve", chunk_bytes=4096, overwrite=True)
sid = w.add_sequence(np.arange(50), rid="r")
commits = moved = 0
import threading
stop_main = threading.Event()

def pause():
    print("ready", sum(w._rows.values()), flush=True)  # rows journalled so far
    time.sleep(120)

real_journal, real_remove, real_move = JournalWriter.write, SpillWriter.close_and_remove, SpillWriter.finish_as_chunk
def journal(self, entry):
    global commits
    if entry["t"] == "rec" and point == "rec" and entry["row0"] == at:
        pause()  # its bytes are in a spill file, its rec is not journalled
    if entry["t"] == "commit":
        commits += 1
        if point == "commit" and commits == at:
            pause()  # zarr holds the commit's rows; no commit entry yet
    real_journal(self, entry)
def remove(self):
    if point == "remove" and commits == at:
        pause()  # the commit entry is journalled, a spill file it made redundant not yet removed
    real_remove(self)
def move(self, url):
    global moved
    real_move(self, url)
    moved += 1
    if point == "moved" and moved == at:
        pause()  # a full spill file is now a zarr chunk, past the array's shape; no commit yet
JournalWriter.write, SpillWriter.close_and_remove, SpillWriter.finish_as_chunk = journal, remove, move

real_set = zarr.storage.LocalStore.set
chunk_writes = 0
async def store_set(self, key, value):
    global chunk_writes
    await real_set(self, key, value)
    if "/c/" in key:  # a chunk written by zarr inside a commit (keys; blosc data)
        chunk_writes += 1
        if point == "zarr" and chunk_writes == at:
            # inside a commit (on zarr's thread): one of its chunks written, no commit entry ever;
            # the appending thread stops at its next append
            stop_main.set()
            time.sleep(120)
zarr.storage.LocalStore.set = store_set

for i in range(0, 900, 3):
    if stop_main.is_set():
        pause()
    rows = torch.arange(i, i + 3, dtype=torch.float32)[:, None].expand(3, 32).to(torch.bfloat16)
    w.append("draft.hidden_out", rows, seq=sid, pos=np.arange(i, i + 3), depth=np.arange(i, i + 3) % 3)
    if point == "zarr" and w._in_flight is not None:
        stop_main.wait(30)  # zarr's thread reaches the point before this thread reaches another commit
    if point == "after" and i + 3 >= at:
        pause()
pause()
"""


def _kill_writer_at(path: str, codec: str, point: str, at: int) -> int:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, path, codec, point, str(at)], stdout=subprocess.PIPE,
                            text=True)
    try:
        word, rows = proc.stdout.readline().split()
        assert word == "ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return int(rows)


# bf16 holds integers exactly up to 256; past that, rows read back as the bf16 rounding of their index.
def _expected(n: int) -> np.ndarray:
    return torch.arange(n, dtype=torch.float32).to(torch.bfloat16).float().numpy()


# The first commit comes with the append that brings 258 rows (256 = 4 chunks full); zarr writes it
# while appends go on, so past it the rows journalled when killed are "at least". Every point a
# writer can be killed at, on both write paths.
@pytest.mark.parametrize(("codec", "point", "at", "rows", "committed"), [
    ("raw", "after", 120, 120, False),   # before the first commit: chunk 0 moved in, chunk 1 in its spill file
    ("raw", "rec", 150, 150, False),     # killed between a spill write and its journal entry
    ("raw", "moved", 2, 126, False),     # chunk 1 just moved in (holding rows not journalled yet)
    ("raw", "zarr", 1, 258, False),      # inside the first commit's key writes
    ("raw", "commit", 1, 258, False),    # after zarr, before the commit entry
    ("raw", "after", 600, 600, True),    # after two commits, mid-chunk
    ("blosc", "after", 120, 120, False),
    ("blosc", "rec", 150, 150, False),
    ("blosc", "zarr", 1, 258, False),    # inside the first commit's chunk writes
    ("blosc", "commit", 1, 258, False),
    ("blosc", "remove", 1, 258, True),   # after the commit entry, before its spill files are removed
    ("blosc", "after", 600, 600, True),
], ids=lambda v: str(v))
def test_a_writer_killed_at_any_point_keeps_every_journalled_row(tmp_path, codec, point, at, rows, committed):
    path = str(tmp_path / "killed.trace")
    journalled = _kill_writer_at(path, codec, point, at)
    # killed where meant: rows journalled by then
    assert journalled == rows if point in ("after", "rec", "moved") else journalled >= rows
    rows = journalled
    trace = open_trace(path)
    assert not trace.closed
    assert trace.rows("draft.hidden_out") == rows
    assert trace.records == rows // 3
    values = trace.read("draft.hidden_out")
    assert values.shape == (rows, 32)
    assert np.array_equal(values[:, 0], _expected(rows)) and np.array_equal(values[:, 31], _expected(rows))
    keys = trace.keys("draft.hidden_out")
    assert np.array_equal(keys["pos"], np.arange(rows)) and np.array_equal(keys["depth"], np.arange(rows) % 3)
    assert (trace._committed.get("draft.hidden_out", 0) >= 256) == committed
    assert len(trace.sequences) == 1 and trace.damage == []


def test_a_closed_trace_holds_each_row_once(tmp_path):
    path = tmp_path / "once.trace"
    data = torch.randn(4000, 256).to(torch.bfloat16)  # 2 MB of rows that barely compress
    with TraceWriter(str(path), side="serve", chunk_bytes=1 << 16, overwrite=True) as w:
        for i in range(0, 4000, 40):
            w.append("draft.fc_out", data[i:i + 40], seq=0, pos=np.arange(i, i + 40))
    files = {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    assert not (path / SPILL_DIR).exists()
    assert files["journal.msgpack"] < 30_000
    assert sum(files.values()) < 1.2 * data.numel() * 2
    assert np.array_equal(open_trace(str(path)).read_torch("draft.fc_out").view(torch.int16), data.view(torch.int16))


def test_an_unclosed_trace_in_memory_url_reads_its_spilled_rows():
    url = "memory://specdiff-test/unclosed-spill.trace"
    w = TraceWriter(url, side="train", chunk_bytes=4096, overwrite=True)
    w.add_sequence(np.arange(10))
    for i in range(0, 300, 3):
        w.append("target.aux.0", torch.full((3, 16), float(i)), seq=0, pos=np.arange(i, i + 3))
    trace = open_trace(url)  # the writer is still open: 256 rows committed, 44 in the spill file
    assert not trace.closed and trace.rows("target.aux.0") == 300
    assert np.array_equal(trace.read("target.aux.0")[:, 0], np.repeat(np.arange(0, 300, 3), 3).astype(np.float32))
    w.close()
    assert open_trace(url).rows("target.aux.0") == 300


def _as_journal_before_spill_files(path) -> None:
    """Rewrite an unclosed trace's journal as specdiff wrote it before spill files: payloads inline
    in ``rec`` entries, no ``payload`` in the header, no ``spill`` in commits."""
    entries = list(msgpack.Unpacker(open(path / "journal.msgpack", "rb"), raw=False, strict_map_key=False))
    spilled = {}
    for e in entries:
        if e["t"] == "rec":
            spilled.setdefault(e["name"], []).append(e)
    out = []
    row_bytes = {name: 2 * int(np.prod(recs[0]["shape"][1:])) for name, recs in spilled.items()}
    payload = {name: (path / SPILL_DIR / f"{name}.0").read_bytes() for name in spilled}
    for e in entries:
        e = dict(e)
        e.pop("payload", None)
        e.pop("spill", None)
        if e["t"] == "rec":
            a = e["row0"] * row_bytes[e["name"]]
            e["data"] = payload[e["name"]][a:a + e["n"] * row_bytes[e["name"]]]
        out.append(e)
    packer = msgpack.Packer(use_bin_type=True)
    (path / "journal.msgpack").write_bytes(b"".join(packer.pack(e) for e in out))
    for f in (path / SPILL_DIR).iterdir():
        f.unlink()


def test_an_unclosed_trace_written_before_spill_files_still_opens(tmp_path):
    path = tmp_path / "old.trace"
    w = TraceWriter(str(path), side="serve", overwrite=True)  # big chunks: nothing committed
    for i in range(0, 30, 3):
        w.append("draft.hidden_out", torch.full((3, 32), float(i), dtype=torch.bfloat16), seq=0, pos=np.arange(i, i + 3))
    _as_journal_before_spill_files(path)
    trace = open_trace(str(path))
    assert trace.records == 10 and trace.rows("draft.hidden_out") == 30
    assert np.array_equal(trace.read("draft.hidden_out")[:, 5], np.repeat(np.arange(0, 30, 3), 3).astype(np.float32))


def test_the_shipped_example_pair_written_before_spill_files_opens_whole():
    for side in ("serve", "train"):
        trace = open_trace(os.path.join(os.path.dirname(__file__), "..", "..", "..", "traces", "examples", "seed", f"{side}.trace"))
        assert trace.closed and trace.damage == [] and trace.names
        assert all(trace.read(name).shape[0] == trace.rows(name) > 0 for name in trace.names)


def test_a_spill_file_lost_after_a_kill_is_one_clear_error(tmp_path):
    path = tmp_path / "lost.trace"
    w = TraceWriter(str(path), side="serve", overwrite=True)
    w.append("draft.hidden_out", torch.ones(3, 32, dtype=torch.bfloat16), seq=0, pos=np.arange(3))
    (path / SPILL_DIR / "draft.hidden_out.0").write_bytes(b"\0" * 100)  # cut: 3 rows need 192 bytes
    with pytest.raises(Exception) as err:
        open_trace(str(path))
    assert str(err.value) == (f"{path}: rows 0-2 of draft.hidden_out were journalled but not committed, and "
                              f"{SPILL_DIR}/draft.hidden_out.0 holds 1 of them; the store is damaged (copy it again "
                              "from where it was recorded)")


def test_an_unclosed_trace_whose_journal_is_corrupt_after_a_lost_commit_keeps_what_zarr_holds(tmp_path):
    path = tmp_path / "corrupt.trace"
    w = TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True)
    w.add_sequence(np.arange(10))
    for i in range(0, 600, 3):  # commits at 258 and 513 rows
        w.append("draft.hidden_out", torch.full((3, 32), float(i % 256), dtype=torch.bfloat16), seq=0,
                 pos=np.arange(i, i + 3))
        w.flush()  # each commit entry right after the record that made it
    raw = (path / "journal.msgpack").read_bytes()
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    ends, second_commit = [], None
    for e in unpacker:
        ends.append(unpacker.tell())
        if e["t"] == "commit" and e["rows"] > 300:
            second_commit = len(ends) - 1
    # Corrupt the second commit entry: the journal now ends at the first commit (256 rows); zarr
    # holds the 512 rows of both commits, and the journalled row 512 is in the spill file of its
    # chunk (8), found by its chunk, not by the lost entry. Later records are lost, as the damage says.
    at = ends[second_commit - 1]
    (path / "journal.msgpack").write_bytes(raw[:at] + b"\xc1" + raw[at + 1:])
    trace = open_trace(str(path))
    rows = trace.rows("draft.hidden_out")
    assert rows == 513 and not trace.closed
    assert [d.key for d in trace.damage] == ["journal.msgpack"] and "not yet in zarr are lost" in trace.damage[0].message()
    assert np.array_equal(trace.read("draft.hidden_out")[:, 0], np.repeat(np.arange(0, 513, 3) % 256, 3)[:513].astype(np.float32))


def _as_journal_with_one_spill_file_per_commit(path) -> None:
    """Rewrite an unclosed trace as specdiff wrote it before per-chunk spill files (header
    ``payload: "spill"``): commit k names spill generation k, which holds every row after it."""
    trace = open_trace(str(path))
    tails = {name: trace.read_storage(name, trace._committed.get(name, 0)) for name in trace.names}
    entries = list(msgpack.Unpacker(open(path / "journal.msgpack", "rb"), raw=False, strict_map_key=False))
    commits: dict[str, int] = {}
    for e in entries:
        if e["t"] == "header":
            e["payload"] = "spill"
        elif e["t"] == "commit":
            commits[e["name"]] = e["spill"] = commits.get(e["name"], 0) + 1
        elif e["t"] == "rec":
            e.pop("chunk_rows")
    (path / "journal.msgpack").write_bytes(b"".join(msgpack.packb(e, use_bin_type=True) for e in entries))
    for f in (path / SPILL_DIR).iterdir():
        f.unlink()
    for name, rows in tails.items():
        (path / SPILL_DIR / f"{name}.{commits.get(name, 0)}").write_bytes(rows.tobytes())


def test_an_unclosed_trace_with_one_spill_file_per_commit_still_opens(tmp_path):
    path = tmp_path / "commit-spill.trace"
    w = TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True)
    for i in range(0, 600, 3):  # commits at 258 and 513 rows; 88 rows after the second
        w.append("draft.hidden_out", torch.full((3, 32), float(i % 256), dtype=torch.bfloat16), seq=0,
                 pos=np.arange(i, i + 3))
    w.flush()
    _as_journal_with_one_spill_file_per_commit(path)
    assert sorted(f.name for f in (path / SPILL_DIR).iterdir()) == ["draft.hidden_out.2"]
    trace = open_trace(str(path))
    assert trace.rows("draft.hidden_out") == 600 and trace.damage == []
    assert np.array_equal(trace.read("draft.hidden_out")[:, 0], np.repeat(np.arange(0, 600, 3) % 256, 3).astype(np.float32))


def test_a_commit_zarr_cannot_write_stops_the_writer_and_keeps_every_journalled_row(tmp_path, monkeypatch):
    from specdiff.tracer.errors import TraceError
    from specdiff.tracer.store import writer as writer_module

    real, calls = writer_module.grow_and_write, []

    async def full_disk(arrays, *, rows, writes):
        calls.append(rows)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        await real(arrays, rows=rows, writes=writes)

    monkeypatch.setattr(writer_module, "grow_and_write", full_disk)
    path = tmp_path / "full.trace"
    w = TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True)
    journalled = 0
    with pytest.raises(TraceError) as err:
        for i in range(0, 900, 3):
            w.append("draft.hidden_out", torch.full((3, 32), float(i % 256), dtype=torch.bfloat16), seq=0,
                     pos=np.arange(i, i + 3))
            journalled = i + 3
        w.close()
    assert "writing rows of draft.hidden_out to zarr failed (OSError: [Errno 28] No space left on device)" in str(err.value)
    assert calls == [256, 512]
    for again in (lambda: w.append("draft.hidden_out", torch.ones(3, 32), seq=0, pos=np.arange(3)), w.close):
        with pytest.raises(TraceError):  # nothing more is journalled as durable
            again()
    trace = open_trace(str(path))
    # the error surfaces at the next append's start (its rows not journalled) or at the end of the
    # append whose commit waited on it (its rows journalled first, durable): either way every
    # journalled row reads back
    rows = trace.rows("draft.hidden_out")
    assert not trace.closed and rows in (journalled, journalled + 3) and trace._committed["draft.hidden_out"] == 256
    assert np.array_equal(trace.read("draft.hidden_out")[:, 0],
                          np.repeat(np.arange(0, rows, 3) % 256, 3).astype(np.float32))


def test_an_unclosed_trace_whose_journal_keeps_payloads_in_an_unknown_way_is_one_clear_error(tmp_path):
    path = tmp_path / "future.trace"
    w = TraceWriter(str(path), side="serve", overwrite=True)
    w.append("draft.hidden_out", torch.ones(3, 32, dtype=torch.bfloat16), seq=0, pos=np.arange(3))
    entries = list(msgpack.Unpacker(open(path / "journal.msgpack", "rb"), raw=False, strict_map_key=False))
    entries[0]["payload"] = "per-row-files"
    (path / "journal.msgpack").write_bytes(b"".join(msgpack.packb(e, use_bin_type=True) for e in entries))
    with pytest.raises(Exception) as err:
        open_trace(str(path))
    assert str(err.value) == (f"{path}: its journal keeps record payloads as 'per-row-files', which this specdiff "
                              "does not know (a newer version wrote it); upgrade specdiff to read this unclosed trace")


def test_a_spill_file_a_live_writer_commits_and_removes_while_the_trace_opens_is_read_from_zarr(tmp_path, monkeypatch):
    # blosc rows: a commit deletes their spill files once journalled; a reader that read the journal
    # just before sees a file vanish, reads the grown journal again and finds the rows in zarr
    from specdiff.tracer.store import layout
    from specdiff.tracer.store import reader as reader_module
    from specdiff.tracer.store.journal import read_journal

    monkeypatch.setattr(layout, "data_codecs", lambda name: layout.compressors(np.dtype(np.uint16)))
    path = tmp_path / "live.trace"
    w = TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True)
    append = lambda i: w.append("draft.hidden_out", torch.full((3, 32), float(i % 256), dtype=torch.bfloat16),  # noqa: E731
                                seq=0, pos=np.arange(i, i + 3))
    for i in range(0, 255, 3):
        append(i)
    stale = read_journal(str(path / "journal.msgpack"))  # 255 rows, none committed
    for i in range(255, 300, 3):
        append(i)
    w.flush()  # the commit of 256 rows is journalled and spill files 0-3 are gone
    assert not (path / SPILL_DIR / "draft.hidden_out.0").exists()
    reads = []

    def read_once_stale(url):
        reads.append(url)
        return stale if len(reads) == 1 else read_journal(url)

    monkeypatch.setattr(reader_module, "read_journal", read_once_stale)
    trace = open_trace(str(path))
    assert len(reads) == 2 and trace.rows("draft.hidden_out") == 300 and trace._committed["draft.hidden_out"] == 256
    assert np.array_equal(trace.read("draft.hidden_out")[:, 0], np.repeat(np.arange(0, 300, 3) % 256, 3).astype(np.float32))
    w.close()


@pytest.mark.parametrize("harm", ["flipped", "deleted"])
def test_a_damaged_moved_chunk_no_commit_covers_is_one_error_naming_it(tmp_path, harm):
    path = tmp_path / "moved.trace"
    w = TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True)
    for i in range(0, 150, 3):  # chunks 0 and 1 moved in, no commit yet
        w.append("draft.hidden_out", torch.full((3, 32), float(i), dtype=torch.bfloat16), seq=0, pos=np.arange(i, i + 3))
    chunk = path / "tensors" / "draft.hidden_out" / "data" / "c" / "1" / "0"
    if harm == "flipped":
        raw = bytearray(chunk.read_bytes())
        raw[10] ^= 1
        chunk.write_bytes(bytes(raw))
    else:
        chunk.unlink()
    with pytest.raises(Exception) as err:
        open_trace(str(path))
    what = "fails its crc32c checksum" if harm == "flipped" else "so is its moved chunk tensors/draft.hidden_out/data/c/1/0"
    assert str(err.value) == (
        f"{path}: rows 64-127 of draft.hidden_out were journalled but not committed, and "
        f"{SPILL_DIR}/draft.hidden_out.1 is missing and "
        + ("its moved chunk tensors/draft.hidden_out/data/c/1/0 " if harm == "flipped" else "") + what
        + "; the store is damaged (copy it again from where it was recorded)")


def test_rows_read_from_an_unclosed_trace_are_the_callers_to_change(tmp_path):
    path = tmp_path / "open.trace"
    w = TraceWriter(str(path), side="serve", chunk_bytes=4096, overwrite=True)
    w.append("draft.hidden_out", torch.ones(10, 32, dtype=torch.bfloat16), seq=0, pos=np.arange(10))
    trace = open_trace(str(path))  # every row in the uncommitted tail
    rows = trace.read_storage("draft.hidden_out", 0, 5)
    rows[0, 0] = 42
    assert trace.read_storage("draft.hidden_out", 0, 5)[0, 0] != 42
    trace.keys("draft.hidden_out")["pos"][0] = 99
    assert trace.keys("draft.hidden_out")["pos"][0] == 0


def test_a_chunks_journal_record_without_its_chunk_rows_is_one_clear_error(tmp_path):
    path = tmp_path / "no-chunk-rows.trace"
    w = TraceWriter(str(path), side="serve", overwrite=True)
    w.append("draft.hidden_out", torch.ones(3, 32, dtype=torch.bfloat16), seq=0, pos=np.arange(3))
    entries = list(msgpack.Unpacker(open(path / "journal.msgpack", "rb"), raw=False, strict_map_key=False))
    for e in entries:
        e.pop("chunk_rows", None)
    (path / "journal.msgpack").write_bytes(b"".join(msgpack.packb(e, use_bin_type=True) for e in entries))
    with pytest.raises(Exception) as err:
        open_trace(str(path))
    assert str(err.value) == (f"{path}: rows of draft.hidden_out from 0 on are neither committed nor in the journal; "
                              "the store is damaged (copy it again)")
