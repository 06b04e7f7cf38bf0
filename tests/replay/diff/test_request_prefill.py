"""The serving recorder's per-request prefill facts (contract ``request_prefill``: the radix-cache hit and
the prefill chunks, tracer/engines/sglang/prefill.py) as the diff reads them, on real zarr stores.

The facts, not the rows, decide: a recorded cached prefix wins over the one the rows suggest, and
the chunk boundaries come only from the record. A wrong draft input token at exactly the last row
of each non-final chunk is named ``chunk_boundary_token``; the same number of wrong tokens elsewhere
is not. (The real server's version of both: tests/server/test_injected_serving_bugs.py.)
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from specdiff.replay.diff.align.align import align_sequences
from specdiff.replay.diff.judge.groups import cached_prefixes, chunk_ends, recorded_prefill
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.types import Pair
from specdiff.tracer.engines.sglang.prefill import PrefillFacts
from specdiff.tracer.store import TraceWriter, open_trace

T, PROMPT = 40, 36
CHUNKS = [[0, 16], [16, 16], [32, 4]]


def _write(root, *, wrong_at=(), prefill=None) -> tuple[str, str]:
    """Training and serving traces of 2 sequences: depth-0 ``tokens`` (x_{t+1}) and ``draft.hidden_out``
    at every position; serving's token is off by one at ``wrong_at`` ((seq, pos) pairs)."""
    rng = np.random.default_rng(0)
    paths = (str(root / "train.trace"), str(root / "serve.trace"))
    seqs = [rng.integers(0, 1000, T + 1) for _ in range(2)]
    out = [rng.standard_normal((T, 16)).astype(np.float32) for _ in range(2)]
    for side, path in zip(("train", "serve"), paths, strict=True):
        contract = {"hidden_size": 16, "dtype": "bfloat16"}
        if side == "serve" and prefill is not None:
            contract["request_prefill"] = prefill
        with TraceWriter(path, side=side, contract=contract, overwrite=True) as w:
            for s, toks in enumerate(seqs):
                sid = w.add_sequence(toks, prompt_len=PROMPT, rid=f"req-{s}")
                pos = np.arange(T)
                inputs = toks[1:].astype(np.int64).copy()
                if side == "serve":
                    for ws, wp in wrong_at:
                        if ws == s:
                            inputs[wp] += 1
                it = np.where(pos < PROMPT, -1, 0)
                w.append("tokens", inputs, seq=sid, pos=pos, iter=it)
                w.append("draft.hidden_out", out[s], seq=sid, pos=pos, iter=it)
    return paths


def _pair(paths):
    traces = Pair(*(open_trace(p) for p in paths))
    return traces, align_sequences(traces)


def test_prefill_facts_are_noted_per_recorded_request_with_unknown_when_unreadable():
    class Adapter:
        def get(self, req, name):
            assert name == "Req.cached_tokens"
            return req.cached_tokens

    facts = PrefillFacts()
    reqs = [SimpleNamespace(cached_tokens=0), SimpleNamespace(cached_tokens=39), SimpleNamespace(cached_tokens=None)]
    facts.note(Adapter(), reqs, ["a", "b", "c"], [0, 39, 0], [16, 2, 5], keep=lambda rid: True)
    facts.note(Adapter(), reqs[:1], ["a"], [16], [16], keep=lambda rid: True)
    facts.note(Adapter(), reqs[1:2], ["skipped"], [0], [3], keep=lambda rid: False)
    assert facts.contract() == {"request_prefill": {
        "a": {"cached_prefix": 0, "chunks": [[0, 16], [16, 16]]},
        "b": {"cached_prefix": 39, "chunks": [[39, 2]]},
        "c": {"cached_prefix": "unknown", "chunks": [[0, 5]]}}}


def test_the_recorded_cached_prefix_wins_over_the_rows_and_unknown_falls_back_to_them(tmp_path):
    # serving recorded rows from position 0 of both sequences (the rows suggest no cache hit)
    prefill = {"req-0": {"cached_prefix": 20, "chunks": [[20, 16]]}, "req-1": {"cached_prefix": "unknown",
                                                                              "chunks": CHUNKS}}
    traces, alignment = _pair(_write(tmp_path, prefill=prefill))
    assert set(recorded_prefill(traces.y)) == {0, 1}
    assert cached_prefixes(traces, alignment, "y") == {0: 20}
    assert chunk_ends(traces, alignment, "y") == {1: [15, 31]}
    assert cached_prefixes(traces, alignment, "x") == {}  # training records none


def test_one_wrong_token_at_each_recorded_chunk_boundary_is_named(tmp_path):
    prefill = {f"req-{s}": {"cached_prefix": 0, "chunks": CHUNKS} for s in range(2)}
    wrong = [(0, 15), (0, 31), (1, 15)]
    report = diff_traces(*_write(tmp_path, wrong_at=wrong, prefill=prefill), narrow=False)
    assert report.first.name == "tokens" and report.first.first_where == {"pair": 0, "pos": 15, "depth": 0}
    assert [e.cause for e in report.explanations] == ["chunk_boundary_token"]
    e = report.explanations[0]
    assert "all 3 failing rows are the last row of a non-final prefill chunk (4 such rows in 2 requests)" in e.message
    assert e.evidence[0] == "prefill chunks recorded per request: seq 0: chunks end at pos 15, 31, seq 1: chunks " \
                            "end at pos 15, 31"
    assert e.evidence[1].startswith("seq 0 pos 15: training ") and " vs serving " in e.evidence[1]


def test_wrong_tokens_off_the_chunk_boundaries_are_not_called_a_chunk_bug(tmp_path):
    prefill = {f"req-{s}": {"cached_prefix": 0, "chunks": CHUNKS} for s in range(2)}
    report = diff_traces(*_write(tmp_path, wrong_at=[(0, 15), (0, 22), (1, 15)], prefill=prefill), narrow=False)
    assert report.first.name == "tokens"
    assert "chunk_boundary_token" not in [e.cause for e in report.explanations]
    # without the record the same boundary rows are not named either: the rows alone do not show chunks
    report = diff_traces(*_write(tmp_path, wrong_at=[(0, 15), (0, 31), (1, 15)]), narrow=False)
    assert "chunk_boundary_token" not in [e.cause for e in report.explanations]
