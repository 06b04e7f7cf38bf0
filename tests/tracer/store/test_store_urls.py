"""Traces at fsspec URLs: a pair written into ``memory://`` or at ``file://`` diffs to the same JSON
as on disk; per-rank traces open as one at a URL too."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_json
from specdiff.tracer.store import TraceWriter, open_trace

EXAMPLE = Path(__file__).resolve().parents[3] / "traces" / "examples" / "seed"


def _write_copy(src: str, dst: str) -> None:
    """Write the trace at ``src`` again, through TraceWriter, at ``dst`` (path or URL), in
    appends of 61 rows so chunks commit and records span chunk edges."""
    trace = open_trace(src)
    with TraceWriter(dst, side=trace.side, contract=trace.contract, chunk_bytes=1 << 16) as w:
        for s in trace.sequences:
            w.add_sequence(s.tokens, prompt_len=s.prompt_len, rid=s.rid, seq_id=s.id)
        for name in trace.names:
            data, keys = trace.read_torch(name), trace.keys(name)
            for a in range(0, trace.rows(name), 61):
                w.append(name, data[a:a + 61], **{k: v[a:a + 61] for k, v in keys.items()})


def test_a_pair_written_into_memory_urls_diffs_like_the_same_pair_on_disk(tmp_path):
    mem = f"memory://specdiff-pair-{time.time_ns()}"
    jsons = []
    for root in (str(tmp_path / "local"), mem, f"file://{tmp_path}/url"):
        for side in ("train", "serve"):
            _write_copy(str(EXAMPLE / f"{side}.trace"), f"{root}/{side}.trace")
        report = render_json(diff_traces(f"{root}/train.trace", f"{root}/serve.trace"))
        jsons.append(report.replace(root.removeprefix("file://"), "<ROOT>"))  # file:// reads as its path
    assert jsons[0] == jsons[1] == jsons[2]
    assert '"first_divergence"' in jsons[0] and "target.aux" in jsons[0]  # the seed bug is found at a URL too
    served = open_trace(f"{mem}/serve.trace")
    original = open_trace(str(EXAMPLE / "serve.trace"))
    for name in original.names:
        assert np.array_equal(served.read(name), original.read(name), equal_nan=True)


def test_rank_stores_at_a_memory_url_open_as_one_trace_even_with_a_rank_cut_off():
    root = f"memory://specdiff-ranks-{time.time_ns()}/serve.trace"
    for r in (0, 1):
        w = TraceWriter(f"{root}/dp{r}", side="serve", chunk_bytes=4096)
        w.add_sequence(np.arange(5), rid=f"r{r}")
        for i in range(0, 300, 3):
            w.append("target.aux.0", torch.full((3, 16), float(i + 1000 * r)), seq=0, pos=np.arange(i, i + 3))
        if r == 0:
            w.close()  # dp1's writer never closes: its last 44 rows are in its spill file
    trace = open_trace(root)
    assert [label for label, _ in trace.ranks] == ["dp0", "dp1"] and not trace.closed
    assert [s.rid for s in trace.sequences] == ["r0", "r1"] and trace.rows("target.aux.0") == 600
    want = np.concatenate([np.repeat(np.arange(0, 300, 3), 3), 1000 + np.repeat(np.arange(0, 300, 3), 3)])
    assert np.array_equal(trace.read("target.aux.0")[:, 0], want.astype(np.float32))
