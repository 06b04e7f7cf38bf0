"""The serving recorders' hot path (off the server's critical path): unsampled requests cost no prompt conversion, a
sampled prompt goes to the writer as the engine holds it, CPU copies go once, straight into the
writer process's ring (``Ring.stage``), and the trace says which writer ran and with what ring."""

from __future__ import annotations

import array
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.requests import sample_unit
from specdiff.tracer.engines.writer.ring import Ring
from specdiff.tracer.rows import token_list
from specdiff.tracer.store import open_trace


def _ring(tmp_path, size=64 * 1024):
    path = str(tmp_path / "ring")
    prod = Ring(path, size, create=True)
    cons = Ring(path)
    os.unlink(path)
    return prod, cons


def _read(cons):
    got = cons.get()
    assert got is not None
    obj, total = got
    out = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in obj.items()}
    del obj, got
    cons.release(total)
    return out


def test_staged_tensors_are_put_without_a_second_copy_and_read_back_bit_exact(tmp_path):
    prod, cons = _ring(tmp_path)
    owner = object()
    h = torch.randn(5, 12).bfloat16()
    buf = prod.stage(h.numel() * h.element_size(), owner)
    staged = buf.view(h.dtype).view(h.shape)
    staged.copy_(h)
    lo, hi = prod.u8.data_ptr(), prod.u8.data_ptr() + prod.size
    assert lo <= staged.data_ptr() < hi  # the copy lies in the ring itself
    ids = torch.arange(7)
    assert prod.put({"h": staged, "ids": ids, "n": 3}, owner=owner)
    got = _read(cons)
    assert torch.equal(got["h"], h) and torch.equal(got["ids"], ids) and got["n"] == 3
    assert prod.used() == 0 and not prod.staging


def test_each_record_says_when_it_was_put_in_the_order_put(tmp_path):
    """The writer process marks its progress with the put time of the record it has just written
    (tracer/engines/writer/child.py): each record carries the producer's clock, after a wrap too."""
    prod, cons = _ring(tmp_path, size=8 * 1024)
    times = []
    for i in range(40):  # ~2.5 KiB each: wraps the 8 KiB ring several times
        t0 = time.time()
        assert prod.put({"i": i, "x": torch.zeros(600)})
        t1 = time.time()
        got = cons.get()
        assert got is not None and got[0]["i"] == i
        assert t0 <= cons.put_at <= t1
        times.append(cons.put_at)
        cons.release(got[1])
    assert times == sorted(times)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64, torch.int32, torch.bool])
def test_typed_staging_is_one_contiguous_tensor_in_the_ring_read_back_bit_exact(tmp_path, dtype):
    """``stage(n, owner, dtype, shape)`` (the serving thread's one ``as_strided``) after a record of
    odd size; a non-contiguous view of a staged tensor is copied into the record, not refused."""
    prod, cons = _ring(tmp_path)
    assert prod.put({"odd": torch.arange(3, dtype=torch.uint8)})
    _read(cons)
    owner = object()
    src = (torch.randn(6, 10) * 100).to(dtype)
    t = prod.stage(src.numel() * src.element_size(), owner, dtype, src.shape)
    t.copy_(src)
    lo = prod.u8.data_ptr()
    assert t.dtype == dtype and t.shape == src.shape and t.is_contiguous() and lo <= t.data_ptr() < lo + prod.size
    scalar = prod.stage(src.element_size(), owner, dtype, ())
    scalar.copy_(src[1, 2])
    assert prod.put({"t": t, "s": scalar, "col": t[:, 3]}, owner=owner)
    got = _read(cons)
    assert torch.equal(got["t"], src) and torch.equal(got["s"], src[1, 2]) and torch.equal(got["col"], src[:, 3])


