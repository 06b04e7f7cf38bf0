"""The store's write path (at disk speed): float chunks stored raw + crc32c,
each a full spill file moved to its zarr key (tracer/store/journal.py), read back by zarr's own codecs;
appends of any size; traces with blosc-compressed float chunks still read."""

from __future__ import annotations

import json

import google_crc32c
import numpy as np
import pytest
import torch
import zarr

from specdiff.tracer.store import TraceWriter, open_trace
from specdiff.tracer.store import layout as store_layout
from specdiff.tracer.store.arrays import STORAGE_DTYPES

ROW = 48  # draft.fc_out [row, draft_hidden]
CHUNK_ROWS = 16


def _batches(dtype, sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, ROW, generator=gen).to(dtype) * 3 for n in sizes]


def _write(url, batches, **kw):
    with TraceWriter(url, side="serve", chunk_bytes=ROW * batches[0].element_size() * CHUNK_ROWS,
                     overwrite=True, **kw) as w:
        row = 0
        for i, b in enumerate(batches):
            w.append("draft.fc_out", b, seq=i, pos=np.arange(row, row + len(b)))
            row += len(b)


# Batch sizes that split chunks every way: smaller than a chunk, across chunk edges, several chunks in
# one append (more than a commit's worth), and a last chunk left partial at close.
SIZES = [5, 11, 16, 1, 40, 3, 150, 7, 2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rows_appended_in_any_batch_sizes_read_back_bit_for_bit_through_zarr(tmp_path, dtype):
    batches = _batches(dtype, SIZES)
    _write(str(tmp_path / "t"), batches)
    want = torch.cat(batches)
    trace = open_trace(str(tmp_path / "t"))
    assert trace.damage == []
    got = trace.read_torch("draft.fc_out")
    assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert trace.keys("draft.fc_out")["pos"].tolist() == list(range(len(want)))
    assert trace.keys("draft.fc_out")["seq"].tolist() == [i for i, n in enumerate(SIZES) for _ in range(n)]
    # zarr alone (no specdiff code) decodes the chunks specdiff encoded, checking each crc32c
    # (bf16 as zarr's ``bfloat16`` data type: ml_dtypes' numpy bfloat16, tracer/store/arrays.py)
    arr = zarr.open_array(str(tmp_path / "t" / "tensors" / "draft.fc_out" / "data"), mode="r")
    name = "bfloat16" if dtype == torch.bfloat16 else str(dtype)[6:]
    assert arr.dtype.name == name
    assert np.array_equal(arr[:].view(STORAGE_DTYPES[name]),
                          want.view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy().view(STORAGE_DTYPES[name]))


def test_a_float_chunk_file_is_its_rows_raw_then_their_crc32c(tmp_path):
    batches = _batches(torch.bfloat16, [40])
    _write(str(tmp_path / "t"), batches)
    data = tmp_path / "t" / "tensors" / "draft.fc_out" / "data"
    meta = json.loads((data / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "crc32c"]
    raw = (data / "c" / "1" / "0").read_bytes()
    rows = batches[0][CHUNK_ROWS:2 * CHUNK_ROWS].contiguous().view(torch.int16).numpy().tobytes()
    assert raw == rows + google_crc32c.value(rows).to_bytes(4, "little")
    # the key columns still compress (blosc), as do int tensors
    keys = json.loads((tmp_path / "t" / "tensors" / "draft.fc_out" / "pos" / "zarr.json").read_text())
    assert [c["name"] for c in keys["codecs"]] == ["bytes", "blosc", "crc32c"]


def test_a_flipped_byte_in_a_raw_chunk_fails_its_checksum_and_costs_only_its_rows(tmp_path):
    _write(str(tmp_path / "t"), _batches(torch.bfloat16, [40]))
    f = tmp_path / "t" / "tensors" / "draft.fc_out" / "data" / "c" / "1" / "0"
    raw = bytearray(f.read_bytes())
    raw[7] ^= 0x10
    f.write_bytes(bytes(raw))
    trace = open_trace(str(tmp_path / "t"))
    trace.read("draft.fc_out")
    assert trace.unreadable("draft.fc_out", np.arange(40)).nonzero()[0].tolist() == list(range(16, 32))
    assert "fails its crc32c checksum" in trace.damage[0].message()


def test_a_trace_with_blosc_compressed_float_chunks_still_reads(tmp_path, monkeypatch):
    # how float data was stored before the disk-speed write path: blosc bitshuffle-lz4 + crc32c, like every array
    monkeypatch.setattr(store_layout, "data_codecs", lambda name: store_layout.compressors(STORAGE_DTYPES[name]))
    batches = _batches(torch.bfloat16, SIZES)
    _write(str(tmp_path / "t"), batches)
    monkeypatch.undo()
    meta = json.loads((tmp_path / "t" / "tensors" / "draft.fc_out" / "data" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "blosc", "crc32c"]
    trace = open_trace(str(tmp_path / "t"))
    assert torch.equal(trace.read_torch("draft.fc_out").view(torch.int16), torch.cat(batches).view(torch.int16))
    assert trace.verify() == []


def test_memory_url_trace_gets_the_same_chunk_bytes_as_a_local_one(tmp_path):
    batches = _batches(torch.bfloat16, SIZES)
    _write(str(tmp_path / "t"), batches)
    _write("memory://write-path/t", batches)
    import fsspec

    fs = fsspec.filesystem("memory")
    for i in range(len(torch.cat(batches)) // CHUNK_ROWS + 1):
        key = f"tensors/draft.fc_out/data/c/{i}/0"
        assert fs.cat(f"/write-path/t/{key}") == (tmp_path / "t" / key).read_bytes()
    assert torch.equal(open_trace("memory://write-path/t").read_torch("draft.fc_out").view(torch.int16),
                       torch.cat(batches).view(torch.int16))


def test_commits_never_read_back_a_key_chunk_to_rewrite_it(tmp_path, monkeypatch):
    # appends of 5 rows never end on a chunk edge; a commit still fills whole key chunks, so the key
    # columns are written without reading, decoding and re-encoding a part-filled chunk
    reads = []
    real_get = zarr.storage.LocalStore.get

    async def get(self, key, *args, **kw):
        got = await real_get(self, key, *args, **kw)
        if got is not None and "/c/" in key:
            reads.append(key)
        return got

    monkeypatch.setattr(zarr.storage.LocalStore, "get", get)
    batches = _batches(torch.bfloat16, [5] * 60)
    _write(str(tmp_path / "t"), batches)
    monkeypatch.undo()
    assert reads == []
    trace = open_trace(str(tmp_path / "t"))
    assert trace.keys("draft.fc_out")["pos"].tolist() == list(range(300))
    assert torch.equal(trace.read_torch("draft.fc_out").view(torch.int16), torch.cat(batches).view(torch.int16))


def test_a_float_trace_is_written_once_its_full_spill_files_become_its_chunks(tmp_path, monkeypatch):
    # the rows' bytes go to a spill file once; a full chunk's file is moved to its zarr key
    # (crc appended) instead of being written again, so zarr writes data only for the partial last chunk
    from specdiff.tracer.store.journal import SpillWriter

    spilled, zarr_data = [], []
    real_write, real_set = SpillWriter.write, zarr.storage.LocalStore.set

    def write(self, data):
        spilled.append(memoryview(data).nbytes)
        real_write(self, data)

    async def store_set(self, key, value):
        if "/data/c/" in key:
            zarr_data.append(key)
        await real_set(self, key, value)

    monkeypatch.setattr(SpillWriter, "write", write)
    monkeypatch.setattr(zarr.storage.LocalStore, "set", store_set)
    batches = _batches(torch.bfloat16, SIZES)
    path = tmp_path / "t"
    _write(str(path), batches)
    rows = sum(SIZES)
    assert sum(spilled) == rows * ROW * 2
    assert zarr_data == [f"tensors/draft.fc_out/data/c/{rows // CHUNK_ROWS}/0"]  # the partial last chunk
    assert torch.equal(open_trace(str(path)).read_torch("draft.fc_out").view(torch.int16), torch.cat(batches).view(torch.int16))
    assert not (path / "journal.spill").exists()


def test_a_full_chunk_is_in_place_before_its_commit_and_flush_journals_the_commit(tmp_path):
    path = tmp_path / "t"
    w = TraceWriter(str(path), side="serve", chunk_bytes=ROW * 2 * CHUNK_ROWS, overwrite=True)
    batches = _batches(torch.bfloat16, [20])
    w.append("draft.fc_out", batches[0], seq=0, pos=np.arange(20))
    # chunk 0 full: moved to its key with its crc32c, though no commit covers it yet
    raw = (path / "tensors" / "draft.fc_out" / "data" / "c" / "0" / "0").read_bytes()
    rows = batches[0][:CHUNK_ROWS].contiguous().view(torch.int16).numpy().tobytes()
    assert raw == rows + google_crc32c.value(rows).to_bytes(4, "little")
    assert sorted(p.name for p in (path / "journal.spill").iterdir()) == ["draft.fc_out.1"]
    trace = open_trace(str(path))  # rows 0-15 read from the moved chunk, 16-19 from spill file 1
    assert trace._committed.get("draft.fc_out", 0) == 0
    assert torch.equal(trace.read_torch("draft.fc_out").view(torch.int16), batches[0].view(torch.int16))
    more = _batches(torch.bfloat16, [50], seed=1)[0]
    w.append("draft.fc_out", more, seq=1, pos=np.arange(20, 70))  # 4 chunks full: a commit
    w.flush()
    trace = open_trace(str(path))
    assert trace._committed["draft.fc_out"] == 4 * CHUNK_ROWS and trace.rows("draft.fc_out") == 70
    assert torch.equal(trace.read_torch("draft.fc_out").view(torch.int16), torch.cat([batches[0], more]).view(torch.int16))
    w.close()


def test_raw_chunks_read_from_their_files_match_zarr_for_any_row_range(tmp_path):
    # tracer/store/chunks.py reads whole raw chunks from their files (crc checked) and partial ones via zarr
    batches = _batches(torch.bfloat16, SIZES)
    _write(str(tmp_path / "t"), batches)
    trace = open_trace(str(tmp_path / "t"))
    arr = zarr.open_array(str(tmp_path / "t" / "tensors" / "draft.fc_out" / "data"), mode="r")
    n = arr.shape[0]
    reader = trace._readers["draft.fc_out"]["data"]
    assert reader.direct  # the path under test
    for a, b in [(0, n), (0, CHUNK_ROWS), (5, 37), (CHUNK_ROWS, 3 * CHUNK_ROWS), (17, 18), (n - 3, n), (3, 12)]:
        buf = np.empty((b - a, ROW), np.uint16)
        want = arr[a:b].view(np.uint16)  # zarr's bfloat16 values as the uint16 bits specdiff holds
        assert np.array_equal(trace.read_storage("draft.fc_out", a, b), want)
        assert trace.read_storage("draft.fc_out", a, b, out=buf) is buf and np.array_equal(buf, want)
    assert trace.damage == []
