"""What the recorder writes, without a server: a topk tree's parents from SGLang's sibling links, the
asynchronous trace writer's bounds (dropped items counted, queued bytes capped, a failed write
stops it), and a trace cut at any journal write (a SIGKILLed server's) holding no target row past
its tokens.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.sglang.attribution import _parents
from specdiff.tracer.engines.writer.thread import AsyncTraceWriter
from specdiff.tracer.store import TraceWriter, open_trace


def test_tree_parents_from_sibling_links():
    # root 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}
    nt = np.array([1, 3, 5, -1, -1, -1])
    ns = np.array([-1, 2, -1, 4, -1, -1])
    assert _parents(nt, ns).tolist() == [-1, 0, 0, 1, 1, 2]


def test_async_writer_counts_drops_and_survives_failure(tmp_path):
    gate = threading.Event()

    def slow(tw, item):
        gate.wait(5)
        tw.append("verify.accept_length", np.array([item]), seq=0, pos=item)

    tw = TraceWriter(str(tmp_path / "a.trace"), side="serve")
    aw = AsyncTraceWriter(tw, slow, max_items=2)
    results = [aw.submit(i) for i in range(6)]
    assert results.count(False) >= 3 and aw.dropped == results.count(False)
    gate.set()
    assert aw.close()
    t = open_trace(str(tmp_path / "a.trace"))
    assert t.closed and t.contract["dropped_records"] == aw.dropped
    assert t.rows("verify.accept_length") == 6 - aw.dropped

    def broken(tw, item):
        raise RuntimeError("disk full")

    tw2 = TraceWriter(str(tmp_path / "b.trace"), side="serve")
    aw2 = AsyncTraceWriter(tw2, broken)
    aw2.submit(1)
    for _ in range(100):
        if aw2.failed:
            break
        time.sleep(0.02)
    assert aw2.failed and not aw2.active and aw2.submit(2) is False


def test_a_trace_cut_at_any_journal_write_has_no_target_row_past_its_tokens(tmp_path):
    """A SIGKILLed server's trace ends at an arbitrary journal write. Seen on SGLang 0.5.20 (CPU,
    loaded machine): rows of a request's first decode iteration were journaled, its tokens were
    not, and the target rows at t had no token x_{t+1}. Invariant checked at every write: a
    ``target.*`` row at t is written only once the sequence holds t + 2 tokens."""
    from specdiff.tracer.engines.sglang.attribution import IterCapture, write_capture
    from specdiff.tracer.engines.sglang.hooks import Recorder

    H, K, N = 4, 3, 4  # hidden size, aux layers, draft tokens (chain, topk 1)
    rec = Recorder(Options(path=str(tmp_path / "k.trace")))
    rec.hidden_size, rec.num_aux, rec.topk = H, K, 1
    rec.recorded["r"] = "all"  # what the sampler decides at the request's first hook (no SPECDIFF_SAMPLE)
    tw = TraceWriter(rec.opts.path, side="serve")
    violations = []
    append = tw.append

    def checked_append(name, data, *, seq, pos, **kw):
        if name.startswith("target."):
            for sq, t in zip(np.broadcast_to(seq, np.shape(pos)).tolist(), np.ravel(pos).tolist()):
                if len(tw._sequences[sq].tokens) < t + 2:
                    violations.append((name, sq, t, len(tw._sequences[sq].tokens)))
        return append(name, data, seq=seq, pos=pos, **kw)

    tw.append = checked_append
    prefill = IterCapture(iter=0, kind="prefill", rids=["r"], prompts={"r": [5, 6, 7]}, prefix_lens=[0],
                          extend_lens=[3])
    prefill.t.update(target_aux=torch.randn(3, K * H), next_token_ids=torch.tensor([8]))
    write_capture(rec, tw, prefill)
    decode = IterCapture(iter=1, kind="decode", rids=["r"])  # committed length 3, accepts 3 of 4
    decode.t.update(seq_lens=torch.tensor([3]), predict=torch.tensor([9, 10, 11, 12]),
                    accept_lens=torch.tensor([3]), accept_index=torch.tensor([[0, 1, 2, -1]]),
                    target_aux=torch.randn(N, K * H), verify_positions=torch.arange(3, 3 + N))
    write_capture(rec, tw, decode)
    assert violations == []
    tw.close()
    t = open_trace(rec.opts.path)
    assert t.sequences[0].tokens.tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert t.rows("target.aux.0") == 3 + 3  # prompt rows + the accepted rows


def test_async_writer_bounds_queued_bytes(tmp_path):
    gate = threading.Event()

    class Item:
        def __init__(self, n):
            self.n = n

        def nbytes(self):
            return 600

    def slow(tw, item):
        gate.wait(5)

    aw = AsyncTraceWriter(TraceWriter(str(tmp_path / "c.trace"), side="serve"), slow, max_items=100, max_bytes=1000)
    ok = [aw.submit(Item(i)) for i in range(4)]
    # the first is taken by the thread (or queued), at most one more fits under 1000 bytes
    assert ok[0] and ok.count(True) <= 2 and aw.dropped == ok.count(False)
    gate.set()
    assert aw.close()
    assert aw.queued_bytes == 0
