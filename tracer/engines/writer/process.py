"""The server's side of the trace writer process.

``ProcessTraceWriter`` (the serving recorders' default, ``SPECDIFF_WRITER=process``) is the lossy
mode with the work moved out of the server's process: ``submit`` only copies the item's tensors
into a shared-memory ring (``ring``) and the rows are built, encoded and written by a
writer process (``child``), so the scheduler never waits for the recorder's Python
or its GIL. On CPU the recorder's copies go straight into the record being built (``stage``), so
``submit`` writes only the item's metadata; on a GPU the copy into the ring waits for the item's
CUDA event on a publisher thread, never on the serving thread. Each writer says what it is
(``facts()``: the contract's ``recorder_writer``).

It is lossy as the thread writer is (``thread``): drops are of whole requests.

The writer process is no child of the server's (``child.detach``: an engine's stop that SIGKILLs
its process tree must not kill it while it writes what the ring holds); this side knows it by its
pid (``writer_pid``), waits for it through a pidfd (Linux >= 5.3; else by signal 0 to the pid) and
reads its answers on its stdout pipe. ``close`` hands it the close through a pipe of its own
(``child.send_close``), so a full ring never keeps a stop from closing the trace.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time

from specdiff.tracer.engines.writer.alive import WRITER_MODULE, pidfd

logger = logging.getLogger("specdiff.tracer")

_STOP = object()


class ProcessTraceWriter:
    """A lossy trace writer whose ``TraceWriter`` lives in a separate process (module doc).

    Args:
        path: the new trace (made by the writer process; an existing path is an error).
        contract: contract facts to open it with.
        handler: ``"module:function"`` of the attribution, ``handler(side, tw, item)``, where
            ``side`` is a ``specdiff.tracer.engines.writer.child.WriterSide`` built from ``side``.
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

        from specdiff.tracer.engines.writer.ring import Ring, ring_dir
        from specdiff.tracer.errors import TraceError

        self.path = path
        self.lossless = False
        self.dropped = 0
        self.dropped_rids: set[str] = set()
        #: rid -> why, of the requests the recorder records (set by ``ServingRecorder.open``); None: every rid
        self.recorded: dict | None = None
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
        # Its own session, and (child.detach) out of the server's process tree: neither a signal to
        # the server's process group nor the engine's kill of its descendants reaches it.
        rfd, self._wake_fd = os.pipe()
        os.set_blocking(self._wake_fd, False)
        cfd, self._close_fd = os.pipe()
        os.set_blocking(self._close_fd, False)
        self.writer_pid: int | None = None  # the writer process (the one Popen started exits at once)
        self._pidfd: int | None = None
        try:
            # the trace's path on its command line names it to the stop's watchers (alive.writer_pids)
            self.proc = subprocess.Popen([sys.executable, "-m", WRITER_MODULE, os.path.abspath(path)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(rfd, cfd),
                                         close_fds=True, start_new_session=True)
        finally:
            os.close(rfd)
            os.close(cfd)
        spec = {"ring": ring_path, "wake_fd": rfd, "close_fd": cfd, "trace": path, "contract": contract,
                "handler": handler, "side": side, "first": list(first), "parent": os.getpid()}
        self.proc.stdin.write(pickle.dumps(spec, protocol=5))
        self.proc.stdin.close()
        line = self._reply(start_timeout_s)
        if line.split(" ", 1)[0] != "ready":
            self._abandon()
            raise TraceError(line[len("error "):] if line.startswith("error ") else
                             f"{path}: the trace writer process did not start ({line or 'no answer'})")
        import json

        #: the writer process's priority as it read it back (child.priority, nice_why)
        self.priority = json.loads(line[len("ready "):] or "{}")
        self.writer_pid = self.priority.pop("pid", None)
        self._pidfd = pidfd(self.writer_pid)
        self.proc.wait()  # the first process, which exited once the writer forked (child.detach)

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
        # the writer, where it forked before it failed or gave no answer: it reads EOF on its pipes
        # at teardown and exits (its answer, if any, named its pid)
        try:
            os.unlink(self.ring.path)
        except FileNotFoundError:
            pass
        self._teardown()

    def _teardown(self) -> None:
        """Close the pipes and unmap the ring, keeping its last counts (``_final``)."""
        os.close(self._wake_fd)
        os.close(self._close_fd)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
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
            self._alive = self.writer_alive()
            self._alive_until = now + self.ALIVE_POLL_S
        return self._alive

    def writer_alive(self) -> bool:
        """The writer process still runs (its pidfd not readable; without one, signal 0 reaches it)."""
        if self._pidfd is not None:
            return not select.select([self._pidfd], [], [], 0)[0]
        if self.writer_pid is None:
            return self.proc.poll() is None
        try:
            os.kill(self.writer_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def wait_writer(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the writer process to exit; True when it did."""
        if self._pidfd is not None:
            return bool(select.select([self._pidfd], [], [], timeout_s)[0])
        end = time.monotonic() + timeout_s
        while self.writer_alive() and time.monotonic() < end:
            time.sleep(0.01)
        return not self.writer_alive()

    def facts(self) -> dict:
        """Which writer runs (the contract's ``recorder_writer``), read off this object: its ring's
        size and the priority the writer process read back after lowering it (``nice``,
        ``autogroup_nice``: None where unreadable; ``nice_why``: why it is not
        ``child.NICE``, None when it was set)."""
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
            # the writer process lists what it is told (its journal's dropped_requests, the last word of a
            # trace whose server was killed): only the requests the recorder records (requests.sampling_facts)
            self._notices = self._notices + [r for r in new if self.recorded is None or r in self.recorded]
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
        """Hand ``contract`` facts (and ``dropped_records``) to the writer process, which writes what
        the ring holds and closes the trace; True when it said so within ``timeout_s``. Safe to call
        more than once (later calls return False) and from a signal handler.

        Where it did not answer in time the writer goes on after this process is gone (it is out of
        the server's process tree: module doc) and closes the trace once it has written the ring;
        ``record serve`` waits for that (tracer/engines/writer/alive.py)."""
        if self._closed:
            return False
        self._closed = True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._publisher is not None:
            self._pending.put(_STOP)
            self._publisher.join(timeout=timeout_s)
        facts = dict(contract or {}, dropped_records=int(self.dropped))
        self.ring.abandon_stage()  # a capture staged now will not be submitted
        self._flush()
        # the updates that never fitted go with the close, after every item in the ring
        from specdiff.tracer.engines.writer.child import send_close

        sent = self.writer_alive() and send_close(self._close_fd, ("close", facts, self._notices, self._controls),
                                                  deadline)
        ok = False
        if sent:
            self._wake()
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ok = self._reply(left) == "closed"
            if ok:
                self.wait_writer(5.0)
            else:
                logger.warning("specdiff: the trace writer process (pid %s) had not closed %s within %s s; it "
                             "goes on writing what it was handed and closes the trace on its own",
                             self.writer_pid, self.path, timeout_s)
        else:
            logger.error("specdiff: the trace writer process (pid %s) is gone or took no close; %s stays "
                         "readable up to its last journaled record", self.writer_pid, self.path)
        self._teardown()
        return ok
