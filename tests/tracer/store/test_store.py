"""The zarr trace store: round trips, crash safety, clear errors on bad stores, xarray access."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from specdiff.tracer.errors import TraceError
from specdiff.tracer.schema import SPECS, aux_name
from specdiff.tracer.store import TraceWriter, open_trace

H, HD, K, VD, TOPK, N = 64, 48, 3, 96, 2, 4
SEQ_LENS = [17, 5, 30]  # ragged
DEPTHS = 3

FEATURE = {"hidden": H, "aux_hidden": K * H, "draft_hidden": HD, "attn_in": 2 * HD, "draft_vocab": VD,
           "topk": TOPK, "logits_topk": 8, "draft_tokens": N, "accept_slots": 4}


def _tensor_names():
    names = [n for n in SPECS if "{" not in n]
    return names + [aux_name(j) for j in range(K)]


def _make_rows(name, n, dtype, gen):
    spec = SPECS.get(name) or SPECS["target.aux.{j}"]
    shape = (n, *(FEATURE[d] for d in spec.dims))
    if spec.kind == "float":
        return torch.randn(shape, generator=gen).to(dtype) * 3
    if spec.kind == "int":
        return torch.randint(-1, 4096, shape, generator=gen)
    return torch.rand(shape, generator=gen) > 0.5


def _write_everything(path, dtype, chunk_bytes=2048):
    gen = torch.Generator().manual_seed(0)
    expected = {}
    with TraceWriter(path, side="serve", contract={"num_layers": 8, "dtype": str(dtype)},
                     chunk_bytes=chunk_bytes, overwrite=True) as w:
        for s, length in enumerate(SEQ_LENS):
            sid = w.add_sequence(np.arange(length) + s, prompt_len=length // 2, rid=f"req-{s}")
            for name in _tensor_names():
                spec = SPECS.get(name) or SPECS["target.aux.{j}"]
                for depth in range(DEPTHS if spec.by_depth else 1):
                    rows = _make_rows(name, length, dtype, gen)
                    pos = np.arange(length)
                    w.append(name, rows, seq=sid, pos=pos, depth=depth, iter=s)
                    expected.setdefault(name, []).append((rows, sid, pos, depth))
    return expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_canonical_tensor_round_trips_bit_for_bit(tmp_path, dtype):
    expected = _write_everything(str(tmp_path / "t"), dtype)
    trace = open_trace(str(tmp_path / "t"))
    assert trace.closed and trace.side == "serve"
    assert [len(s.tokens) for s in trace.sequences] == SEQ_LENS
    assert [s.rid for s in trace.sequences] == ["req-0", "req-1", "req-2"]
    assert set(trace.names) == set(expected)
    for name, parts in expected.items():
        want = torch.cat([p[0] for p in parts])
        got = trace.read_torch(name)
        assert got.dtype == want.dtype, name  # bf16 stays bf16: no silent precision loss
        assert torch.equal(got, want), name
        keys = trace.keys(name)
        assert np.array_equal(keys["depth"], np.concatenate([np.full(len(p[2]), p[3]) for p in parts]))
        assert np.array_equal(keys["pos"], np.concatenate([p[2] for p in parts]))
    # bf16 numpy view is an exact float32 upcast
    if dtype == torch.bfloat16:
        assert np.array_equal(trace.read("draft.fc_out"), trace.read_torch("draft.fc_out").float().numpy())


def test_chunk_ranges_cover_rows_and_bound_memory(tmp_path):
    path = str(tmp_path / "t")
    with TraceWriter(path, side="train", chunk_bytes=H * 2 * 10, overwrite=True) as w:
        w.append("target.aux.0", torch.zeros(95, H, dtype=torch.bfloat16), seq=0, pos=np.arange(95))
    trace = open_trace(path)
    ranges = trace.chunks("target.aux.0", per_range=1)
    assert ranges[0] == (0, 16) and ranges[-1][1] == 95  # 16 = minimum chunk rows
    assert all(b - a <= 16 for a, b in ranges)
    grouped = trace.chunks("target.aux.0")  # 4 chunks per range by default
    assert grouped[0] == (0, 64) and grouped[-1] == (64, 95)
    assert np.array_equal(trace.read("target.aux.0"), np.zeros((95, H), np.float32))  # zeros chunks kept


_KILL_SCRIPT = """
import sys, time, numpy as np, torch
from specdiff.tracer.store import TraceWriter
w = TraceWriter(sys.argv[1], side="serve", chunk_bytes=4096, overwrite=True)
sid = w.add_sequence(np.arange(50), rid="r")
for i in range(int(sys.argv[2])):
    w.append("draft.hidden_out", torch.full((1, 32), float(i), dtype=torch.bfloat16), seq=sid, pos=i, depth=i % 3)
