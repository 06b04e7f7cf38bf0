"""The serving recorders' writer process (``python -m specdiff.tracer.engines.writer.child``): reads
captures from the shared-memory ring (``ring``), attributes them to rows and writes the trace, off
the server's process (``process.ProcessTraceWriter`` starts it). ``WriterSide`` is the recorder's
state as this process holds it.

Protocol: the parent pickles a spec to stdin (ring path, wake-up and close pipe fds, trace path,
contract, handler, ``WriterSide`` arguments, first appends); this process answers ``ready <JSON>``
(its pid, its priority read back: ``priority``, and ``nice_why``) or ``error <message>`` on stdout
once the trace is open, and ``closed`` (or ``error closing``) after it closed the trace. Ring records
are ``("item", item, dropped rids)``. The close comes through a pipe of its own (``send_close``, ``CloseInbox``), never
through the ring: a ring that a lagging writer left full has no room for it, and the close must not
wait for room while the engine's stop runs out of time.

It outlives the server's process tree (``detach``): an engine that stops by SIGKILLing its
descendants (SGLang 0.5.23 ``kill_process_tree``, ``srt/utils/common.py:2507-2564``, called by
its SIGTERM watchdog, ``srt/managers/tokenizer_manager.py:3559``, and at ``launch_server.py:86``)
no longer kills it while it still writes what the server handed it. Once the close arrived it writes everything the ring holds, then the close
(the trace is closed, whether or not the server still runs); when the parent dies without a close
(kill -9: the wake-up pipe reads EOF) it writes what the ring holds and exits without closing the
trace: the trace is what a killed server leaves, journaled up to its last record.

Tests make the writer fall behind with ``SPECDIFF_WRITER_TEST_DELAY_S`` (sleep that long before each
item) or ``SPECDIFF_WRITER_TEST_PAUSE_FILE`` (handle no item while that file exists);
``SPECDIFF_WRITER_NICE`` sets this process's niceness (default ``NICE``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pickle
import re
import select
import signal
import struct
import sys
import time

logger = logging.getLogger("specdiff.tracer")

#: at most this often the journal gets the sampled and dropped requests' lists (a contract entry)
LIST_EVERY_S = 5.0
#: this process's niceness: the server's threads win a contended core, the writer takes what they
#: leave (idle moments between forwards and requests) and catches up there. Measured on the 2-core
#: CPU server (benchmarks/recorder_overhead.py): at the server's priority the writer's CPU came out
#: of the scheduler's intra-op threads (default capture 0.69x untraced with it, 0.80x with it
#: paused); a writer that still falls behind fills the ring, and whole requests are dropped and
#: counted as before (``thread``, ``process``).
NICE = 19
_cpu0 = 0.0


class WriterSide:
    """What the attribution code (``write_capture`` of either engine) reads from a recorder, as the
    writer *process* holds it: the sequence dicts ``sequence_id`` keeps, the shapes the contract
    gave, and which requests are kept (recorded reasons in, dropped requests out).

    Args:
        hidden_size, num_aux, topk: the recorder's contract facts of the same names (None when
            unknown).
    """

    def __init__(self, *, hidden_size=None, num_aux=None, topk: int = 1):
        self.hidden_size = hidden_size
        self.num_aux = num_aux
        self.topk = topk
        self.seq_ids: dict[str, int] = {}
        self.seq_tokens: dict[str, list[int]] = {}
        self.seq_prompt: dict[str, int] = {}
        self.kept: dict[str, str] = {}  # rid -> why it is recorded
        self.dropped: set[str] = set()
        self.changed = False  # kept or dropped grew since ``listing()`` was last taken

    def keep_rid(self, rid: str) -> bool:
        """Whether ``rid``'s rows are written (the writer process's side of ``is_kept``)."""
        return rid in self.kept and rid not in self.dropped

    def absorb(self, item) -> None:
        """Take the recording reasons an item carries (``item.reasons``: rid -> reason)."""
        reasons = getattr(item, "reasons", None)
        if reasons:
            self.kept.update(reasons)
            self.changed = True

    def drop(self, rids) -> None:
        """Requests the serving side dropped (their later rows are skipped)."""
        if rids:
            self.dropped.update(rids)
            self.changed = True

    def listing(self) -> dict:
        """The contract facts ``sampled_requests`` and ``dropped_requests`` as known here."""
        self.changed = False
        from specdiff.tracer.engines.requests import sampling_facts  # after the priority is lowered (main)

        return sampling_facts(self.kept, self.dropped)

    def contract_update(self, facts: dict) -> None:
        """Follow contract facts learned after start-up (the aux layer count)."""
        aux = facts.get("aux_hf_indices")
        if isinstance(aux, list | tuple) and aux:
            self.num_aux = len(aux)



def _say(line: str) -> None:
    """One protocol line to the parent; a parent that already exited (an engine that shuts down
    without waiting for ``closed``) is not an error: the trace is written either way."""
    try:
        sys.stdout.write(line.replace("\n", " ") + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor is the flush at exit


def _lower_priority() -> str | None:
    """Run at ``NICE`` (``SPECDIFF_WRITER_NICE`` overrides it: 0 keeps the server's priority),
    before any thread starts (zarr's I/O threads inherit it). With Linux's autogroup scheduling (on
    by default; on this VM) CPU is shared between sessions first and a task's nice counts only
    inside its session, and this process has a session of its own (``ProcessTraceWriter`` starts it
    so: the server's process-group signals must not reach it): so its session's nice is set too
    (/proc/self/autogroup), else it competes with the whole server as an equal. Either refused
    (another OS): it runs at the server's priority.

    Returns why the priority is not ``NICE`` as asked (the contract's ``recorder_writer``
    ``nice_why``; ``priority`` reads back what it is), or None."""
    nice = int(os.environ.get("SPECDIFF_WRITER_NICE") or NICE)
    if nice <= 0:
        return f"SPECDIFF_WRITER_NICE={nice}: the server's priority"
    why = []
    try:
        os.nice(nice)
    except OSError as exc:
        why.append(f"os.nice refused: {exc}")
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError as exc:
        why.append(f"/proc/self/autogroup refused: {exc}")
    return "; ".join(why) or None


def priority(tid: int = 0) -> dict:
    """The priority a writer runs at, read back (not what was asked): ``nice`` (``os.getpriority``
    of thread/process ``tid``, 0 = this process; Linux keeps a nice per thread) and
    ``autogroup_nice`` (this process's session's nice, /proc/self/autogroup "/autogroup-N nice K";
    None where there is none: no autogroup scheduling, or not Linux). ``nice`` None when it could
    not be read."""
    try:
        nice = os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, AttributeError):
        nice = None
    try:
        with open("/proc/self/autogroup") as f:
            m = re.search(r"\bnice\s+(-?\d+)", f.read())
        group = int(m.group(1)) if m else None
    except OSError:
        group = None
    return {"nice": nice, "autogroup_nice": group}


def detach() -> None:
    """Leave the server's process tree: fork, and the first process (the one the server started,
    already a session of its own) exits at once, so this one's parent becomes init or the nearest
    child subreaper. psutil's ``children()``, which follows parent pids (not sessions or process
    groups), then no longer lists it under the server, so the engine's stop does not SIGKILL it
    (module doc). The server waits for it through its stdout pipe and a pidfd
    (``process.ProcessTraceWriter``), the stop's watchers through its command line (``alive``)."""
    if os.fork():
        os._exit(0)  # the server reaps this one at once (ProcessTraceWriter)


#: the close message's frame: its pickle's length, then the pickle (``send_close``)
_FRAME = struct.Struct("<Q")


def send_close(fd: int, message, deadline: float | None) -> bool:
    """Write ``message`` (``("close", contract facts, dropped rids, contract updates)``) to the close
    pipe ``fd`` (non-blocking) as one frame, until ``deadline`` (``time.monotonic()``); True when all
    of it was written. False when the writer process is gone (the pipe is broken) or time ran out.
    The server's side; ``read_close`` is this process's."""
    data = pickle.dumps(message, protocol=5)
    data = memoryview(_FRAME.pack(len(data)) + data)
    while data:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        except OSError:  # BrokenPipeError: the writer process is gone
            return False
    return True


class CloseInbox:
    """This process's end of the close pipe (non-blocking): ``read()`` takes what arrived;
    ``message`` is the close once all of its frame is in, ``eof`` once the server's end is closed
    (it closed it after the message, or died)."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self.buf = bytearray()
        self.message = None
        self.eof = False

    def read(self) -> None:
        while not self.eof and self.message is None:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            self.buf += chunk
            if len(self.buf) >= _FRAME.size:
                (n,) = _FRAME.unpack_from(self.buf)
                if len(self.buf) >= _FRAME.size + n:
                    self.message = pickle.loads(bytes(self.buf[_FRAME.size:_FRAME.size + n]))


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the server decides when this ends
        signal.signal(sig, signal.SIG_IGN)
    detach()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="specdiff writer: %(message)s")
    nice_why = _lower_priority()
    spec = pickle.loads(sys.stdin.buffer.read())
    from specdiff.tracer.engines.writer.alive import pidfd

    parent = pidfd(spec["parent"])  # alive now: it waits for our answer
    from specdiff.tracer.engines.writer.ring import Ring

    ring = Ring(spec["ring"])
    os.unlink(spec["ring"])  # both sides have it mapped: nothing is left behind whoever dies
    try:
        import torch

        torch.set_num_threads(1)  # the server's cores are the server's
        from specdiff.tracer.store import TraceWriter
        from specdiff.tracer.store.journal import PROGRESS_EVERY_S

        tw = TraceWriter(spec["trace"], side="serve", contract=spec["contract"])
        for name, data, seq, pos in spec["first"]:
            tw.append(name, data, seq=seq, pos=pos)
        mod, fn = spec["handler"].split(":")
        handler = getattr(importlib.import_module(mod), fn)
        side = WriterSide(**spec["side"])
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        _say(f"error {exc}" if type(exc).__name__ == "TraceError" else f"error {type(exc).__name__}: {exc}")
        return 2
    _say("ready " + json.dumps({"pid": os.getpid(), **priority(), "nice_why": nice_why}))
    global _cpu0
    _cpu0 = time.process_time()  # start-up (imports, opening the trace) is not writing
    delay = float(os.environ.get("SPECDIFF_WRITER_TEST_DELAY_S") or 0.0)
    pause = os.environ.get("SPECDIFF_WRITER_TEST_PAUSE_FILE") or None
    wake = spec["wake_fd"]
    inbox = CloseInbox(spec["close_fd"])
    parent_gone = failed = False
    listed = marked = looked_in = 0.0

    def journal(write) -> None:
        """``write()`` a journal-only entry (progress, listing); a store that fails then stops
        tracing, as a failed item does (the server keeps serving)."""
        nonlocal failed
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - the store failed: as a failed item
            failed = True
            ring.mark_failed()
            logger.error("trace writer failed (%s: %s); tracing disabled", type(exc).__name__, exc)

    def mark(at: float | None) -> None:
        nonlocal marked
        marked = time.monotonic()
        journal(lambda: tw.journal_progress(at if at is None else int(at * 1000) / 1000))  # ms, rounded down

    while True:
        looked = time.time()  # before the look: a capture put after it is not covered by a mark
        got = ring.get()
        if got is None:
            inbox.read()  # a close sent after the ring's last item: the ring was empty when it came
            if inbox.message is not None:  # every item put before it is written: close
                _, facts, notices, controls = inbox.message
                side.drop(notices)
                for update in controls if not failed else ():  # contract updates the ring had no room for
                    journal(lambda u=update: (tw.set_contract(**u.facts), side.contract_update(u.facts)))
                ok = _close(tw, side, facts, failed)
                _say("closed" if ok else "error closing")
                return 0 if ok else 1
            if parent_gone:
                if not failed:
                    mark(None)  # all written: a watcher may settle requests by its own clock
                logger.info("the server is gone: %s left unclosed, journaled up to its last record", tw.path)
                return 0
            if not failed and time.monotonic() - marked >= PROGRESS_EVERY_S:
                mark(looked)
            watch = [wake] + ([inbox.fd] if not inbox.eof else []) + ([parent] if parent is not None else [])
            ready, _, _ = select.select(watch, [], [], PROGRESS_EVERY_S)
            if wake in ready and os.read(wake, 1 << 16) == b"":
                parent_gone = True
            if parent is not None and parent in ready:
                parent_gone = True
            continue
        (kind, payload, notices), total = got
        t0 = time.perf_counter_ns()
        side.drop(notices)
        if not failed:
            try:
                if delay:
                    time.sleep(delay)
                while pause is not None and os.path.exists(pause):
                    time.sleep(0.05)
                if hasattr(payload, "rids"):
                    side.absorb(payload)
                    handler(side, tw, payload)
                else:  # a ContractUpdate of either engine
                    tw.set_contract(**payload.facts)
                    side.contract_update(payload.facts)
            except Exception as exc:  # noqa: BLE001 - tracing stops; the server keeps serving
                failed = True
                ring.mark_failed()
                logger.error("trace writer failed (%s: %s); tracing disabled, the server keeps serving; "
                             "the trace at %s holds what was written before", type(exc).__name__, exc, tw.path)
        del payload, got
        if side.changed and not failed and time.monotonic() - listed > LIST_EVERY_S:
            # which requests the trace holds, journaled while serving: a watcher and a killed
            # server's trace see it before the close (which writes the serving side's final list)
            journal(lambda: tw.set_contract(**side.listing()))
            listed = time.monotonic()
        ring.release(total, time.perf_counter_ns() - t0)
        if not failed and time.monotonic() - marked >= PROGRESS_EVERY_S:
            mark(ring.put_at)  # busy too: a writer that is always a record behind still says how far it got
        if time.monotonic() - looked_in >= 0.2:  # busy: take a large close off the pipe, so it is never full
            looked_in = time.monotonic()
            inbox.read()


def _close(tw, side, facts: dict, failed: bool) -> bool:
    try:
        # this process's CPU time, spent off the server's process (benchmarks: CPU seconds per MB)
        tw.set_contract(**facts, recorder_writer_cpu_s=round(time.process_time() - _cpu0, 4))
        tw.close()
        return True
    except Exception as exc:  # noqa: BLE001
        logger.error("closing the trace failed (%s: %s)", type(exc).__name__, exc)
        return False


if __name__ == "__main__":
    sys.exit(main())
