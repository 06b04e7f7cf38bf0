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

``ProcessTraceWriter`` (the serving recorders' default, ``SPECDIFF_WRITER=process``) is the lossy
mode with the work moved out of the server's process: ``submit`` only copies the item's tensors
into a shared-memory ring (tracer/shm_ring.py) and the rows are built, encoded and written by a
writer process (tracer/writer_process.py), so the scheduler never waits for the recorder's Python
or its GIL. On CPU the recorder's copies go straight into the record being built (``stage``), so
``submit`` writes only the item's metadata; on a GPU the copy into the ring waits for the item's
CUDA event on a publisher thread, never on the serving thread. Each writer says what it is
(``facts()``: the contract's ``recorder_writer``).

Lossy drops are of whole requests: an item that does not fit drops every request it holds
(``dropped_rids``); the recorders stop capturing those requests and the writer skips their later
rows, so a recorded request is either complete or listed as dropped (``dropped_requests``), and
rows written before the drop stay in the trace.
"""

from __future__ import annotations

import logging
import os
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
        priority read back (``writer_process.priority``; it is the server's)."""
        from specdiff.tracer.writer_process import priority

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


# ---- the writer process -----------------------------------------------------------------------
class ProcessTraceWriter:
    """A lossy trace writer whose ``TraceWriter`` lives in a separate process (module doc).

    Args:
        path: the new trace (made by the writer process; an existing path is an error).
        contract: contract facts to open it with.
        handler: ``"module:function"`` of the attribution, ``handler(side, tw, item)``, where
            ``side`` is a ``specdiff.tracer.engines.requests.WriterSide`` built from ``side``.
        side: keyword arguments of that ``WriterSide`` (hidden_size, num_aux, topk).
        first: ``(name, tensor, seq, pos)`` appends made right after the trace is opened.
        ring_mb: the ring's size, the bound on host memory for captures in flight (capped at half
            the free space of /dev/shm).
        start_timeout_s: how long the writer process may take to open the trace.

    Raises:
        TraceError: the writer process could not open the trace (its error line), or did not
            start in time.
        OSError: no shared-memory ring could be made.
    """

    ALIVE_POLL_S = 0.5

    def __init__(self, path: str, *, contract: dict, handler: str, side: dict, first=(),
                 ring_mb: int = 256, start_timeout_s: float = 180.0):
        import pickle
        import subprocess
        import sys

        from specdiff.tracer.errors import TraceError
        from specdiff.tracer.shm_ring import Ring, ring_dir

        self.path = path
        self.lossless = False
        self.dropped = 0
        self.dropped_rids: set[str] = set()
        self._notices: list[str] = []
        self._controls: list = []  # contract updates that did not fit yet: never dropped
        self._closed = False
        self._final: tuple | None = None  # (failed, written, busy_s) once the ring is unmapped
        self._publisher = None
        self._alive, self._alive_until = True, 0.0  # ``active``'s last poll of the process
        import torch

        # CPU only: with a CUDA device captures come through pinned memory and the publisher thread
        self._stage_ok = not torch.cuda.is_available()
        rdir = ring_dir()
        st = os.statvfs(rdir)
        size = min(int(ring_mb) << 20, st.f_bavail * st.f_frsize // 2)
        if size < (1 << 20):
            raise OSError(f"{rdir}: {st.f_bavail * st.f_frsize >> 20} MiB free, too little for the recorder's ring")
        ring_path = os.path.join(rdir, f"specdiff-ring-{os.getpid()}-{id(self):x}")
        self.ring = Ring(ring_path, size, create=True)
        # Its own session: a signal to the server's process group (SIGTERM to stop, even SIGKILL)
        # leaves the writer to finish what the ring holds; it exits when the server is gone.
        rfd, self._wake_fd = os.pipe()
        os.set_blocking(self._wake_fd, False)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "specdiff.tracer.writer_process"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(rfd,),
                                         close_fds=True, start_new_session=True)
        finally:
            os.close(rfd)
        spec = {"ring": ring_path, "wake_fd": rfd, "trace": path, "contract": contract, "handler": handler,
                "side": side, "first": list(first), "parent": os.getpid()}
        self.proc.stdin.write(pickle.dumps(spec, protocol=5))
        self.proc.stdin.close()
        line = self._reply(start_timeout_s)
        if line.split(" ", 1)[0] != "ready":
            self._abandon()
            raise TraceError(line[len("error "):] if line.startswith("error ") else
                             f"{path}: the trace writer process did not start ({line or 'no answer'})")
        import json

        #: the writer process's priority as it read it back (writer_process.priority, nice_why)
        self.priority = json.loads(line[len("ready "):] or "{}")

    def _reply(self, timeout_s: float | None) -> str:
        import select

        r, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not r:
            return ""
        return self.proc.stdout.readline().decode("utf-8", "replace").strip()

    def _abandon(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        try:
            os.unlink(self.ring.path)
        except FileNotFoundError:
            pass
        self._teardown()

    def _teardown(self) -> None:
        """Close the wake-up pipe and unmap the ring, keeping its last counts (``_final``)."""
        os.close(self._wake_fd)
        self._final = (self.ring.failed, self.ring.written, self.ring.busy_s)
        self.ring.close()

    def _wake(self) -> None:
        """Tell the writer process the ring holds more (never blocks: a full pipe is awake enough)."""
        try:
            os.write(self._wake_fd, b"\0")
        except BlockingIOError:
            pass

    # -- state --
    @property
    def active(self) -> bool:
        """Open, the writer process alive and not failed. Every hook asks: the process is polled (a
        syscall) at most every ``ALIVE_POLL_S``; a dead writer's ring fills up and drops meanwhile."""
        if self._closed or self.ring.failed:
            return False
        now = time.monotonic()
        if now >= self._alive_until:
            self._alive = self.proc.poll() is None
            self._alive_until = now + self.ALIVE_POLL_S
        return self._alive

    def facts(self) -> dict:
        """Which writer runs (the contract's ``recorder_writer``), read off this object: its ring's
        size and the priority the writer process read back after lowering it (``nice``,
        ``autogroup_nice``: None where unreadable; ``nice_why``: why it is not
        ``writer_process.NICE``, None when it was set)."""
        return {"kind": "process", "ring_bytes": int(self.ring.size), "why": None,
                "nice": self.priority.get("nice"), "autogroup_nice": self.priority.get("autogroup_nice"),
                "nice_why": self.priority.get("nice_why")}

    # read from the ring while it is mapped, from its last header after close (a second close, e.g.
    # SIGTERM's then atexit's, still asks for them)
    @property
    def failed(self) -> bool:
        return self._final[0] if self._final else self.ring.failed

    @property
    def written(self) -> int:
        return self._final[1] if self._final else self.ring.written

    @property
    def busy_s(self) -> float:
        return self._final[2] if self._final else self.ring.busy_s

    # -- producer (serving thread) --
    def submit(self, item) -> bool:
        """Copy ``item`` into the ring (never blocks); False, with the item's requests dropped,
        when it does not fit or the writer is inactive. An item with a pending CUDA event
        (``item.event``) is copied by a publisher thread once the event completes."""
        if not self.active:
            return False
        if self._publisher is not None or getattr(item, "event", None) is not None:
            # once a publisher runs, everything goes through it: one producer, items in order
            self._publish_later(item)
            return True
        return self._put(item)

    def stage(self, t, owner, dtype):
        """A copy of CPU tensor ``t`` as ``dtype``, inside the ring record being built for capture
        ``owner`` (so ``submit(owner)`` copies nothing again), or None when the ring has no room for
        it there, or a CUDA device is present (captures then travel through pinned memory and the
        publisher thread; the ring has one producer). Serving thread only."""
        if not self._stage_ok or self._publisher is not None or self._closed:
            return None
        n = t.numel() * dtype.itemsize
        out = self.ring.stage(n, owner, dtype, t.shape) if n else None
        if out is None:
            return None
        out.copy_(t)
        return out

    def _put(self, item) -> bool:
        if not hasattr(item, "rids"):  # a contract update: kept in order, never dropped
            self._controls.append(item)
            self._flush()
            self._wake()
            return True
        mine = self.ring.staging_for(item)
        if not mine:
            # another capture's staging (its iteration was never submitted) is given up; earlier
            # updates go first (while an item is staged they follow it)
            self.ring.abandon_stage()
            self._flush()
        if (self._controls and not mine) or not self.ring.put(("item", item, self._notices), owner=item):
            self.dropped += 1
            new = [r for r in item.rids if r not in self.dropped_rids]
            self.dropped_rids.update(new)
            self._notices = self._notices + new
            return False
        self._notices = []
        self._flush()
        self._wake()
        return True

    def _flush(self) -> None:
        """Put the contract updates waiting for room, in order (not over a staged item's bytes)."""
        while self._controls and not self.ring.staging and self.ring.put(("item", self._controls[0], self._notices)):
            self._controls.pop(0)
            self._notices = []

    def _publish_later(self, item) -> None:
        # CUDA only: the copies into pinned memory were queued with non_blocking=True; waiting for
        # them (event.synchronize releases the GIL) happens here, off the scheduler's thread.
        if self._publisher is None:
            self._pending: queue.SimpleQueue = queue.SimpleQueue()
            self._publisher = threading.Thread(target=self._publish_loop, name="specdiff-trace-publisher",
                                               daemon=True)
            self._publisher.start()
        self._pending.put(item)

    def _publish_loop(self) -> None:
        while True:
            item = self._pending.get()
            if item is _STOP:
                return
            try:
                if getattr(item, "event", None) is not None:
                    item.wait()
                    item.event = None
                self._put(item)
            except Exception as exc:  # noqa: BLE001 - a lost item must not stop the server
                logger.error("specdiff: publishing a capture failed (%s: %s)", type(exc).__name__, exc)

    # -- close --
    def close(self, *, timeout_s: float | None = 30.0, contract: dict | None = None) -> bool:
        """Hand ``contract`` facts (and ``dropped_records``) to the writer process, let it write
        what the ring holds and close the trace; True when it did. Safe to call more than once
        (later calls return False) and from a signal handler."""
        if self._closed:
            return False
        self._closed = True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._publisher is not None:
            self._pending.put(_STOP)
            self._publisher.join(timeout=timeout_s)
        facts = dict(contract or {}, dropped_records=int(self.dropped))
        self.ring.abandon_stage()  # a capture staged now will not be submitted
        ok = False
        while self.proc.poll() is None:
            self._flush()
            if not self._controls and self.ring.put(("close", facts, self._notices)):
                self._wake()
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                ok = self._reply(left) == "closed"
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.005)
        if not ok:
            logger.error("specdiff: the trace writer process did not close %s within %s s; the trace "
                         "stays readable up to its last journaled record", self.path, timeout_s)
        try:
            self.proc.wait(timeout=5.0)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        self._teardown()
        return ok
