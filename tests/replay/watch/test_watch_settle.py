"""When a watched request counts as finished: on the writer's clock when the serving trace says
how far its writer process has got (``recorder_caught_up_at``), else on the watcher's.

The failing input (found with a real server on a loaded machine): the writer process, at nice 19,
ran 45 s behind 34 iterations; the prefill's sequence entry (prompt + first token) was journaled,
its target rows were not yet, the tokens stayed unchanged for longer than ``--settle 2`` of the
watcher's time, and the watch replayed the request: "serving fed 0 aux slots", a false alert.
"""

from __future__ import annotations

import time

import numpy as np

from specdiff.replay.watch.follow import FinishedRequests
from specdiff.tracer.store import TraceWriter, open_trace


class Clock:
    """The watcher's monotonic clock, moved by hand."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _serving(tmp_path):
    tw = TraceWriter(str(tmp_path / "s.trace"), side="serve", contract={})
    tw.add_sequence(np.array([5, 6, 7, 8]), prompt_len=3, rid="r0")  # prompt + the first token
    return tw


def test_a_request_waits_while_the_writer_is_behind_whatever_the_watchers_clock_says(tmp_path):
    tw, c = _serving(tmp_path), Clock()
    tw.journal_progress(100.0)  # the writer's last mark before the watcher saw the request
    follow = FinishedRequests(tw.path, settle_s=2.0, clock=c)
    assert follow.poll()[1] == []
    c.t += 30.0  # 30 s of the watcher's time and no mark: the writer is stuck (the old rule finished it here)
    assert follow.poll()[1] == [] and follow.pending() == 1
    tw.journal_progress(101.0)  # written after the tokens were: the anchor, on the writer's clock
    assert follow.poll()[1] == []
    tw.journal_progress(102.9)  # 1.9 s past the anchor
    c.t += 30.0
    assert follow.poll()[1] == []
    tw.add_sequence(np.array([5, 6, 7, 8, 9]), prompt_len=3, rid="r0", seq_id=0)  # the lagging rows land
    assert follow.poll()[1] == []
    tw.journal_progress(103.5)  # the new anchor
    assert follow.poll()[1] == []
    tw.journal_progress(105.5)  # settle_s past it, the tokens unchanged: finished, whole
    (req,) = follow.poll()[1]
    assert req.rid == "r0" and req.tokens.tolist() == [5, 6, 7, 8, 9]
    assert follow.pending() == 0
    tw.close()


def test_without_a_writer_mark_or_once_the_writer_is_done_the_watchers_clock_counts(tmp_path):
    for done in (False, True):
        tw, c = _serving(tmp_path / str(done)), Clock()
        if done:
            tw.journal_progress(90.0)
            tw.journal_progress(None)  # the server is gone and the writer wrote all it had
        follow = FinishedRequests(tw.path, settle_s=2.0, clock=c)
        assert follow.poll()[1] == []
        c.t += 1.9
        assert follow.poll()[1] == []
        c.t += 0.1
        assert [r.rid for r in follow.poll()[1]] == ["r0"], done
        tw.close()


def test_the_mark_is_a_fact_of_the_unclosed_trace_only(tmp_path):
    tw = _serving(tmp_path)
    tw.journal_progress(123.25)
    assert open_trace(tw.path).contract["recorder_caught_up_at"] == 123.25
    tw.close()
    t = open_trace(tw.path)
    assert t.closed and "recorder_caught_up_at" not in t.contract
    from specdiff.tracer.store.journal import read_journal

    kinds = [e.get("t") for e in read_journal(f"{tw.path}/journal.msgpack").entries]
    assert "close" in kinds and "progress" not in kinds  # compacted away at close


def test_the_writer_process_marks_when_it_has_caught_up(tmp_path):
    """A real writer process, idle after start: it journals a mark about once a second, a moment
    before which it had written all it was handed; at close the trace no longer lists it."""
    from specdiff.tracer.engines.writer.process import ProcessTraceWriter

    t0 = time.time()
    w = ProcessTraceWriter(str(tmp_path / "t.trace"), contract={"hidden_size": 8},
                           handler="specdiff.tracer.engines.sglang.attribution:write_capture",
                           side={"hidden_size": 8, "num_aux": 3, "topk": 1})
    try:
        deadline, marks = time.monotonic() + 30.0, []
        while time.monotonic() < deadline and len(set(marks)) < 2:
            time.sleep(0.3)
            mark = open_trace(str(tmp_path / "t.trace")).contract.get("recorder_caught_up_at")
            if mark is not None:
                marks.append(mark)
        assert len(set(marks)) >= 2, marks  # it keeps marking while idle
        assert t0 - 1e-3 <= marks[0] <= marks[-1] <= time.time()
    finally:
        assert w.close() is True
    assert "recorder_caught_up_at" not in open_trace(str(tmp_path / "t.trace")).contract
