"""Finding and waiting for the trace writer processes of a trace, from outside the server.

The writer process (``child``) leaves the server's process tree at start (``child.detach``), so
that an engine that stops by killing its process tree (SGLang 0.5.23 ``kill_process_tree``,
``srt/utils/common.py:2507-2564``: psutil ``children(recursive=True)``, then SIGKILL each) does not
kill it while it still writes what the server handed it. It is therefore no child of the server: it
is found by its command line, ``python -m specdiff.tracer.engines.writer.child <trace path>``
(``process.ProcessTraceWriter``), read from ``/proc`` (Linux). ``record serve`` and the test
servers (``tracer.engines.server.EngineServer.stop``) wait here for the trace to be written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: the module the writer process runs (its command line's ``-m`` argument)
WRITER_MODULE = "specdiff.tracer.engines.writer.child"


def pidfd(pid: int | None) -> int | None:
    """A pidfd of process ``pid`` (readable once it exits; it need not be our child), or None where
    there is none (no pid, it is gone, Linux < 5.3, another OS)."""
    if pid is None:
        return None
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def writer_pids(trace: str) -> list[int]:
    """Pids of the live writer processes of ``trace``: the process writing it, or one of the
    per-rank stores under it (``<trace>/dp0``...: tracer/engines/sglang/plugin.py), sorted. A
    process that exited but was not yet reaped (a zombie) is not live. Empty where ``/proc`` does
    not exist (not Linux)."""
    root = os.path.abspath(trace)
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for d in names:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if WRITER_MODULE.encode() not in argv:
            continue
        rest = argv[argv.index(WRITER_MODULE.encode()) + 1:]
        path = os.fsdecode(rest[0]) if rest and rest[0] else ""
        if path and (path == root or path.startswith(root + os.sep)) and _live(int(d)):
            out.append(int(d))
    return sorted(out)


def _live(pid: int) -> bool:
    """``pid`` runs (not exited, not a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X", "")


def wait_for_writers(trace: str, *, timeout_s: float, on_wait: Callable[[list[int], float], None] | None = None,
                     every_s: float = 2.0, poll_s: float = 0.1) -> list[int]:
    """Wait until no writer process of ``trace`` that runs now (``writer_pids``) is live, at most
    ``timeout_s`` seconds; ``on_wait(pids, waited_s)`` is called about every ``every_s`` seconds while
    one is (``record serve`` shows the trace's progress there). Each is watched through a pidfd where
    there is one (a pid the system reuses is not mistaken for it), else by ``/proc``. Returns the
    pids still live at the end (empty: every writer is gone)."""
    import select

    t0 = said = time.monotonic()
    fds = {pid: pidfd(pid) for pid in writer_pids(trace)}
    try:
        while True:
            left = [pid for pid, fd in fds.items()
                    if (not select.select([fd], [], [], 0)[0] if fd is not None else _live(pid))]
            now = time.monotonic()
            if not left or now - t0 >= timeout_s:
                return left
            if on_wait is not None and now - said >= every_s:
                said = now
                on_wait(left, now - t0)
            time.sleep(poll_s)
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
