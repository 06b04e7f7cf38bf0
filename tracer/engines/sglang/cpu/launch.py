"""Launch real SGLang 0.5.23 (with or without EAGLE-3) on a CPU (or, as served, on a GPU), and
manage the process.

``server_command`` builds the argv and environment; ``ServerProcess`` starts it on
127.0.0.1 with a free port, waits for ``/health``, talks to ``/generate`` and stops it.
The server runs through ``serve.py`` (the AMX platform override, then SGLang's own
``launch_server``), with the pure-torch ``sgl_kernel`` stand-ins first on ``PYTHONPATH``.
See DESIGN.md "Real SGLang on a CPU" for why each piece is needed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import requests

from specdiff.tracer.engines.sglang.cpu import STANDIN_PATH
from specdiff.tracer.errors import SpecdiffError

SERVE_SCRIPT = os.path.join(STANDIN_PATH, "serve.py")

#: Flags that make SGLang 0.5.23 run on a CPU without AMX (measured on this project's machines).
CPU_BASE_ARGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "intel_amx",
    "--disable-cuda-graph",
    "--mem-fraction-static", "0.1",
    "--max-total-tokens", "4096",
    "--skip-server-warmup",
)


class ServerError(SpecdiffError):
    """The SGLang server did not start, died, or answered with an error."""


@dataclass(frozen=True)
class SpecSettings:
    """EAGLE-3 speculative settings passed to SGLang (``--speculative-*``).

    topk 1 makes a chain and SGLang then forces num_draft_tokens = num_steps + 1.
    """

    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int = 4
    algorithm: str = "EAGLE3"

    def args(self, draft_model_path: str | os.PathLike) -> list[str]:
        """The ``--speculative-*`` flags for SGLang, with the draft checkpoint's path."""
        return [
            "--speculative-algorithm", self.algorithm,
            "--speculative-draft-model-path", str(draft_model_path),
            "--speculative-num-steps", str(self.num_steps),
            "--speculative-eagle-topk", str(self.topk),
            "--speculative-num-draft-tokens", str(self.num_draft_tokens),
        ]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cpu_server_env(
    base: Mapping[str, str] | None = None,
    *,
    dynamo_disable: bool = True,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a CPU SGLang server process.

    ``PYTHONPATH`` gets :data:`STANDIN_PATH` first (so the stand-in ``sgl_kernel`` shadows
    the CUDA-only wheel's package of the same name), ``SGLANG_USE_CPU_ENGINE=1``, and by
    default ``TORCHDYNAMO_DISABLE=1`` (removes an ~11 s compile of the first speculative
    request; outputs were byte-identical). ``base`` defaults to ``os.environ``.
    """
    env = dict(os.environ if base is None else base)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != STANDIN_PATH]
    env["PYTHONPATH"] = os.pathsep.join([STANDIN_PATH, *rest])
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    if dynamo_disable:
        env["TORCHDYNAMO_DISABLE"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    if extra:
        env.update(extra)
    return env


def server_command(
    model_path: str | os.PathLike,
    *,
    port: int,
    host: str = "127.0.0.1",
    draft_model_path: str | os.PathLike | None = None,
    spec: SpecSettings | None = None,
    extra_args: Sequence[str] = (),
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    dynamo_disable: bool = True,
    device: str = "cpu",
) -> tuple[list[str], dict[str, str]]:
    """Return ``(argv, env)`` that start an SGLang HTTP server.

    ``device="cpu"``: the CPU recipe (``serve.py``, ``CPU_BASE_ARGS``, the ``sgl_kernel``
    stand-ins, ``cpu_server_env``). ``device="cuda"``: SGLang's own ``launch_server`` as a user
    serves, its kernels and CUDA graphs, ``env`` as given (default ``os.environ``); the specdiff
    plugin loads through SGLang's plugin entry point when ``SPECDIFF_TRACE`` is set.
    With ``draft_model_path`` the server speculates with EAGLE-3 (``spec`` defaults to 3 steps,
    topk 1, 4 draft tokens); without it, it decodes normally. ``python`` is the interpreter that
    has sglang installed (default: this one).

    Raises:
        ServerError: another ``device``.
    """
    if device == "cpu":
        argv = [python or sys.executable, SERVE_SCRIPT, "--model-path", str(model_path),
                "--host", host, "--port", str(port), *CPU_BASE_ARGS]
        env = cpu_server_env(env, dynamo_disable=dynamo_disable)
    elif device == "cuda":
        argv = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
                "--host", host, "--port", str(port), "--device", "cuda"]
        env = dict(os.environ if env is None else env)
    else:
        raise ServerError(f"device {device!r}: specdiff launches SGLang on 'cpu' or 'cuda'")
    if draft_model_path is not None:
        argv += (spec or SpecSettings()).args(draft_model_path)
    argv += list(extra_args)
    return argv, env


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ServerProcess:
    """A CPU SGLang server started by specdiff; use as a context manager.

    ``with ServerProcess(target, draft_model_path=draft) as srv: srv.generate(...)``.
    The process runs in its own session; :meth:`stop` sends SIGTERM to that process group
    (the server and the scheduler/detokenizer it spawned), then SIGKILL after ``grace_s``.
    The log (stdout and stderr) goes to ``log_path`` (a temp file by default), and its last
    lines are part of every start-up error.
    """

    model_path: str | os.PathLike
    draft_model_path: str | os.PathLike | None = None
    spec: SpecSettings | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 300.0
    grace_s: float = 15.0
    log_path: str | os.PathLike | None = None
    python: str | None = None
    env: Mapping[str, str] | None = None
    dynamo_disable: bool = True
    #: ``"cpu"``: the CPU recipe; ``"cuda"``: SGLang as served on a GPU (``server_command``)
    device: str = "cpu"
    #: the engine's name in messages (a subclass launches another engine: tracer/engines/vllm/cpu.py)
    title: ClassVar[str] = "SGLang"
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
        if self.port is None:
            self.port = free_port(self.host)
        return server_command(
            self.model_path, port=self.port, host=self.host,
            draft_model_path=self.draft_model_path, spec=self.spec,
            extra_args=self.extra_args, python=self.python, env=self.env,
            dynamo_disable=self.dynamo_disable, device=self.device,
        )

    def start(self, wait: bool = True) -> ServerProcess:
        """Start the process (and by default wait until ``/health`` answers 200)."""
        if self.proc is not None:
            raise ServerError("server already started")
        argv, env = self.command()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"specdiff-{self.title.lower()}-", suffix=".log")
            os.close(fd)
            self.log_path = name
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self._t0 = time.monotonic()
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll ``/health`` until it answers 200; raise :class:`ServerError` with the log's
        last lines if the process exits first or the timeout passes."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError(
                    f"{self.title} server exited with code {rc} before it was ready "
                    f"(log {self.log_path}); last lines:\n{_tail(Path(self.log_path))}"
                )
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    self.startup_s = time.monotonic() - self._t0
                    return
            except requests.RequestException:  # not listening yet, or too busy starting to answer
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.title} server not ready after {time.monotonic() - self._t0:.0f} s "
                    f"(log {self.log_path}); last lines:\n{_tail(Path(self.log_path))}"
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
                f"{self.title} {path} failed: {e}; last log lines:\n{_tail(Path(self.log_path))}"
            ) from e
        if not r.ok:
            raise ServerError(f"{self.title} {path} answered HTTP {r.status_code}: {r.text[:2000]}")
        try:
            return r.json()
        except ValueError as e:
            raise ServerError(f"{self.title} {path} answered HTTP {r.status_code} with a body that is not JSON: "
                              f"{r.text[:2000]!r}") from e

    def generate(
        self,
        text: str | list[str] | None = None,
        *,
        input_ids: list[int] | list[list[int]] | None = None,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        ignore_eos: bool = True,
        timeout_s: float = 300.0,
        request: Mapping[str, Any] | None = None,
        **sampling: Any,
    ) -> Any:
        """``/generate`` (greedy by default). Returns SGLang's JSON: a dict with ``text``,
        ``output_ids`` and ``meta_info`` (``spec_accept_length`` etc. when speculating),
        or a list of them for a batch. ``sampling`` goes into ``sampling_params``;
        ``request`` holds top-level fields (e.g. ``{"return_logprob": True}``)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": ignore_eos}
        params.update(sampling)
        payload: dict[str, Any] = {"sampling_params": params, **(request or {})}
        if input_ids is not None:
            payload["input_ids"] = input_ids
        else:
            payload["text"] = text
        return self.post("/generate", payload, timeout_s=timeout_s)

    def stop(self) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after ``grace_s``; return the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout=30)
        # the group may still hold children that outlived the leader
        self._signal_group(signal.SIGKILL)
        return proc.returncode

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # our own session: pgid == the server's pid
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> ServerProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
