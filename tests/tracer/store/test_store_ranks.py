"""A data-parallel server's per-rank traces (``<trace>/dp<r>``) open as one logical trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_json
from specdiff.tracer.errors import TraceError
from specdiff.tracer.store import TraceWriter, open_trace

CONTRACT = {"engine": "sglang", "hidden_size": 8, "aux_hf_indices": [1], "dtype": "bfloat16"}
RNG = np.random.default_rng(0)
SEQS = [(f"req{i}", RNG.integers(0, 40, size=6 + i)) for i in range(5)]  # rid, tokens
AUX = {rid: torch.from_numpy(RNG.standard_normal((len(t), 8)).astype(np.float32)).to(torch.bfloat16)
       for rid, t in SEQS}


def _write(path: Path, seqs, *, side: str, contract=None, dropped: int = 0) -> None:
    with TraceWriter(str(path), side=side, contract={**CONTRACT, "dropped_records": dropped, **(contract or {})},
                     chunk_bytes=64) as w:
        for rid, toks in seqs:
            sid = w.add_sequence(toks, prompt_len=3, rid=rid)
            w.append("tokens", torch.from_numpy(toks.astype(np.int64)), seq=sid, pos=np.arange(len(toks)))
            w.append("target.aux.0", AUX[rid], seq=sid, pos=np.arange(len(toks)))


def _two_ranks(root: Path, **dp1) -> Path:
    parent = root / "serve.trace"
    _write(parent / "dp0", SEQS[:3], side="serve", dropped=1)
    _write(parent / "dp1", SEQS[3:], side="serve", dropped=2, **dp1)
    return parent


def test_two_dp_rank_stores_open_as_one_trace_over_both_ranks_sequences(tmp_path):
    trace = open_trace(str(_two_ranks(tmp_path)))
    assert [label for label, _ in trace.ranks] == ["dp0", "dp1"]
    assert [s.rid for s in trace.sequences] == [rid for rid, _ in SEQS]
    assert [s.id for s in trace.sequences] == [0, 1, 2, 3, 4]  # dp1's 0, 1 shifted past dp0's
    assert trace.closed and trace.damage == [] and trace.contract["dropped_records"] == 3
    rows = sum(len(t) for _, t in SEQS)
    assert trace.rows("target.aux.0") == rows
    want = torch.cat([AUX[rid] for rid, _ in SEQS])
    assert torch.equal(trace.read_torch("target.aux.0").view(torch.int16), want.view(torch.int16))
    keys = trace.keys("target.aux.0")
    assert keys["seq"].tolist() == [i for i, (_, t) in enumerate(SEQS) for _ in t]
    chunks = trace.chunks("target.aux.0")
    assert chunks[0][0] == 0 and chunks[-1][1] == rows and all(b > a for a, b in chunks)
    picked = np.array([rows - 1, 0, 20])  # rows of both ranks, any order
    assert np.array_equal(trace.take("target.aux.0", picked), want.view(torch.int16).numpy().view(np.uint16)[picked])
    assert trace.take("target.aux.0", picked, column="seq").tolist() == keys["seq"][picked].tolist()


def test_a_dp_rank_pair_diffs_like_one_store_holding_the_same_requests(tmp_path):
    train = tmp_path / "train.trace"
    _write(train, SEQS, side="train")
    ranked = _two_ranks(tmp_path / "ranked")
    single = tmp_path / "single" / "serve.trace"
    _write(single, SEQS, side="serve", dropped=3)
    a = render_json(diff_traces(str(train), str(ranked))).replace(str(ranked), "<SERVE>")
    b = render_json(diff_traces(str(train), str(single))).replace(str(single), "<SERVE>")
    assert a == b


def test_rank_stores_of_different_models_are_one_clear_error(tmp_path):
    parent = _two_ranks(tmp_path, contract={"hidden_size": 16})
    message = (f"{parent}: rank stores disagree on hidden_size (dp0: 8, dp1: 16), so they are not ranks of one "
               "server; open each rank on its own")
    with pytest.raises(TraceError) as err:
        open_trace(str(parent))
    assert str(err.value) == message
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "info", str(parent)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == f"specdiff: error: {message}\n"


def test_info_lists_the_ranks_of_a_dp_trace(tmp_path):
    parent = _two_ranks(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "info", str(parent)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "ranks      2 (one store per data-parallel replica)" in lines
    assert any(line.split()[:1] == ["dp0"] and str(parent / "dp0") in line and "3 sequences" in line for line in lines)
    assert any(line.split()[:1] == ["dp1"] and "2 sequences" in line and "closed cleanly" in line for line in lines)
    assert "sequences  5" in lines


def test_ranks_whose_writers_differ_open_and_say_which_writer_each_ran(tmp_path):
    # one rank's ring could not be made (its writer fell back to the thread): still one server's ranks
    process = {"kind": "process", "ring_bytes": 1 << 28, "why": None}
    thread = {"kind": "thread", "ring_bytes": None, "why": "no shared-memory ring: [Errno 28] No space left on device"}
    parent = tmp_path / "serve.trace"
    _write(parent / "dp0", SEQS[:3], side="serve", contract={"recorder_writer": process, "recorder_writer_cpu_s": 1.5})
    _write(parent / "dp1", SEQS[3:], side="serve", contract={"recorder_writer": thread, "recorder_writer_cpu_s": 0.0})
    trace = open_trace(str(parent))
    assert trace.contract["recorder_writer"] == {"per_rank": {"dp0": process, "dp1": thread}}
    assert trace.contract["recorder_writer_cpu_s"] == 1.5  # the writers' CPU seconds, all ranks
    same = tmp_path / "same.trace"
    _write(same / "dp0", SEQS[:3], side="serve", contract={"recorder_writer": process, "recorder_writer_cpu_s": 1.5})
    _write(same / "dp1", SEQS[3:], side="serve", contract={"recorder_writer": process, "recorder_writer_cpu_s": 2.5})
    assert open_trace(str(same)).contract["recorder_writer"] == process


def test_unclosed_ranks_are_caught_up_as_far_as_the_slowest_writer(tmp_path):
    """Each rank's writer journals its own progress (``recorder_caught_up_at``); the merged trace
    says the earliest, the moment every rank had written what it was handed; a rank whose writer
    is done (None) holds no one back."""
    parent = tmp_path / "serve.trace"
    writers = [TraceWriter(str(parent / f"dp{r}"), side="serve", contract=CONTRACT) for r in range(2)]
    for w, (rid, toks) in zip(writers, SEQS, strict=False):
        w.add_sequence(toks, prompt_len=3, rid=rid)
    writers[0].journal_progress(105.0)
    writers[1].journal_progress(102.5)
    assert open_trace(str(parent)).contract["recorder_caught_up_at"] == 102.5
    writers[1].journal_progress(None)
    assert open_trace(str(parent)).contract["recorder_caught_up_at"] == 105.0
    w2 = TraceWriter(str(parent / "dp2"), side="serve", contract=CONTRACT)  # a rank that does not mark
    w2.add_sequence(SEQS[2][1], prompt_len=3, rid=SEQS[2][0])
    assert "recorder_caught_up_at" not in open_trace(str(parent)).contract
    writers.append(w2)
    for w in writers:
        w.close()
    assert "recorder_caught_up_at" not in open_trace(str(parent)).contract
