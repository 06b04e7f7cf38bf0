"""Background trace writer for the SGLang recorder: a bounded queue drained by one thread.

The serving hot path only *submits* captured items (tensors already cloned, or copied with
``non_blocking=True`` into pinned host memory, plus a CUDA event). The writer thread waits
for the item's event, then hands it to a ``handler(trace_writer, item)`` that attributes the
rows and appends them to the ``TraceWriter``. When the queue is full the item is dropped and
counted (the count lands in the contract field ``dropped_records``); so is an item that would
push the bytes held in the queue over ``max_bytes`` (items report their size with ``nbytes()``). Any exception in the
writer disables recording with one log line; the server keeps serving.
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
        writer: an open ``specdiff.tracer.store.TraceWriter`` (only the thread touches it).
        handler: ``handler(writer, item)`` turns one captured item into appends.
        max_items: queue bound; further submits are dropped and counted.
        max_bytes: bound on the host memory held by queued items (``item.nbytes()``).
    """

    def __init__(self, writer, handler: Callable[[Any, Any], None], *, max_items: int = 64,
                 max_bytes: int = 2 << 30):
        self.writer = writer
        self.handler = handler
        self.dropped = 0
        self.written = 0
        self.busy_s = 0.0  # wall time the thread spent writing
        self.failed = False
        self.max_bytes = int(max_bytes)
        self.queued_bytes = 0
        self._q: queue.Queue = queue.Queue(maxsize=max_items)
        self._closed = False
        # re-entrant: close() may run in a signal handler that interrupted submit() on this thread
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._run, name="specdiff-trace-writer", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not (self.failed or self._closed)

    def submit(self, item) -> bool:
        """Queue ``item`` without blocking; False (and one more drop counted) if it was dropped."""
        if not self.active:
            return False
        size = int(item.nbytes()) if hasattr(item, "nbytes") else 0
        with self._lock:
            if self.queued_bytes + size > self.max_bytes and self.queued_bytes > 0:
                self.dropped += 1
                return False
            try:
                self._q.put_nowait((item, size))
            except queue.Full:
                self.dropped += 1
                return False
            self.queued_bytes += size
            return True

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
        except Exception as exc:  # noqa: BLE001 - any writer failure disables tracing
            self.failed = True
            logger.error("specdiff: trace writer failed (%s: %s); tracing disabled, the server "
                         "keeps serving; the trace at %s holds what was written before",
                         type(exc).__name__, exc, getattr(self.writer, "path", "?"))
        finally:
            self.busy_s += time.perf_counter() - t0

    def close(self, *, timeout_s: float = 30.0, contract: dict | None = None) -> bool:
        """Drain the queue, stop the thread, record ``dropped_records`` and close the trace.

        Returns True when the trace was closed cleanly. Safe to call more than once and from
        a signal handler (the journal already holds every completed append either way).
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
        try:
            facts = dict(contract or {})
            facts["dropped_records"] = int(self.dropped)
            self.writer.set_contract(**facts)
            self.writer.close()
            return True
        except Exception as exc:  # noqa: BLE001
            logger.error("specdiff: closing the trace failed (%s: %s)", type(exc).__name__, exc)
            return False
