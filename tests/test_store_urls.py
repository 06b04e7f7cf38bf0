"""Traces at fsspec URLs: a pair written into ``memory://`` diffs to the same JSON as on disk."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from specdiff.replay.diff.report import diff_traces, render_json
from specdiff.tracer.store import TraceWriter, open_trace

EXAMPLE = Path(__file__).resolve().parents[1] / "traces" / "examples" / "seed"


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
    for root in (str(tmp_path), mem):
        for side in ("train", "serve"):
            _write_copy(str(EXAMPLE / f"{side}.trace"), f"{root}/{side}.trace")
        report = render_json(diff_traces(f"{root}/train.trace", f"{root}/serve.trace"))
        jsons.append(report.replace(root, "<ROOT>"))
    assert jsons[0] == jsons[1]
    assert '"first_divergence"' in jsons[0] and "target.aux" in jsons[0]  # the seed bug is found at a URL too
    served = open_trace(f"{mem}/serve.trace")
    original = open_trace(str(EXAMPLE / "serve.trace"))
    for name in original.names:
        assert np.array_equal(served.read(name), original.read(name), equal_nan=True)