def test_staging_wraps_and_mixes_with_plain_records_without_losing_a_byte(tmp_path):
    prod, cons = _ring(tmp_path, 16 * 1024)
    sent, seen = [], 0
    for i in range(300):
        owner = object()
        a = torch.randn(3, 40 + i % 50)
        t = prod.stage(a.numel() * 4, owner)
        if t is not None:
            t = t.view(torch.float32).view(a.shape)
            t.copy_(a)
        else:
            t = a.clone()  # what snap does when the ring has no room
        item = {"i": i, "a": t, "b": torch.arange(i % 9)}
        if prod.put(item, owner=owner):
            sent.append((i, a))
        if i % 3 == 0:  # a plain record (a contract update) between staged ones
            prod.put({"i": -1 - i, "a": torch.zeros(1), "b": torch.zeros(0)})
        while (got := cons.get()) is not None:
            obj, total = got
            if obj["i"] >= 0:
                want_i, want_a = sent[seen]
                assert obj["i"] == want_i and torch.equal(obj["a"], want_a)
                assert torch.equal(obj["b"], torch.arange(want_i % 9))
                seen += 1
            del obj, got
            cons.release(total)
    assert seen == len(sent) > 250


def test_a_capture_whose_staged_bytes_may_be_reused_is_refused(tmp_path):
    """Staging for another owner (or any other put) ends the staging: the first owner's tensors
    point into bytes the ring may hand out again, so its put is refused rather than published."""
    prod, cons = _ring(tmp_path)
    a, b = object(), object()
    ta = prod.stage(64, a)
    ta.fill_(1)
    tb = prod.stage(64, b)  # b's record starts where a's was
    tb.fill_(2)
    assert not prod.put({"t": ta}, owner=a)
    assert prod.put({"t": tb}, owner=b)
    assert _read(cons)["t"].tolist() == [2] * 64
    tc = prod.stage(64, a)
    assert prod.put({"x": 1})  # a plain put ends the staging
    assert not prod.put({"t": tc}, owner=a)


def _ring_at(tmp_path, name: str, frac: float):
    """An empty 1 MiB ring whose write position is ``frac`` of the way round (one plain record put
    and read)."""
    (tmp_path / name).mkdir()
    prod, cons = _ring(tmp_path / name, 1 << 20)
    assert prod.put({"pad": torch.zeros(int(prod.cap * frac) - 256, dtype=torch.uint8)})
    _read(cons)
    return prod, cons


