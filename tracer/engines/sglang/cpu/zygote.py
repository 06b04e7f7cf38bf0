"""A pre-imported SGLang launcher that CPU servers fork from: ``SPECDIFF_SGLANG_ZYGOTE=<socket>``.

Why: importing SGLang 0.5.23's HTTP server (``sglang.srt.entrypoints.http_server``: torch,
transformers, flashinfer, deep_gemm, every quantization scheme) takes ~25 s of the ~38 s a tiny CPU
server needs to answer ``/health`` on this project's 2-core machines; a test session starts ~50 such
servers. The zygote imports it once and forks a launcher per server, which then runs exactly what
``serve.py`` runs (``serve.main``: AMX claim, plugins, ``prepare_server_args``, ``run_server``).

Used only where nothing can tell the difference (``ServerProcess`` checks, ``zygote_accepts``):
the CPU recipe's ``serve.py`` in this very interpreter, SGLang's scheduler started by fork
(``SPECDIFF_SGLANG_START=fork``, whose children share the launcher's imports anyway), and an
environment that agrees with the zygote's on every variable a module may read at import time
(``IMPORT_TIME_PREFIXES``). A forked launcher gets its own session (its pid is its process group,
as ``start_new_session`` gives a spawned one), the request's environment, working directory,
``sys.path`` (``PYTHONPATH`` first, as the interpreter orders it at start) and log file.

Protocol: one JSON line per connection on an ``AF_UNIX`` socket, one JSON line back.
``{"op": "start", "argv", "env", "cwd", "log"}`` -> ``{"pid"}``; ``{"op": "status", "pid"}`` ->
``{"returncode": int | null}`` (-N: killed by signal N, as ``subprocess`` says it).
The zygote is single-threaded (a forked process keeps only the forking thread: a lock held by
another thread would stay held in every server) and exits when its owner process is gone.

Like ``serve.py`` it imports nothing from specdiff, so it runs as a script.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import time

#: environment variables a module may read once, at import: a request whose value differs from the
#: zygote's is started as a fresh process instead (its imports would see other values)
IMPORT_TIME_PREFIXES = ("SGLANG_", "SGL_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_", "CUDA_", "HF_",
                        "TRANSFORMERS_", "TOKENIZERS_", "PYTHON")
#: what the zygote imports once: the launcher's modules, then what its forked scheduler imports
#: itself (the model registry imports every model module: ~3 s), none of which starts a thread
PRELOAD = ("sglang.launch_server", "sglang.srt.entrypoints.http_server", "sglang.srt.server_args", "serve",
           "sglang.srt.managers.scheduler", "sglang.srt.model_executor.model_runner", "sglang.srt.models.registry",
           "sglang.srt.speculative.eagle_worker_v2")
#: how often the loop looks for its owner and for exited servers (s)
POLL_S = 0.5


#: where a library keeps caches (torch inductor's ``TORCHINDUCTOR_CACHE_DIR`` is set by an in-process
#: compile to a folder of its own): read when the cache is used, with the request's value; it changes
#: no result
CACHE_SUFFIXES = ("_CACHE_DIR", "_CACHE_PATH", "_CACHE_ROOT", "_HOME")


def import_time_env(env: dict) -> dict:
    """The part of ``env`` that ``IMPORT_TIME_PREFIXES`` names (``PYTHONPATH`` excluded: the
    forked launcher puts the request's entries first on ``sys.path`` itself; cache locations,
    ``CACHE_SUFFIXES``, too)."""
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_PREFIXES) and k != "PYTHONPATH" and not k.endswith(CACHE_SUFFIXES)}


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _launch(req: dict, added: dict) -> None:
    """In the forked child: become the server launcher ``req`` asks for; never returns. ``added``:
    what SGLang's imports put into the environment (``CUDA_CACHE_PATH`` ...), as a fresh
    launcher's imports would, unless the request sets it."""
    code = 1
    try:
        os.setsid()
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update({**added, **req["env"]})
        # the interpreter's own order at start: the script's folder, then PYTHONPATH, then the rest
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [sys.path[0], *extra, *(p for p in sys.path[1:] if p not in extra)]
        importlib.invalidate_caches()
        sys.argv = list(req["argv"][1:])
        import serve  # noqa: PLC0415 - this folder's serve.py, as the script it stands for

        serve.main(sys.argv[1:])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the server's log says what went wrong
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve_forever(path: str, owner: int, before: dict) -> None:
    """Listen on ``path``, fork a launcher per ``start``; return when ``owner`` is gone.
    ``before``: the environment as this process started, before its imports."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    exited: dict[int, int] = {}
    live: set[int] = set()
    # written last: a client that reads it finds the socket listening
    added = {k: v for k, v in os.environ.items() if k not in before}
    with open(path + ".json.tmp", "w") as f:
        json.dump({"pid": os.getpid(), "owner": owner, "executable": sys.executable, "env": import_time_env(before),
                   "added": added}, f)
    os.replace(path + ".json.tmp", path + ".json")
    try:
        while True:
            for pid in list(live):
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    live.discard(pid)
                    continue
                if done:
                    live.discard(pid)
                    exited[pid] = _exit_code(status)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                print(f"specdiff zygote: owner {owner} is gone; exiting", flush=True)
                return
            ready, _, _ = select.select([listener], [], [], POLL_S)
            if not ready:
                continue
            conn, _ = listener.accept()
            try:
                _answer(conn, listener, live, exited, added)
            except Exception as exc:  # noqa: BLE001 - one client's broken request ends no other's server
                print(f"specdiff zygote: request failed: {type(exc).__name__}: {exc}", flush=True)
            finally:
                conn.close()
    finally:
        listener.close()
        for leftover in (path + ".json", path):
            try:
                os.unlink(leftover)
            except OSError:
                pass


def _answer(conn: socket.socket, listener: socket.socket, live: set[int], exited: dict[int, int],
            added: dict) -> None:
    """Read one request from ``conn`` and answer it (``serve_forever``'s protocol)."""
    req = json.loads(conn.makefile("rb").readline())
    if req["op"] == "start":
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            _launch(req, added)
        live.add(pid)
        reply = {"pid": pid}
    else:
        pid = req["pid"]
        if pid in live:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                live.discard(pid)
                exited[pid] = _exit_code(status)
        reply = {"returncode": exited.get(pid)}
    conn.sendall((json.dumps(reply) + "\n").encode())


def main() -> None:
    """``python zygote.py SOCKET OWNER_PID``: import SGLang's server, then serve until OWNER exits."""
    path, owner = sys.argv[1], int(sys.argv[2])
    t0, before = time.monotonic(), dict(os.environ)
    try:
        for module in PRELOAD:
            importlib.import_module(module)
        # setproctitle sets itself up at its first call from argv and environ as the process started;
        # a launcher that first replaced its environment (``_launch``) found them moved and every title
        # SGLang sets (``sglang::scheduler``, srt/managers/scheduler.py:6294) silently stayed "python"
        import setproctitle

        setproctitle.setproctitle("specdiff::sglang-zygote")

        print(f"specdiff zygote: SGLang imported in {time.monotonic() - t0:.1f} s; serving {path}", flush=True)
        serve_forever(path, owner, before)
    finally:
        try:
            os.unlink(path + ".starting")  # clients stop waiting for a zygote that is not coming
        except OSError:
            pass


if __name__ == "__main__":
    main()
