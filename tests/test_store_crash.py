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

from specdiff.tracer.journal import SPILL_DIR
from specdiff.tracer.store import TraceWriter, open_trace

# chunk_bytes=4096 and [3, 32] bf16 appends: 64-row chunks, a commit (4 chunks) every 256 rows
# that leaves 2 rows in the next spill file (appends of 3 rows do not end on a chunk edge).
_WRITER = """
import sys, time, numpy as np, torch, zarr
from specdiff.tracer import store
from specdiff.tracer.journal import JournalWriter, SpillWriter

path, point, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
w = store.TraceWriter(path, side="serve", chunk_bytes=4096, overwrite=True)
sid = w.add_sequence(np.arange(50), rid="r")
commits = 0

def pause():
    print("ready", sum(w._rows.values()), flush=True)  # rows journalled so far
    time.sleep(120)

real_journal, real_remove = JournalWriter.write, SpillWriter.close_and_remove
def journal(self, entry):
    global commits
    if entry["t"] == "rec" and point == "rec" and entry["row0"] == at:
        pause()  # its bytes are in the spill file, its rec is not journalled
    if entry["t"] == "commit":
        commits += 1
        if point == "commit" and commits == at:
            pause()  # zarr holds the chunks and the next spill file the rest; no commit entry yet
    real_journal(self, entry)
def remove(self):
    if point == "remove" and commits == at:
        pause()  # the commit entry is journalled, the old spill file not yet removed
    real_remove(self)
JournalWriter.write, SpillWriter.close_and_remove = journal, remove

real_set = zarr.storage.LocalStore.set
data_writes = 0
async def store_set(self, key, value):
    global data_writes
    await real_set(self, key, value)
    if "/data/c/" in key:  # a chunk file of the data array (whoever encoded it: zarr or store/commit.py)
        data_writes += 1
        if point == "zarr" and data_writes == at:
            pause()  # inside a commit: one of its data chunks written to zarr, no commit entry yet
zarr.storage.LocalStore.set = store_set

for i in range(0, 900, 3):
    rows = torch.arange(i, i + 3, dtype=torch.float32)[:, None].expand(3, 32).to(torch.bfloat16)
    w.append("draft.hidden_out", rows, seq=sid, pos=np.arange(i, i + 3), depth=np.arange(i, i + 3) % 3)
    if point == "after" and i + 3 >= at:
        pause()
pause()
"""


def _kill_writer_at(path: str, point: str, at: int) -> int:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, path, point, str(at)], stdout=subprocess.PIPE, text=True)
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


# The first commit comes with the append that brings 258 rows (256 = 4 chunks pending).
@pytest.mark.parametrize(("point", "at", "rows", "committed"), [
    ("after", 120, 120, False),  # before the first chunk commit: every row only in spill file 0
    ("rec", 150, 150, False),    # killed between a spill write and its journal entry
    ("zarr", 1, 258, False),     # killed inside the first commit's zarr writes
    ("commit", 1, 258, False),   # after zarr and the next spill file, before the commit entry
    ("remove", 1, 258, True),    # after the commit entry, before the old spill file is removed
    ("after", 600, 600, True),   # after two commits, mid-chunk
], ids=["before-first-commit", "between-spill-and-rec", "inside-zarr-writes", "before-commit-entry",
        "after-commit-entry", "after-two-commits"])
def test_a_writer_killed_before_or_after_a_chunk_commit_keeps_every_journalled_row(tmp_path, point, at, rows,
                                                                                   committed):
    path = str(tmp_path / "killed.trace")
    assert _kill_writer_at(path, point, at) == rows  # killed where meant: rows journalled by then
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
        trace = open_trace(os.path.join(os.path.dirname(__file__), "..", "traces", "examples", "seed", f"{side}.trace"))
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
    raw = (path / "journal.msgpack").read_bytes()
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    ends, second_commit = [], None
    for e in unpacker:
        ends.append(unpacker.tell())
        if e["t"] == "commit" and e["rows"] > 300:
            second_commit = len(ends) - 1
    # Corrupt the second commit entry: the journal now ends at spill generation 1 (from row 256),
    # which the second commit removed; zarr holds the 512 rows of both commits, and the journalled
    # row 512 (in generation 2, which no readable entry names) is lost, as the damage line says.
    at = ends[second_commit - 1]
    (path / "journal.msgpack").write_bytes(raw[:at] + b"\xc1" + raw[at + 1:])
    trace = open_trace(str(path))
    rows = trace.rows("draft.hidden_out")
    assert rows == 512 and not trace.closed
    assert [d.key for d in trace.damage] == ["journal.msgpack"] and "not yet in zarr are lost" in trace.damage[0].message()
    assert np.array_equal(trace.read("draft.hidden_out")[:, 0], np.repeat(np.arange(0, 512, 3) % 256, 3)[:512].astype(np.float32))