def test_a_capture_that_fits_only_from_the_ring_start_is_staged_there_not_dropped(tmp_path):
    # (review) 1 MiB ring, its write position at 60 %, empty: a 0.5 MB capture fits only from 0;
    # staging refused it and the put of the unstaged capture was refused too, so its requests were lost
    prod, cons = _ring_at(tmp_path, "first", 0.6)
    a = torch.randn(512 * 1024 // 4)
    owner = object()
    t = prod.stage(a.numel() * 4, owner)
    assert t is not None  # started at 0
    t.view(torch.float32).copy_(a)
    assert prod.put({"a": t.view(torch.float32)}, owner=owner)
    assert torch.equal(_read(cons)["a"], a)
    # a capture staged at the tail whose later tensors do not fit after it moves to 0 with them
    prod, cons = _ring_at(tmp_path, "moved", 0.6)
    small, big = torch.randn(1000), torch.randn(int(prod.cap * 0.42) // 4)  # together past the 40 % tail
    owner = object()
    ts = prod.stage(small.numel() * 4, owner).view(torch.float32)
    ts.copy_(small)
    assert prod.stage(big.numel() * 4, owner) is None  # no room after it in the tail
    assert prod.put({"small": ts, "big": big.clone()}, owner=owner)
    got = _read(cons)
    assert torch.equal(got["small"], small) and torch.equal(got["big"], big)
    # a capture staging nothing is an ordinary put, which may wrap
    prod, cons = _ring_at(tmp_path, "plain", 0.6)
    owner = object()
    assert prod.stage(prod.cap, owner) is None
    assert prod.put({"big": big.clone()}, owner=owner) and torch.equal(_read(cons)["big"], big)


def test_a_producer_ring_that_staged_is_not_unmapped_while_captures_may_view_it(tmp_path):
    # (review) torch views do not keep an mmap from closing; reading a staged tensor after munmap
    # killed the process (SIGSEGV): a ring that staged keeps its mapping until the process exits
    prod, cons = _ring(tmp_path)
    t = prod.stage(64, object())
    t.fill_(7)
    prod.close()
    assert t.tolist() == [7] * 64
    (tmp_path / "plain").mkdir()
    plain, _ = _ring(tmp_path / "plain")
    plain.close()  # one that never staged unmaps
    assert plain.mm.closed


@pytest.mark.parametrize("prompt", [[5, 6, 7], array.array("q", [5, 6, 7]), np.array([5, 6, 7], np.int32),
                                    torch.tensor([5, 6, 7]), (5, 6, 7)])
def test_the_writer_makes_ints_of_a_prompt_as_the_engine_holds_it(prompt):
    """SGLang 0.5.23 holds ``Req.origin_input_ids`` as an ``array.array`` (it failed the writer's
    tensor-only conversion: ``'array.array' object has no attribute 'reshape'``)."""
    got = token_list(prompt)
    assert got == [5, 6, 7] and all(type(x) is int for x in got)
    assert token_list(None) == []


def _req(rid, prompt):
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, sampling_params=None)


class _Untouchable:
    """A prompt that fails when anything reads it (an unsampled request's prompt must not be)."""

    def __iter__(self):
        raise AssertionError("an unsampled request's prompt was read")

    __len__ = __getitem__ = __iter__


def test_unsampled_requests_prompts_are_never_read_and_sampled_ones_are_handed_over_as_held(tmp_path):
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.hooks import Recorder
    from specdiff.tracer.engines.writer.thread import AsyncTraceWriter
    from specdiff.tracer.store import TraceWriter

    rids = [f"req-{i}" for i in range(40)]
    kept = [r for r in rids if sample_unit(r) < 0.25]
    assert 0 < len(kept) < len(rids)
    path = tmp_path / "s.trace"
    rec = Recorder(Options(path=str(path), sample=0.25), SGLangAdapter("0.5.23", log=lambda m: None))
    rec.writer = AsyncTraceWriter(TraceWriter(str(path), side="serve"), rec._write)
    prompts = {r: (torch.tensor([1, 2, 3 + i]) if r in kept else _Untouchable()) for i, r in enumerate(rids)}
    batch = SimpleNamespace(reqs=[_req(r, prompts[r]) for r in rids], forward_iter=0,
                            forward_mode=SimpleNamespace(is_extend=lambda: True), prefix_lens=[0] * len(rids),
                            extend_lens=[3] * len(rids), seq_lens=torch.full((len(rids),), 3))
    cap = rec.begin(batch)
    assert set(cap.prompts) == set(kept) and set(rec.recorded) == set(kept)
    assert all(cap.prompts[r] is prompts[r] for r in kept)  # no conversion on the serving thread
    rec.writer.close()


def _recorder_writer_fact(tmp_path, monkeypatch, **opts):
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.hooks import Recorder

    path = tmp_path / "w.trace"
    rec = Recorder(Options(path=str(path), **opts), SGLangAdapter("0.5.23", log=lambda m: None))
    rec.open({"hidden_size": 8}, [], side={"hidden_size": 8, "num_aux": 3, "topk": 1})
    live = rec.writer.facts()
    pid = getattr(rec.writer, "writer_pid", None)  # the writer process (ProcessTraceWriter)
    if pid is not None:  # the writer process's priority, read from outside it while it runs
        assert live["nice"] == os.getpriority(os.PRIO_PROCESS, pid)
        group = _autogroup_nice(pid)
        assert live["autogroup_nice"] == group
    rec.close()
    t = open_trace(str(path))
    assert t.closed and t.contract["recorder_writer"] == live
    return live, rec.writer


def _autogroup_nice(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])  # "/autogroup-N nice K"
    except OSError:
        return None


