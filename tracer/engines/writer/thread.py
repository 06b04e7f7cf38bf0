"""The background trace writer: a bounded queue drained by one thread into a ``TraceWriter``.

One writer serves both recorders, in one of two modes:

- **lossy** (the SGLang recorder, default): the serving hot path only *submits* captured items
  (tensors already cloned, or copied with ``non_blocking=True`` into pinned host memory, plus a
  CUDA event) and never waits. When the queue is full the item is dropped and counted (the count
  lands in the contract field ``dropped_records``); so is an item that would push the bytes held
  in the queue over ``max_bytes`` (items report their size with ``nbytes()``). An exception in
  the thread disables recording with one log line; the server keeps serving.
- **lossless** (``specdiff record train``): ``submit`` blocks while the queue is full, so
  compression and I/O overlap the next batch's forward and nothing is dropped. An exception in the
  thread stops the appends and is raised in the caller's thread by the next ``submit`` and by
  ``close`` (after the trace is closed with what was written).

Both: the thread waits for an item's event (``item.wait()``) before handling it; ``written``
counts handled items and ``on_written(item)`` (if given) is called in the thread after each, so
progress reports what is on disk.

Lossy drops are of whole requests: an item that does not fit drops every request it holds
(``dropped_rids``); the recorders stop capturing those requests and the writer skips their later
rows, so a recorded request is either complete or listed as dropped (``dropped_requests``), and
rows written before the drop stay in the trace.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("specdiff.tracer")

_STOP = object()


class AsyncTraceWriter:
    """Owns a ``TraceWriter`` and the thread that feeds it.

    Args:
        writer: an open ``specdiff.tracer.store.TraceWriter`` (only the thread touches it until
            ``close``).
        handler: ``handler(writer, item)`` turns one item into appends.
        max_items: queue bound (lossy: further submits are dropped and counted; lossless: they
            wait).
        max_bytes: lossy only: bound on the host memory held by queued items (``item.nbytes()``).
        lossless: block instead of dropping, and raise the thread's error (module doc).
        on_written: called in the writer thread with each item after its appends.
    """

    def __init__(self, writer, handler: Callable[[Any, Any], None], *, max_items: int = 64,
                 max_bytes: int = 2 << 30, lossless: bool = False,
                 on_written: Callable[[Any], None] | None = None):
        self.writer = writer
        self.handler = handler
        self.lossless = bool(lossless)
        self.on_written = on_written
        self.dropped = 0
        self.written = 0
        self.busy_s = 0.0  # wall time the thread spent writing
        self.failed = False
        self.error: BaseException | None = None
        self.max_bytes = int(max_bytes)
        self.queued_bytes = 0
        self.dropped_rids: set[str] = set()
        self.why: str | None = None  # why a serving recorder runs this thread writer (open_writer)
        self._q: queue.Queue = queue.Queue(maxsize=max_items)
        self._closed = False
        # re-entrant: close() may run in a signal handler that interrupted submit() on this thread
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._run, name="specdiff-trace-writer", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not (self.failed or self._closed)

    def facts(self) -> dict:
        """Which writer runs (the contract's ``recorder_writer``), read off this object: the
        thread, why (``why``), its bound on queued bytes (lossy) where a ring would be, and its
        priority read back (``child.priority``; it is the server's)."""
        from specdiff.tracer.engines.writer.child import priority

        return {"kind": "thread", "ring_bytes": None, "queue_bytes": None if self.lossless else self.max_bytes,
                "why": self.why, **priority(self._thread.native_id or 0),
                "nice_why": "a thread of the server's process: the server's priority"}

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, item) -> bool:
        """Queue ``item``. Lossy: never blocks; False (and one more drop counted) if it was
        dropped or the writer is inactive. Lossless: waits for room; True.

        Raises:
            Lossless only: the writer thread's error, or RuntimeError after ``close``.
        """
        if self.lossless:
            self._raise()
            if self._closed:
                raise RuntimeError("submit after close")
            self._q.put((item, 0))
            return True
        if not self.active:
            return False
        size = int(item.nbytes()) if hasattr(item, "nbytes") else 0
        with self._lock:
            if self.queued_bytes + size > self.max_bytes and self.queued_bytes > 0:
                return self._drop(item)
            try:
                self._q.put_nowait((item, size))
            except queue.Full:
                return self._drop(item)
            self.queued_bytes += size
            return True

    def _drop(self, item) -> bool:
        self.dropped += 1
        self.dropped_rids.update(getattr(item, "rids", None) or ())
        return False

    def _run(self) -> None:
        while True:
            entry = self._q.get()
            if entry is _STOP:
                return
            item, size = entry
            try:
                if not self.failed:
                    self._handle(item)
            finally:
                self.queued_bytes -= size  # no lock: see close(); an approximate count is fine

    def _handle(self, item) -> None:
        t0 = time.perf_counter()
        try:
            wait = getattr(item, "wait", None)
            if wait is not None:
                wait()
            self.handler(self.writer, item)
            self.written += 1
            if self.on_written is not None:
                self.on_written(item)
        except BaseException as exc:  # noqa: BLE001 - lossy: disables tracing; lossless: re-raised
            self.failed = True
            self.error = exc
            if not self.lossless:
                logger.error("specdiff: trace writer failed (%s: %s); tracing disabled, the server "
                             "keeps serving; the trace at %s holds what was written before",
                             type(exc).__name__, exc, getattr(self.writer, "path", "?"))
        finally:
            self.busy_s += time.perf_counter() - t0

    def close(self, *, timeout_s: float | None = 30.0, contract: dict | None = None) -> bool:
        """Drain the queue, stop the thread, write ``contract`` facts (lossy: and
        ``dropped_records``) and close the trace.

        Returns True when the trace was closed cleanly. Safe to call more than once (later calls
        return False) and, lossy, from a signal handler (the journal already holds every
        completed append either way). ``timeout_s`` None waits as long as the queue takes.

        Raises:
            Lossless only: the writer thread's error, after the trace was closed with the rows
            written before it.
        """
        if self._closed:
            return False
        self._closed = True
        try:
            self._q.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            logger.error("specdiff: trace writer did not finish within %.0f s; the trace at %s "
                         "stays readable up to its last journaled record", timeout_s,
                         getattr(self.writer, "path", "?"))
            return False
        ok = False
        try:
            facts = {} if self.lossless and self.error is not None else dict(contract or {})
            if not self.lossless:
                facts["dropped_records"] = int(self.dropped)
            if facts:
                self.writer.set_contract(**facts)
            self.writer.close()
            ok = True
        except Exception as exc:  # noqa: BLE001
            if self.lossless and self.error is None:
                raise
            logger.error("specdiff: closing the trace failed (%s: %s)", type(exc).__name__, exc)
        if self.lossless:
            self._raise()
        return ok
