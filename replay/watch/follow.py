"""Which requests of a live serving trace have finished.

A serving recorder (SGLang or vLLM, ``tracer/engines/``) journals a request's sequence entry again
each time it grows (``TraceWriter.add_sequence``, the last entry per seq id wins; the recorders
write a token before the rows that are compared against it, tracer/engines/sglang/attribution.py
``write_capture``), and writes no "finished" entry. So a request counts as finished when its tokens
have not grown for ``settle_s`` seconds and it holds at least one generated token, or when the
trace is closed (the server stopped: nothing grows any more). ``settle_s`` must exceed the longest
pause between two decode steps of a running request (a request the scheduler retracts for memory
and resumes later than that is replayed at the length it had; its later tokens are then not
watched).

"Not grown for ``settle_s``" is counted on the writer's clock when the trace says how far its writer
has got (``recorder_caught_up_at``: the writer process journals, about once a second, a moment before
which it had written every capture handed to it: tracer/engines/writer/child.py). The first mark newer
than the one a poll saw with the request's current tokens was written after those tokens, so it is
no earlier than their growth on the server; the request is finished once a mark ``settle_s`` past
that anchor arrives with the tokens unchanged. Only the writer's clock is used, so a watcher on
another host (an fsspec URL) is not misled by clock skew. A writer that falls behind (nice 19 on a
loaded machine: 45 s behind 34 iterations, seen with a real server) holds requests back instead of
letting the watch replay a request whose rows are not written yet (a false alert: "serving fed 0
aux slots"). Without that fact (the in-process thread writer, a trace of specdiff before it, or a
writer that wrote all it will: the server is gone) the watcher's own clock counts. A writer that
failed, or was killed by SIGKILL to its own session, stops marking: its requests wait for a close
that will not come (the watch's ``pending`` count grows); stop the watch and diff the trace.

A trace that lists why each request was recorded (contract ``sampled_requests``, rid -> reason,
``tracer.engines.requests.sampling_facts``) gives each request its reason; a trace holds only the
requests it recorded either way, so every sequence in it is watched. A request listed in
``dropped_requests`` lost its later rows when the recorder's writer fell behind
(tracer/engines/writer/): it is reported as dropped, not replayed (its missing rows would read as
a difference of the sides).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specdiff.tracer.errors import TraceError
from specdiff.tracer.store import Trace, TraceFollower
from specdiff.tracer.store.journal import PROGRESS_EVERY_S


@dataclass(frozen=True)
class ServedRequest:
    """One finished request of the serving trace.

    Attributes:
        key: the watch's name for it: the rid, else ``seq<id>`` (a trace without rids).
        rid: the engine's request id (None when the trace has none).
        seq_id: its sequence id in the serving trace.
        tokens: int64 [n] prompt + generated tokens as served.
        prompt_len: tokens that came from the prompt.
        reason: why it was recorded (``sampled_requests``), None when the trace does not say.
        dropped: the trace lists it in ``dropped_requests`` (rows missing).
    """

    key: str
    rid: str | None
    seq_id: int
    tokens: np.ndarray
    prompt_len: int
    reason: str | None = None
    dropped: bool = False


def sampled_reasons(contract: dict) -> dict[str, str]:
    """rid -> why it was recorded, from the contract's ``sampled_requests`` (rid -> reason, as both
    recorders write it: tracer/engines/requests.py ``sampling_facts``); {} when absent."""
    listed = contract.get("sampled_requests")
    return {str(k): str(v) for k, v in listed.items()} if isinstance(listed, dict) else {}


class FinishedRequests:
    """Polls a serving trace being written and says which requests finished since the last poll.

    Args:
        path: the serving trace (local path or fsspec URL), as the server's ``SPECDIFF_TRACE``.
        settle_s: seconds a request's tokens must stay unchanged to count as finished.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(self, path: str, *, settle_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.path = str(path)
        self.settle_s = float(settle_s)
        self.clock = clock
        self._trace = TraceFollower(self.path)  # each poll decodes only what the server wrote since
        #: seq id -> [token count, when it last changed (``clock``), the writer's mark then, the
        #: first newer mark (the anchor on the writer's clock; None until seen)]
        self._seen: dict[int, list] = {}
        self._given: set[int] = set()

    @property
    def wait_s(self) -> float:
        """The longest a request seen unchanged can take to count as finished: ``settle_s``, plus two
        of the writer's mark intervals (one for the anchor, one for the mark past it), plus a poll."""
        return self.settle_s + 2 * PROGRESS_EVERY_S + 1.0

    def poll(self) -> tuple[Trace, list[ServedRequest]]:
        """Open the trace as it is now and return it with the requests that finished since the
        last poll (each request once, in sequence-id order).

        Raises:
            TraceError: the path holds no trace, or a training trace.
        """
        trace = self._trace.poll()
        if trace.side != "serve":
            raise TraceError(f"{self.path}: a {trace.side} trace; --serve takes the trace a traced server writes")
        now = self.clock()
        caught = trace.contract.get("recorder_caught_up_at")  # the writer's clock; absent / None: not behind
        reasons = sampled_reasons(trace.contract)
        dropped = {str(r) for r in trace.contract.get("dropped_requests") or []}
        done = []
        for s in sorted(trace.sequences, key=lambda s: s.id):
            sid, n = int(s.id), len(s.tokens)
            if sid in self._given:
                continue
            last = self._seen.get(sid)
            if last is None or last[0] != n:
                self._seen[sid] = last = [n, now, caught, None]
            elif last[3] is None and caught != last[2] and isinstance(caught, (int, float)):
                last[3] = caught  # written after the tokens seen: no earlier than their growth
            if isinstance(caught, (int, float)):
                quiet = -1.0 if last[3] is None else caught - last[3]
            else:
                quiet = now - last[1]
            settled = quiet >= self.settle_s and n > int(s.prompt_len)
            if trace.closed or settled:
                self._given.add(sid)
                rid = None if s.rid is None else str(s.rid)
                done.append(ServedRequest(rid if rid is not None else f"seq{sid}", rid, sid,
                                          np.asarray(s.tokens, np.int64), int(s.prompt_len),
                                          reasons.get(rid) if rid is not None else None, rid in dropped))
        return trace, done

    def forget(self, seq_id: int) -> None:
        """Request ``seq_id`` is done with (diffed or skipped): the follower's row index drops its
        rows (``TraceFollower.forget``), so the watch's memory does not grow with the trace."""
        self._trace.forget([seq_id])

    def pending(self) -> int:
        """Requests seen but not yet finished."""
        return len(set(self._seen) - self._given)