print("ready", flush=True)
time.sleep(60)
"""


def test_writer_killed_with_sigkill_keeps_every_completed_record(tmp_path):
    path = str(tmp_path / "killed")
    n = 203  # several committed chunks (64 rows each) plus an uncommitted tail
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, path, str(n)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    trace = open_trace(path)
    assert not trace.closed
    assert trace.records == n
    values = trace.read("draft.hidden_out")[:, 0]
    assert np.array_equal(values, np.arange(n, dtype=np.float32))
    assert np.array_equal(trace.keys("draft.hidden_out")["depth"], np.arange(n) % 3)
    assert len(trace.sequences) == 1


def test_cut_last_record_is_dropped_and_reported(tmp_path):
    path = tmp_path / "cut"
    w = TraceWriter(str(path), side="serve", overwrite=True)
    for i in range(5):
        w.append("tokens", np.array([i]), seq=0, pos=i)
    w._journal.close()  # a writer that never closed (killed)
    # Simulate a kill inside the last append: cut half of the last record.
    journal = path / "journal.msgpack"
    raw = journal.read_bytes()
    import msgpack

    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    ends = []
    for _ in unpacker:
        ends.append(unpacker.tell())
    # entries: header, contract, 5 recs -> cut the last rec in half
    journal.write_bytes(raw[: ends[5] + (ends[6] - ends[5]) // 2])
    trace = open_trace(str(path))
    assert not trace.closed and trace.records == 4 and trace.cut_tail_bytes > 0
    assert trace.read("tokens").tolist() == [0, 1, 2, 3]


def test_closed_trace_journal_is_compacted(tmp_path):
    path = tmp_path / "c"
    with TraceWriter(str(path), side="serve", chunk_bytes=1 << 20, overwrite=True) as w:
        w.append("draft.fc_out", torch.ones(100, 256, dtype=torch.bfloat16), seq=0, pos=np.arange(100))
    assert (path / "journal.msgpack").stat().st_size < 2000  # the 50 KB payload is gone
    trace = open_trace(str(path))
    assert trace.closed and trace.records == 1
    assert np.array_equal(trace.read("draft.fc_out"), np.ones((100, 256), np.float32))


def _assert_one_line_error(run_cli, path, message):
    with pytest.raises(TraceError) as err:
        open_trace(path)
    assert str(err.value) == message
    result = run_cli("info", path)
    assert result.exit_code == 2
    assert result.stderr == f"specdiff: error: {message}\n"  # one line, no traceback


def test_truncated_journal_of_a_closed_trace_is_read_from_zarr(tmp_path, run_cli):
    path = tmp_path / "t"
    with TraceWriter(str(path), side="serve", overwrite=True) as w:
        w.add_sequence([5, 6, 7], rid="r")
        w.append("tokens", np.array([1]), seq=0, pos=0)
    (path / "journal.msgpack").write_bytes((path / "journal.msgpack").read_bytes()[:5])
    trace = open_trace(str(path))
    assert trace.read("tokens").tolist() == [1] and trace.sequences[0].tokens.tolist() == [5, 6, 7]
    line = (f"{path}: journal.msgpack is truncated before its header (5 bytes): the trace was closed cleanly, so it "
            "is read from its zarr arrays (nothing lost); copy the trace again to repair the journal")
    assert [d.message() for d in trace.damage] == [line]
    result = run_cli("info", str(path))
    assert result.exit_code == 1 and result.stderr == "" and f"\n  {line}\n" in result.stdout


def test_missing_chunk_is_named_and_costs_only_its_rows(tmp_path, run_cli):
    path = tmp_path / "t"
    with TraceWriter(str(path), side="serve", chunk_bytes=64 * 2 * 16, overwrite=True) as w:
        w.append("draft.fc_out", torch.ones(40, 64, dtype=torch.bfloat16), seq=0, pos=np.arange(40))
    os.remove(path / "tensors" / "draft.fc_out" / "data" / "c" / "1" / "0")
    trace = open_trace(str(path))
    values = trace.read("draft.fc_out")
    assert np.isnan(values[16:32]).all() and (values[:16] == 1).all() and (values[32:] == 1).all()
    line = (f"{path}: tensor draft.fc_out, chunk tensors/draft.fc_out/data/c/1/0 is missing: rows 16-31 are "
            "unreadable and not compared; copy the trace again from where it was recorded, or re-record it")
    assert [d.message() for d in trace.damage] == [line]
    result = run_cli("info", str(path))
    assert result.exit_code == 1 and result.stderr == "" and f"\n  {line}\n" in result.stdout


def test_foreign_zarr_store_is_a_clear_error(tmp_path, run_cli):
    path = tmp_path / "foreign"
    zarr.open_group(str(path), mode="w").create_array("x", shape=(3,), dtype="f4")
    _assert_one_line_error(run_cli, str(path), f"{path}: is a zarr store but not a specdiff trace (no 'specdiff' attributes)")


def test_plain_directory_is_a_clear_error(tmp_path, run_cli):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("hello")
    _assert_one_line_error(run_cli, str(tmp_path / "d"), f"{tmp_path / 'd'}: not a specdiff trace (no zarr group found)")


def test_future_format_version_is_a_clear_error(tmp_path, run_cli):
    path = tmp_path / "t"
    with TraceWriter(str(path), side="serve", overwrite=True) as w:
        w.append("tokens", np.array([1]), seq=0, pos=0)
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["specdiff"]["format"] = 99
    (path / "zarr.json").write_text(json.dumps(meta))
    _assert_one_line_error(run_cli, str(path), f"{path}: specdiff trace format 99 is not supported (this specdiff "
                                      "reads format 1); use a matching specdiff version")


def test_wrong_shape_or_dtype_append_is_refused(tmp_path):
    with TraceWriter(str(tmp_path / "t"), side="serve", overwrite=True) as w:
        w.append("draft.fc_out", torch.zeros(2, 8, dtype=torch.bfloat16), seq=0, pos=[0, 1])
        with pytest.raises(TraceError, match="a tensor keeps one dtype and shape"):
            w.append("draft.fc_out", torch.zeros(2, 8, dtype=torch.float32), seq=0, pos=[0, 1])
        with pytest.raises(TraceError, match=r"expected \[row, draft_hidden\]"):
            w.append("draft.fc_out", torch.zeros(2, 8, 1), seq=0, pos=[0, 1])
        with pytest.raises(KeyError, match="not a canonical specdiff tensor"):
            w.append("draft.whatever", torch.zeros(2), seq=0, pos=[0, 1])


def test_existing_trace_is_not_overwritten_by_default(tmp_path):
    path = str(tmp_path / "t")
    TraceWriter(path, side="serve").close()
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(path, side="serve")
    assert open_trace(path).closed  # the old one is intact


def test_fsspec_memory_url_round_trip():
    url = f"memory://specdiff-test-{time.time_ns()}"
    with TraceWriter(url, side="train", contract={"num_layers": 8}) as w:
        sid = w.add_sequence([5, 6, 7])
        w.append("target.aux.1", torch.arange(12, dtype=torch.float32).reshape(3, 4), seq=sid, pos=[0, 1, 2])
    trace = open_trace(url)
    assert trace.contract["num_layers"] == 8 and trace.closed
    assert trace.read("target.aux.1").tolist() == np.arange(12).reshape(3, 4).tolist()


def test_xarray_alone_opens_a_trace_with_named_dims(tmp_path):
    xr = pytest.importorskip("xarray")
    path = str(tmp_path / "t")
    _write_everything(path, torch.bfloat16)
    ds = xr.open_zarr(path, group="tensors/target.aux_cat", consolidated=False)
    assert ds["data"].dims == ("row", "aux_hidden")
    assert ds["data"].attrs["specdiff_dtype"] == "bfloat16"
    assert ds.sizes["aux_hidden"] == K * H and ds["seq"].dims == ("row",)
    seqs = xr.open_zarr(path, group="sequences", consolidated=False)
    assert seqs["tokens"].dims == ("token",) and seqs.sizes["token"] == sum(SEQ_LENS)


def test_info_prints_contract_sequences_tensors_and_state(tmp_path, run_cli):
    path = str(tmp_path / "t")
    _write_everything(path, torch.float16)
    result = run_cli("info", path)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "state      closed cleanly" in out
    assert "num_layers               8" in out
    assert "seq 2    len 30    prompt 15    rid req-2" in out
    assert f"target.aux_cat             float16   rows {sum(SEQ_LENS)}" in out
    assert "records" in out and "[aux_hidden=192]" in out


def test_info_reports_a_cut_off_trace(tmp_path, run_cli):
    path = Path(tmp_path / "k")
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(path), "7"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    out = run_cli("info", str(path)).stdout
    assert "CUT OFF: the writer did not close it" in out and "records 7" in out


def test_a_tensor_written_with_no_rows_reads_as_empty(tmp_path):
    """A tensor appended with 0 rows is in the layout: reading it (data, keys, an empty range) gives
    [0, *shape] / [0], not numpy's 'need at least one array to concatenate' (found by the recorder's
    device test when a capture's rows were all skipped)."""
    path = str(tmp_path / "e.trace")
    with TraceWriter(path, side="serve", overwrite=True) as w:
        w.append("target.aux.0", torch.zeros(0, 8, dtype=torch.bfloat16), seq=0, pos=np.arange(0))
        w.append("target.aux.1", torch.ones(3, 8, dtype=torch.bfloat16), seq=0, pos=np.arange(3))
    t = open_trace(path)
    assert t.rows("target.aux.0") == 0
    assert t.read("target.aux.0").shape == (0, 8) and t.keys("target.aux.0")["seq"].shape == (0,)
    assert t.read("target.aux.1", 2, 2).shape == (0, 8)
    assert t.read("target.aux.1").shape == (3, 8)
