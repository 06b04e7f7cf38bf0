"""An engine's HTTP server as a child process: start it in its own session, wait for ``/health``,
POST JSON to it, stop its whole process group; and the offline part of a CPU server's environment
(``offline_env``). Engine-independent: each engine's launcher
(tracer/engines/sglang/cpu/launch.py ``ServerProcess``, tracer/engines/vllm/cpu.py
``VLLMServerProcess``) subclasses ``EngineServer`` with its command line and its generate call.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import requests

from specdiff.tracer.errors import SpecdiffError


class ServerError(SpecdiffError):
    """An engine server (SGLang, vLLM) did not start, died, or answered with an error."""


#: what a CPU server's environment holds unless the caller set it: no Hugging Face hub traffic (the
#: models are local folders) and no tokenizers thread pool
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def offline_env(env: dict[str, str]) -> dict[str, str]:
    """Add ``OFFLINE_ENV`` to ``env`` where it does not set those keys; returns ``env``."""
    for key, value in OFFLINE_ENV.items():
        env.setdefault(key, value)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail_log(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of the log at ``path`` ('(no log)' when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class EngineServer:
    """An engine server started by specdiff; use a subclass as a context manager.

    ``with ServerProcess(target, draft_model_path=draft) as srv: srv.generate(...)``.
    The process runs in its own session; :meth:`stop` sends SIGTERM to that process group
    (the server and the processes it spawned), then SIGKILL after ``grace_s``, and waits (at most
    ``writer_wait_s``) for the trace writer of ``env``'s ``SPECDIFF_TRACE`` to finish.
    The log (stdout and stderr) goes to ``log_path`` (a temp file by default), and its last
    lines are part of every start-up error. Subclasses implement ``command``.
    """

    model_path: str | os.PathLike
    draft_model_path: str | os.PathLike | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 300.0
    grace_s: float = 15.0
    #: how long ``stop`` waits for the trace's writer processes after the server is gone
    writer_wait_s: float = 300.0
    log_path: str | os.PathLike | None = None
    python: str | None = None
    env: Mapping[str, str] | None = None
    #: the engine's name in messages and log file names
    title: ClassVar[str] = "engine"
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    startup_s: float | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:30123``."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the server process (also its process-group id), or None before start()."""
        return None if self.proc is None else self.proc.pid

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The ``(argv, env)`` this server runs with (port chosen if not given)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to start {self.title}")

    def start(self, wait: bool = True) -> EngineServer:
        """Start the process (and by default wait until ``/health`` answers 200)."""
        if self.proc is not None:
            raise ServerError("server already started")
        argv, env = self.command()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"specdiff-{self.title.lower()}-", suffix=".log")
            os.close(fd)
            self.log_path = name
        self.proc = self._spawn(argv, env)
        self._t0 = time.monotonic()
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start ``argv`` in its own session, its output to ``log_path``; engines may start it
        another way that keeps ``pid`` / ``poll`` / ``wait`` / ``returncode`` (sglang/cpu/forked.py)."""
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        try:
            return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()

    def wait_ready(self, timeout_s: float | None = None, *, path: str = "/health") -> None:
        """Poll ``path`` until it answers 200; raise :class:`ServerError` with the log's
        last lines if the process exits first or the timeout passes. ``path`` another endpoint than
        ``/health`` (SGLang's runs a one-token generation: ``/model_info`` for a server whose
        first generation is expected to crash)."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError(
                    f"{self.title} server exited with code {rc} before it was ready "
                    f"(log {self.log_path}); last lines:\n{tail_log(Path(self.log_path))}"
                )
            try:
                if requests.get(self.url + path, timeout=5).status_code == 200:
                    self.startup_s = time.monotonic() - self._t0
                    return
            except requests.RequestException:  # not listening yet, or too busy starting to answer
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.title} server not ready after {time.monotonic() - self._t0:.0f} s "
                    f"(log {self.log_path}); last lines:\n{tail_log(Path(self.log_path))}"
                )
            time.sleep(0.5)

    def post(self, path: str, payload: Mapping[str, Any], timeout_s: float = 300.0) -> Any:
        """POST JSON to the server and return the decoded JSON answer.

        Raises :class:`ServerError` when the server is not running, answers an HTTP error (its
        body, cut at 2000 characters, is in the message), or the connection fails or times out
        after ``timeout_s`` seconds (with the log's last lines)."""
        if self.proc is None or self.proc.poll() is not None:
            raise ServerError(f"{self.title} server is not running (log {self.log_path})")
        try:
            r = requests.post(self.url + path, json=payload, timeout=timeout_s)
        except requests.RequestException as e:
            raise ServerError(
                f"{self.title} {path} failed: {e}; last log lines:\n{tail_log(Path(self.log_path))}"
            ) from e
        if not r.ok:
            raise ServerError(f"{self.title} {path} answered HTTP {r.status_code}: {r.text[:2000]}")
        try:
            return r.json()
        except ValueError as e:
            raise ServerError(f"{self.title} {path} answered HTTP {r.status_code} with a body that is not JSON: "
                              f"{r.text[:2000]!r}") from e

    def stop(self) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after ``grace_s``; return the exit code."""
        proc = self.proc
        if proc is None:
            return None
        deadline = time.monotonic() + self.grace_s
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout=30)
        # The group may still hold children that outlived the leader: an SGLang scheduler whose
        # SIGTERM handler is closing its trace (tracer/engines/lifecycle.py) when uvicorn's own
        # handler let the leader exit at once. Killed now, that trace was left unclosed (measured:
        # 1 stop in 3); they get what is left of the grace, then SIGKILL.
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal_group(signal.SIGKILL)
        # The trace writer is in neither the group nor the tree (tracer/engines/writer/child.py
        # ``detach``): it writes what it was handed, closes the trace and exits; wait for that, so the
        # trace a caller opens after stop() is the whole of it.
        trace = (self.env or {}).get("SPECDIFF_TRACE")
        if trace:
            from specdiff.tracer.engines.writer.alive import wait_for_writers

            wait_for_writers(trace, timeout_s=self.writer_wait_s)
        return proc.returncode

    def _group_alive(self) -> bool:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # our own session: pgid == the server's pid
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> EngineServer:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EngineServer", "ServerError", "free_port", "tail_log"]
