"""Start a CPU SGLang server by asking the zygote to fork it (``zygote.py``), where that is safe.

``SPECDIFF_SGLANG_ZYGOTE=<socket>`` in the caller's environment names a running zygote
(tests/conftest.py starts one per test worker). ``zygote_spawn`` returns a ``ForkedServer`` (the
part of ``subprocess.Popen`` that ``EngineServer`` uses: ``pid``, ``poll``, ``wait``,
``returncode``) or None, and then the caller starts the server as a fresh process as always.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from specdiff.tracer.engines.sglang.cpu.serve import START_METHOD_ENV
from specdiff.tracer.engines.sglang.cpu.zygote import import_time_env

logger = logging.getLogger(__name__)

#: the environment variable that names the zygote's socket
ZYGOTE_ENV = "SPECDIFF_SGLANG_ZYGOTE"
#: how long a caller waits for a zygote that is still importing SGLang (s)
ZYGOTE_READY_S = 300.0


def _ask(path: str, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall((json.dumps(request) + "\n").encode())
        return json.loads(s.makefile("rb").readline())


def zygote_info(path: str, timeout_s: float = ZYGOTE_READY_S) -> dict | None:
    """The zygote's facts (``pid``, ``executable``, ``env``: its import-time environment) once it
    listens on ``path``; None when it is not running (or not ready within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path + ".json") as f:
                info = json.load(f)
            os.kill(info["pid"], 0)
            return info
        except (OSError, ValueError, KeyError):
            pass
        try:
            with open(path + ".starting") as f:
                os.kill(int(f.read()), 0)  # still importing
        except (OSError, ValueError):
            return None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def zygote_accepts(info: dict, argv: Sequence[str], env: Mapping[str, str], serve_script: str) -> bool:
    """Whether a server of ``argv`` / ``env`` forked from the zygote ``info`` runs as a fresh
    process would: the CPU recipe's ``serve.py`` in the zygote's interpreter, its scheduler started
    by fork, and the same import-time environment (zygote.py ``IMPORT_TIME_PREFIXES``)."""
    return (len(argv) >= 2 and argv[0] == info["executable"] and argv[1] == serve_script
            and env.get(START_METHOD_ENV) == "fork" and _import_time(env, info) == info["env"]
            and not _runs_at_start(env.get("PYTHONPATH", "")))


def _import_time(env: Mapping[str, str], info: dict) -> dict:
    """``env``'s import-time variables, less those SGLang's own imports set to the same value (a
    caller that imported SGLang has ``CUDA_CACHE_PATH`` etc.; the zygote's launchers get them too)."""
    added = info.get("added", {})
    return {k: v for k, v in import_time_env(dict(env)).items() if added.get(k) != v}


def _runs_at_start(pythonpath: str) -> bool:
    """Whether ``pythonpath`` holds a module the interpreter runs as it starts (``site``'s
    ``sitecustomize`` / ``usercustomize``): a forked launcher has started already and would not."""
    return any(os.path.exists(os.path.join(p, f"{name}.py")) for p in pythonpath.split(os.pathsep) if p
               for name in ("sitecustomize", "usercustomize"))


class ForkedServer:
    """A server launcher the zygote forked: ``pid`` (its own session and process group), ``poll()``,
    ``wait(timeout)`` (raises ``subprocess.TimeoutExpired``), ``returncode`` (-N: signal N)."""

    def __init__(self, path: str, pid: int, argv: Sequence[str]):
        self._path, self.pid, self.args, self.returncode = path, pid, list(argv), None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = _ask(self._path, {"op": "status", "pid": self.pid})["returncode"]
            except OSError:  # the zygote is gone: so is the server it would have reaped
                if not _alive(self.pid):
                    self.returncode = -9
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.1)
        return self.returncode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def zygote_spawn(argv: Sequence[str], env: Mapping[str, str], log_path: str,
                 serve_script: str) -> ForkedServer | None:
    """Fork the server ``argv`` / ``env`` (its output to ``log_path``) from the zygote that
    ``SPECDIFF_SGLANG_ZYGOTE`` in this process's environment names; None where there is none or it
    cannot start this one as a fresh process would (``zygote_accepts``)."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path:
        return None
    info = zygote_info(path)
    if info is None:
        logger.info("no SGLang zygote answers at %s: the server starts as a fresh process", path)
        return None
    if not zygote_accepts(info, argv, env, serve_script):
        mine = _import_time(env, info)
        differ = sorted(k for k in {*mine, *info["env"]} if mine.get(k) != info["env"].get(k))
        logger.info("the SGLang zygote at %s would not start this server as a fresh process would "
                    "(zygote_accepts; import-time variables that differ: %s): it starts as one", path, differ)
        return None
    try:
        reply = _ask(path, {"op": "start", "argv": list(argv), "env": dict(env), "cwd": os.getcwd(),
                            "log": os.path.abspath(log_path)})
    except OSError:
        return None
    return ForkedServer(path, int(reply["pid"]), argv)


def start_zygote(path: str, env: Mapping[str, str], owner: int | None = None) -> subprocess.Popen:
    """Start a zygote on ``path`` in the background (its log at ``path + '.log'``), serving until
    ``owner`` (default: this process) exits; ``env``: the environment it imports SGLang under
    (``cpu_server_env``'s, so the stand-in ``sgl_kernel`` is the one imported)."""
    from specdiff.tracer.engines.sglang.cpu import zygote

    with open(path + ".log", "wb") as log:
        proc = subprocess.Popen([sys.executable, zygote.__file__, path, str(owner or os.getpid())], env=dict(env),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    with open(path + ".starting", "w") as f:  # zygote_info waits while this process lives
        f.write(str(proc.pid))
    return proc
