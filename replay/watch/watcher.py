"""The watch loop: finished served requests -> training replay -> per-request diff -> events.

``Watcher.step`` polls the serving trace (``follow.FinishedRequests``); the requests that finished
since, and are not in the watch state yet, are replayed together on the training side
(``TrainSide.batches``, the forward ``record train`` runs) into this run's training trace (a
segment of the watch folder, ``state``), flushed, and diffed one by one: the training trace and
the serving trace, each restricted to that request's sequence, go through ``diff_opened`` (align,
compare, first divergence, explanation, acceptance) exactly as ``specdiff diff`` would diff a pair
holding only that request (``tracer.store.selection``): each side reads only that request's rows,
which the followers index as they decode the journals and forget once the request is done. Each
request gives a ``request`` event with its acceptance and the rolling acceptance; the first
request whose diff proves a divergence of a given (tensor, cause) also gives an ``alert`` event,
with the slice of both traces that shows it when an ``export`` callback is given (``specdiff
watch`` passes the app's minimal-repro export, tui/export.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.replay.diff.types import Pair
from specdiff.replay.record.sequences import TrainSequence
from specdiff.replay.watch.follow import FinishedRequests, ServedRequest
from specdiff.replay.watch.rolling import SIDES, RollingAcceptance, acceptance_record
from specdiff.replay.watch.state import WatchState
from specdiff.tracer.errors import TraceError
from specdiff.tracer.store import TraceFollower
from specdiff.tracer.store.selection import select_sequences


@dataclass
class WatchEvent:
    """One thing the watch reports: ``kind`` is ``start``, ``request``, ``skipped`` (a request not
    replayed, ``why``), ``alert`` or ``end``;
    ``data`` is JSON-safe (``data["event"] == kind``)."""

    kind: str
    data: dict = field(default_factory=dict)


def diff_request(train, serve, train_seq: int, serve_seq: int, *, preset: str = "default"):
    """``DiffReport`` of one request: ``train`` and ``serve`` (opened traces) each seen as if it held
    only the given sequence (``tracer.store.selection.select_sequences``: that sequence's rows and
    the trace-wide ones, read from the chunks that hold them), diffed as ``specdiff diff`` does
    without narrowing (which re-runs the draft). Traces polled by a ``TraceFollower`` know which
    rows each sequence holds, so the diff costs the request's rows, not the traces'.

    Raises:
        AlignmentError: the two sequences share no tokens (not the same request).
        DifferentTargetsError: the traces were recorded on different targets.
        KeyError: a sequence the trace does not list (or its follower forgot).
    """
    from specdiff.replay.diff.pipeline import diff_opened

    return diff_opened(Pair(select_sequences(train, [train_seq]), select_sequences(serve, [serve_seq])),
                       preset=preset, narrow=False)


class Watcher:
    """Watch one serving trace (see the module docstring).

    Args:
        serve: the serving trace a live traced server writes (``SPECDIFF_TRACE``).
        out: the watch folder (state and training traces).
        load_side: builds the ``TrainSide`` from the serving trace's contract (called once, at the
            first request to replay: steps / topk default to what serving used).
        on_event: receives every ``WatchEvent`` as it happens.
        settle_s: ``FinishedRequests.settle_s``.
        window: requests in the rolling acceptance.
        preset: the diff's tolerance preset.
        export: ``export(report, request) -> path or None``: the slice of both traces behind an
            alert (None: no slice).

    Raises:
        WatchStateError: ``out`` holds another watch's state.
    """

    def __init__(self, serve: str, out: str | Path, *, load_side: Callable, on_event: Callable[[WatchEvent], None],
                 settle_s: float = 5.0, window: int = 32, preset: str = "default",
                 export: Callable | None = None):
        self.state = WatchState(out, serve)
        self.follow = FinishedRequests(serve, settle_s=settle_s)
        self.load_side, self.on_event, self.preset, self.export = load_side, on_event, preset, export
        self.rolling = RollingAcceptance(window)
        for rec in self.state.requests.values():  # the window goes on from where the last run left it
            for side in SIDES:
                if rec.get("acceptance", {}).get(side):
                    self.rolling.add(side, rec["acceptance"][side])
        self.side = None
        self.writer = None
        self.segment: Path | None = None
        self._segment_trace: TraceFollower | None = None
        self.replayed = 0  # requests replayed by this run
        self.diverged = 0  # of them, how many diverged
        self.alerts: list[dict] = []
        self._alerted: set[tuple] = set()
        self._skipped_resumed: set[str] = set()

    # ---- one poll -------------------------------------------------------------------------------
    def step(self) -> bool:
        """Poll once; replay and diff every request that finished since. Returns True when the
        serving trace is closed and every request in it is done (nothing more will come)."""
        trace, finished = self.follow.poll()
        todo = []
        for req in finished:
            if self.state.done(req.key):
                self._skipped_resumed.add(req.key)
                self.follow.forget(req.seq_id)
            elif len(req.tokens) < 2 or req.dropped:
                why = ("dropped by the recorder (its writer fell behind): rows missing" if req.dropped
                       else "fewer than 2 tokens: no draft row")
                self.state.mark(req.key, {"seq": req.seq_id, "rid": req.rid, "skipped": why})
                self.follow.forget(req.seq_id)
                self.on_event(WatchEvent("skipped", {"event": "skipped", "key": req.key, "seq": req.seq_id,
                                                     "why": why}))
            else:
                todo.append(req)
        if todo:
            self._replay(trace, todo)
        return bool(trace.closed) and self.follow.pending() == 0

    def _replay(self, serve_trace, reqs: list[ServedRequest]) -> None:
        if self.side is None:
            self.side = self.load_side(dict(serve_trace.contract))
        seqs = [TrainSequence(r.tokens, r.prompt_len, r.rid, r.seq_id) for r in reqs]
        if self.writer is None:
            self.segment = self.state.new_segment()
            self._segment_trace = TraceFollower(str(self.segment))
            facts, _ = self.side.contract(seqs, out=str(self.segment), replay=self.follow.path)
            self.writer, ids = self.side.open_trace(str(self.segment), seqs, facts)
        else:
            ids = self.side.add_sequences(self.writer, seqs)
        t0 = time.perf_counter()  # the replay itself: loading the models and opening the trace are once a run
        for _, rows in self.side.batches(seqs, ids):
            rows.flush(self.writer)
        self.writer.flush()  # every row in the journal before the state says "replayed"
        train = self._segment_trace.poll()
        replay_s = (time.perf_counter() - t0) / len(reqs)
        for req, sid in zip(reqs, ids, strict=True):
            self._diff_one(train, serve_trace, req, sid, replay_s)
            # diffed: no later selection reads these rows, so the row indexes need not keep them
            self.follow.forget(req.seq_id)
            self._segment_trace.forget([sid])

    def _diff_one(self, train, serve_trace, req: ServedRequest, train_seq: int, replay_s: float) -> None:
        t0 = time.perf_counter()
        report = diff_request(train, serve_trace, train_seq, req.seq_id, preset=self.preset)
        acc = {"train": acceptance_record(report.acceptance.x), "serve": acceptance_record(report.acceptance.y)}
        for side in SIDES:
            self.rolling.add(side, acc[side])
        first = report.first
        cause = report.explanations[0].cause if report.explanations else None
        where = (first.first_where or first.worst or {}) if first is not None else {}
        self.replayed += 1
        diverged = bool(report.diverged)
        self.diverged += diverged
        record = {"seq": req.seq_id, "rid": req.rid, "reason": req.reason, "tokens": int(len(req.tokens)),
                  "prompt_len": req.prompt_len, "segment": self.state.segments.index(self.segment.name),
                  "diverged": diverged, "first": None if first is None else first.name, "cause": cause,
                  "verdict": report.verdict(), "acceptance": acc,
                  "seconds": {"replay": round(replay_s, 3), "diff": round(time.perf_counter() - t0, 3)}}
        self.state.mark(req.key, record)
        self.on_event(WatchEvent("request", {"event": "request", "key": req.key, **record,
                                             "rolling": self.rolling_summary()}))
        if not diverged or (first.name if first else None, cause) in self._alerted:
            return
        self._alerted.add((first.name if first else None, cause))
        slice_dir = self.export(report, req) if self.export is not None else None
        alert = {"event": "alert", "key": req.key, "rid": req.rid, "seq": req.seq_id,
                 "tensor": None if first is None else first.name,
                 "pos": where.get("pos"), "depth": where.get("depth"), "cause": cause,
                 "message": report.explanations[0].message if report.explanations else None,
                 "verdict": report.verdict(), "first_divergence": report.to_json()["first_divergence"],
                 "train_trace": str(self.segment), "serve_trace": self.follow.path,
                 "slice": None if slice_dir is None else str(slice_dir), "request_index": len(self.state.requests)}
        self.alerts.append(alert)
        self.on_event(WatchEvent("alert", alert))

    def rolling_summary(self) -> dict:
        return {side: self.rolling.summary(side) for side in SIDES}

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, *, once: bool = False, poll_s: float = 1.0, stop: threading.Event | None = None) -> int:
        """Watch until the serving trace is closed and done, ``stop`` is set, or (``once``) the
        requests finished now are done; returns how many requests of this run diverged.

        ``once``: poll every ``poll_s`` until no request is pending, for at most ``follow.wait_s``
        (a request must be seen unchanged for ``settle_s`` to count as finished, ``follow``), then stop.

        Raises:
            TraceError: the serving trace cannot be opened (``once``: also when it does not exist
                yet; otherwise the watch waits for a local trace to appear).
        """
        stop = stop or threading.Event()
        self.on_event(WatchEvent("start", {"event": "start", "serve": self.follow.path, "out": str(self.state.out),
                                          "resumed": self.state.resumed, "rolling": self.rolling_summary()}))
        try:
            if once:
                deadline = time.monotonic() + self.follow.wait_s
                while not self.step() and self.follow.pending() and time.monotonic() < deadline:
                    stop.wait(min(poll_s, max(deadline - time.monotonic(), 0.0)))
                    if stop.is_set():
                        break
            else:
                failures: list = []
                while not stop.is_set():
                    if self._live_step(failures):
                        break
                    stop.wait(poll_s)
        finally:
            self.close()
        self.on_event(WatchEvent("end", {"event": "end", "replayed": self.replayed, "diverged": self.diverged,
                                        "already_done": len(self._skipped_resumed), "alerts": len(self.alerts),
                                        "rolling": self.rolling_summary()}))
        return self.diverged

    def _live_step(self, failures: list) -> bool:
        """``step`` for the live loop: waits for a local trace that does not exist yet, and retries
        a trace that cannot be opened for a few polls (a server opening it writes the group, then
        its journal header) before giving up."""
        path = self.follow.path
        if "://" not in path and not os.path.exists(path):
            return False
        try:
            done = self.step()
        except TraceError:
            failures.append(1)
            if len(failures) >= 3:
                raise
            return False
        failures.clear()
        return done

    def close(self) -> None:
        """Close this run's training trace (it stays readable unclosed if this never runs)."""
        if self.writer is not None:
            try:
                self.writer.set_contract(**self.side.accept_facts())
            except TraceError:
                pass
            self.writer.close()
            self.writer = None