def test_the_contract_says_which_writer_ran_and_its_ring_read_off_the_live_writer(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDIFF_WRITER_NICE", raising=False)
    facts, w = _recorder_writer_fact(tmp_path, monkeypatch, max_queue_mb=3)
    assert {k: facts[k] for k in ("kind", "ring_bytes", "why")} == {"kind": "process", "ring_bytes": w.ring.size,
                                                                   "why": None} and w.ring.size == 3 << 20
    # the priority it really ran at: nice 19, its own session's too where Linux has autogroups
    assert facts["nice"] == 19 and facts["nice_why"] is None
    assert facts["autogroup_nice"] == (19 if os.path.exists("/proc/self/autogroup") else None)


def test_the_contract_says_the_writer_kept_the_servers_priority_when_told_to(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDIFF_WRITER_NICE", "0")
    facts, _ = _recorder_writer_fact(tmp_path, monkeypatch)
    assert facts["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert facts["nice_why"] == "SPECDIFF_WRITER_NICE=0: the server's priority"


def test_the_contract_says_why_the_thread_writer_ran(tmp_path, monkeypatch):
    facts, _ = _recorder_writer_fact(tmp_path / "a", monkeypatch, writer="thread")
    assert facts["kind"] == "thread" and facts["why"] == "SPECDIFF_WRITER=thread" and facts["ring_bytes"] is None
    assert facts["nice"] == os.getpriority(os.PRIO_PROCESS, 0) and facts["nice_why"].startswith("a thread of")
    import specdiff.tracer.engines.writer.ring as ring

    monkeypatch.setattr(ring, "ring_dir", lambda: str(tmp_path / "no-such-dir"))
    facts, _ = _recorder_writer_fact(tmp_path / "b", monkeypatch)
    assert facts["kind"] == "thread" and facts["why"].startswith("no shared-memory ring: ")


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_recorder_copy_is_equal_to_the_tensor_and_independent_of_it(tmp_path, writer):
    """``snap`` on CPU: one copy (in the ring with the writer process), never a view of the
    engine's tensor, which the engine may change before the writer reads it."""
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.hooks import Recorder

    (tmp_path / writer).mkdir()
    rec = Recorder(Options(path=str(tmp_path / writer / "s.trace"), writer=writer),
                   SGLangAdapter("0.5.23", log=lambda m: None))
    rec.open({"hidden_size": 8}, [], side={"hidden_size": 8, "num_aux": 3, "topk": 1})
    rec.cur = owner = SimpleNamespace(rids=[])
    x = torch.randn(4, 8)
    want = x.clone()
    c = rec.snap(x)
    assert torch.equal(rec.snap(x, dtype=torch.int64), want.to(torch.int64))
    x.add_(1)
    assert torch.equal(c, want)
    in_ring = writer == "process" and rec.writer.ring.staging_for(owner)
    assert in_ring == (writer == "process" and not torch.cuda.is_available())
    rec.cur = None
    rec.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU hot path (a GPU reduces on the device)")
@pytest.mark.parametrize("capture", ["default", "full"])
def test_cpu_draft_logits_are_copied_on_the_serving_thread_and_reduced_by_the_writer(tmp_path, capture):
    """On a CPU server torch's small reductions ran on its intra-op threads (logsumexp of [4, 1024]:
    0.5-2 ms on the 2-core server): the hot path only copies the logits into the ring, and the
    writer computes exactly what the hot path used to (top-k values/ids, float logsumexp, the spec
    top-k ids taken with k = topk, the full logits with capture full)."""
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.attribution import IterCapture, reduce_staged
    from specdiff.tracer.engines.sglang.hooks import Recorder

    rec = Recorder(Options(path=str(tmp_path / "s.trace"), capture=capture, logits_topk=4),
                   SGLangAdapter("0.5.23", log=lambda m: None))
    rec.open({"hidden_size": 8}, [], side={"hidden_size": 8, "num_aux": 3, "topk": 2})
    rec.topk = 2
    rec.cur = cap = IterCapture(iter=0, kind="decode", rids=[])
    logits = torch.randn(3, 64)
    logits[:, 5] = logits[:, 9] = 10.0  # a tie: the spec top-k ids depend on k (test_rows tie test)
    fb = SimpleNamespace(input_ids=torch.arange(3), positions=torch.arange(3), forward_mode=None)
    lo = SimpleNamespace(hidden_states=torch.randn(3, 8), next_token_logits=logits)
    df = rec.capture_draft_forward("decode", fb, lo)
    assert df.lt_values is None and df.lse is None and df.topk_ids is None and df.logits is None
    assert torch.equal(df.raw_logits, logits) and rec.writer.ring.staging_for(cap)  # copied into the ring
    cap.draft.append(df)
    reduce_staged(cap)
    vals, ids = torch.topk(logits, 4, dim=-1)
    assert torch.equal(df.lt_values, vals) and torch.equal(df.lt_ids, ids) and df.raw_logits is None
    assert torch.equal(df.lse, torch.logsumexp(logits, dim=-1))
    assert torch.equal(df.topk_ids, torch.topk(logits, 2, dim=-1).indices)
    assert (df.logits is not None and torch.equal(df.logits, logits)) == (capture == "full")
    rec.cur = None
    rec.close()
