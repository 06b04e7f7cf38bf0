"""Launch real SGLang 0.5.23 (with or without EAGLE-3) on a CPU (or, as served, on a GPU), and
manage the process.

``server_command`` builds the argv and environment; ``ServerProcess`` starts it on
127.0.0.1 with a free port, waits for ``/health``, talks to ``/generate`` and stops it (the
process handling is the engine-independent ``tracer.engines.server.EngineServer``).
The server runs through ``serve.py`` (the AMX platform override, then SGLang's own
``launch_server``), with the pure-torch ``sgl_kernel`` stand-ins first on ``PYTHONPATH``.
Why each piece is needed: the PyPI ``sglang-kernel`` wheel is CUDA-only (``cpu/__init__.py``), and SGLang
0.5.23 rewrites ``intel_amx`` to ``torch_native`` on a CPU without AMX
(``srt/arg_groups/overrides.py:1300-1310``, ``serve.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from specdiff.eagle3.engines import SGLANG
from specdiff.tracer.engines.server import EngineServer, ServerError, free_port, offline_env
from specdiff.tracer.engines.sglang.cpu import STANDIN_PATH

SERVE_SCRIPT = os.path.join(STANDIN_PATH, "serve.py")

#: Flags that make SGLang 0.5.23 run on a CPU without AMX (measured on this project's machines).
CPU_BASE_ARGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "intel_amx",
    "--disable-cuda-graph",
    # SGLang 0.5.23 checks the system memory available after the weights load against
    # (1 - fraction) x before (mem_cache/kv_cache_configurator.py:3050): on a shared machine another
    # process's allocations during the load count as the weights' (a clean-clone CI run: "minimum viable
    # 0.1134" with 0.1). The KV pool stays capped by --max-total-tokens (kv_cache_configurator.py:398-401).
    "--mem-fraction-static", "0.5",
    "--max-total-tokens", "4096",
    "--skip-server-warmup",
)


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


#: SGLang 0.5.23 dumps py-spy stacks and waits for CUDA coredumps when a child dies, also on a normal
#: stop (``srt/environ.py:401-403``, ``tokenizer_manager.py:3481-3502``: 5 s of sleep, then a py-spy
#: that is not installed); a CPU server has neither, so they are off unless the caller sets them
NO_CRASH_DIAGNOSTICS = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}


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
    request; outputs were byte-identical), offline (``server.offline_env``), and SGLang's crash
    diagnostics off where the caller does not set them (``NO_CRASH_DIAGNOSTICS``). ``base`` defaults to
    ``os.environ``.
    """
    env = dict(os.environ if base is None else base)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != STANDIN_PATH]
    env["PYTHONPATH"] = os.pathsep.join([STANDIN_PATH, *rest])
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    for key, value in NO_CRASH_DIAGNOSTICS.items():
        env.setdefault(key, value)
    if dynamo_disable:
        env["TORCHDYNAMO_DISABLE"] = "1"
    offline_env(env)
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


def record_serve_command(sglang_args: Sequence[str], *, cpu: bool,
                         env: Mapping[str, str]) -> tuple[list[str], Mapping[str, str]]:
    """``(argv, env)`` of ``specdiff record serve --engine sglang [--cpu] -- <sglang_args>``: SGLang's
    ``launch_server`` in this Python (``env`` as given), or with ``cpu`` the CPU recipe (``serve.py``,
    ``CPU_BASE_ARGS`` before the user's arguments, ``cpu_server_env``)."""
    if cpu:
        return [sys.executable, SERVE_SCRIPT, *CPU_BASE_ARGS, *sglang_args], cpu_server_env(env)
    return [sys.executable, "-m", "sglang.launch_server", *sglang_args], env


@dataclass
class ServerProcess(EngineServer):
    """A CPU SGLang server started by specdiff; use as a context manager.

    ``with ServerProcess(target, draft_model_path=draft) as srv: srv.generate(...)``.
    Process handling (own session, ``/health``, ``post``, ``stop`` by process group, the log's
    last lines in every start-up error) is ``tracer.engines.server.EngineServer``'s; this adds
    SGLang's command line (``server_command``) and ``/generate``.
    """

    spec: SpecSettings | None = None
    dynamo_disable: bool = True
    #: ``"cpu"``: the CPU recipe; ``"cuda"``: SGLang as served on a GPU (``server_command``)
    device: str = "cpu"
    title: ClassVar[str] = SGLANG.title

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

    def stop(self) -> int | None:
        """SIGTERM the schedulers first and let them exit (their recorders close the trace), then
        stop the server's process group (``EngineServer.stop``).

        Why: on SIGTERM SGLang 0.5.23's tokenizer manager drains and then SIGKILLs every descendant
        (``sigterm_watchdog``, ``srt/managers/tokenizer_manager.py:3559``) as soon as no request is
        left; a scheduler whose SIGTERM handler was still closing its trace (tracer/engines/lifecycle.py)
        left it unclosed, and a reader waited for a close that never came (measured in CI: 2 of 7 demo
        runs, 180 s each). Schedulers are found by the process title SGLang sets
        (``srt/managers/scheduler.py:6294``: ``sglang::scheduler...``)."""
        if self.proc is not None and self.proc.poll() is None:
            _stop_schedulers(self.proc.pid, self.grace_s)
        return super().stop()

    def _spawn(self, argv: list[str], env: dict[str, str]):
        """Forked from the test session's pre-imported launcher where one runs and nothing could tell
        (sglang/cpu/forked.py ``zygote_spawn``), else a fresh process."""
        from specdiff.tracer.engines.sglang.cpu.forked import zygote_spawn

        return zygote_spawn(argv, env, str(self.log_path), SERVE_SCRIPT) or super()._spawn(argv, env)

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


def _stop_schedulers(pid: int, timeout_s: float) -> None:
    """SIGTERM the ``sglang::scheduler*`` descendants of ``pid`` and wait up to ``timeout_s`` for them."""
    import psutil

    try:
        schedulers = [p for p in psutil.Process(pid).children(recursive=True) if p.name().startswith("sglang::sched")]
    except psutil.Error:
        return
    for p in schedulers:
        try:
            p.terminate()
        except psutil.Error:
            pass
    psutil.wait_procs(schedulers, timeout=timeout_s)


__all__ = ["CPU_BASE_ARGS", "SERVE_SCRIPT", "ServerError", "ServerProcess", "SpecSettings", "cpu_server_env",
           "free_port", "record_serve_command", "server_command"]
