"""How ``specdiff record client`` talks to a serving engine over HTTP: the prompts file, SGLang's
``/generate`` and OpenAI-style chat, vLLM's ``/v1/completions`` and its spec-decode counters, and the
one-line account of a server that stopped answering (``died_message``). The ``requests`` library is
imported inside the calls, so ``specdiff --help`` (which lists the command modules) stays fast.
"""

from __future__ import annotations

import os

from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.jsonl import iter_jsonl


def read_prompts(path: str) -> list[dict]:
    """Prompts from a JSONL file: each line ``{"text"|"prompt": str}``, ``{"input_ids": [...]}``
    or a JSON string; optional ``"max_new_tokens"`` per line."""
    out = []
    for n, obj in iter_jsonl(path):
        if isinstance(obj, str):
            obj = {"text": obj}
        if not isinstance(obj, dict) or not any(k in obj for k in ("text", "prompt", "input_ids")):
            raise SpecdiffError(f"{path}:{n}: expected a JSON string or an object with 'text', "
                                f"'prompt' or 'input_ids'")
        out.append(obj)
    if not out:
        raise SpecdiffError(f"{path}: no prompts")
    return out


def _post(url: str, path: str, payload: dict, timeout_s: float) -> dict:
    """POST ``payload`` as JSON; the decoded JSON answer. An HTTP error status or a body that is not
    JSON is a :class:`SpecdiffError`; no answer at all (refused, reset, timed out) a
    :class:`ServerGoneError`."""
    import requests  # imported by the commands that talk to a server: `specdiff --help` lists this module

    try:
        r = requests.post(url.rstrip("/") + path, json=payload, timeout=timeout_s)
    except requests.RequestException as exc:
        reason = request_failure(exc)
        raise ServerGoneError(f"{url}{path} failed: {reason}; is the server running?", reason=reason) from None
    if not r.ok:
        raise SpecdiffError(f"{url}{path} answered HTTP {r.status_code}: {r.text[:300]}")
    try:
        return r.json()
    except ValueError:
        raise SpecdiffError(f"{url}{path} answered HTTP {r.status_code} with a body that is not JSON: "
                            f"{r.text[:300]!r}") from None


def request_failure(exc: BaseException) -> str:
    """The innermost cause of a failed request, in a few words: ``Connection refused``, ``Remote end
    closed connection without response``, ``Read timed out. (read timeout=5)``. requests wraps
    urllib3's errors, which wrap the socket's; their own messages repeat the whole chain."""
    while True:
        inner = getattr(exc, "reason", None)
        if not isinstance(inner, BaseException):
            inner = next((a for a in exc.args if isinstance(a, BaseException)), None)
        inner = inner or exc.__cause__
        if inner is None or inner is exc:
            break
        exc = inner
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def generate(url: str, prompt: dict, *, max_new_tokens: int, temperature: float, ignore_eos: bool,
             timeout_s: float = 600.0) -> dict:
    params = {"max_new_tokens": int(prompt.get("max_new_tokens", max_new_tokens)),
              "temperature": temperature, "ignore_eos": ignore_eos}
    payload: dict = {"sampling_params": params}
    if "input_ids" in prompt:
        payload["input_ids"] = prompt["input_ids"]
    else:
        payload["text"] = prompt.get("text", prompt.get("prompt"))
    return _post(url, "/generate", payload, timeout_s)


def chat_completion(url: str, prompt: dict, *, max_new_tokens: int, temperature: float, ignore_eos: bool,
         timeout_s: float = 600.0) -> dict:
    """One request through SGLang's OpenAI-compatible ``/v1/chat/completions`` (the server applies
    its chat template). A prompt's ``messages`` are sent as given, ``text``/``prompt`` as one user
    message; token ids cannot go through a chat template. Returns ``{"meta_info": ...}`` like
    ``generate`` (SGLang 0.5.23 reports no speculative stats here: they read n/a)."""
    if "messages" in prompt:
        messages = prompt["messages"]
    elif "input_ids" in prompt:
        raise SpecdiffError("--chat sends text through the server's chat template; this prompt has only "
                            "input_ids (give 'text' or 'messages')")
    else:
        messages = [{"role": "user", "content": prompt.get("text", prompt.get("prompt"))}]
    payload = {"messages": messages, "max_tokens": int(prompt.get("max_new_tokens", max_new_tokens)),
               "temperature": temperature, "ignore_eos": ignore_eos}
    out = _post(url, "/v1/chat/completions", payload, timeout_s)
    usage = out.get("usage") or {}
    return {"meta_info": {"id": out.get("id", "?"), "completion_tokens": usage.get("completion_tokens", 0)},
            "output_ids": []}


def server_engine(url: str, *, timeout_s: float = 10.0) -> tuple[str, str | None]:
    """``(engine, model)`` of the OpenAI-compatible server at ``url``: the engine whose ``EngineSpec.models_owner``
    its ``/v1/models`` names as the model's owner (vLLM 0.32 entrypoints/openai/models: owned_by 'vllm'), else
    ``eagle3.engines.DEFAULT_SERVER``'s (SGLang) with the id or None. The first request ``record client`` sends.

    Raises:
        ServerGoneError: nothing answers at ``url`` (refused, unresolved, timed out): no server is there
            (it was reported as a server that "died during request 0").
    """
    import requests

    try:
        answer = requests.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
    except requests.RequestException as exc:
        reason = request_failure(exc)
        raise ServerGoneError(unreachable_message(url, reason=reason, trace=None), reason=reason) from None
    from specdiff.eagle3.engines import DEFAULT_SERVER, REGISTRY

    try:
        data = answer.json().get("data") or []
    except (ValueError, AttributeError):
        return DEFAULT_SERVER.name, None
    first = data[0] if data and isinstance(data[0], dict) else {}
    owners = {s.models_owner: s.name for s in REGISTRY.values() if s.models_owner}
    return owners.get(first.get("owned_by"), DEFAULT_SERVER.name), first.get("id")


def vllm_completion(url: str, prompt: dict, *, model: str, max_new_tokens: int, temperature: float,
                    ignore_eos: bool, timeout_s: float = 600.0) -> dict:
    """One request through vLLM's ``/v1/completions`` (text, or token ids as the prompt). Returns
    ``{"meta_info": {id, completion_tokens}, "output_ids": []}`` like ``generate``."""
    body = prompt["input_ids"] if "input_ids" in prompt else prompt.get("text", prompt.get("prompt"))
    payload = {"model": model, "prompt": body, "max_tokens": int(prompt.get("max_new_tokens", max_new_tokens)),
               "temperature": temperature, "ignore_eos": ignore_eos}
    out = _post(url, "/v1/completions", payload, timeout_s)
    usage = out.get("usage") or {}
    return {"meta_info": {"id": out.get("id", "?"), "completion_tokens": usage.get("completion_tokens", 0)},
            "output_ids": []}


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's Prometheus counters (``/metrics``), parsed by the vLLM launcher's ``parse_metrics``."""
    import requests

    from specdiff.tracer.engines.base import cpu_launcher

    launcher = cpu_launcher("vllm")
    try:
        return launcher.parse_metrics(requests.get(url.rstrip("/") + "/metrics", timeout=30).text)
    except requests.RequestException:
        return {}


def vllm_spec_stats(before: dict, after: dict) -> dict:
    """Acceptance of the requests run between two ``/metrics`` reads (the counters' difference)."""
    from specdiff.tracer.engines.base import cpu_launcher

    launcher = cpu_launcher("vllm")
    return launcher.spec_decode_stats({k: v - before.get(k, 0.0) for k, v in after.items()})


class ServerGoneError(SpecdiffError):
    """The server did not answer a request (connection refused, closed or reset)."""

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason


def server_alive(url: str, *, timeout_s: float = 5.0) -> bool:
    """True when ``/health`` answers (any HTTP status): the process is still serving."""
    import requests

    try:
        requests.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException:
        return False
    return True


def unreachable_message(url: str, *, reason: str, trace: str | None) -> str:
    """The one line ``record client`` prints when nothing answers at ``url`` before any request: no server
    is there (``no server answers at URL (Connection refused); ...``), unless a trace says one ran there
    (``trace`` as given with ``--trace`` and present, else the one registered for the URL's port on this
    machine, tracer/live.py): then it died, and :func:`died_message` names its trace and crash."""
    from specdiff.tracer.live import trace_of_server

    known = trace if trace is not None and os.path.exists(trace) else trace_of_server(url)
    if known is None:
        return (f"no server answers at {url} ({reason}); start it first (specdiff record serve ... -- SERVER ARGS) "
                "or check --url")
    return died_message(url, request=0, reason=reason, trace=known)


def died_message(url: str, *, request: int, reason: str, trace: str | None) -> str:
    """The one line ``record client`` prints when the server died under request ``request``."""
    from specdiff.tracer.live import trace_of_server

    trace = trace or trace_of_server(url)
    head = f"the server at {url} died during request {request} ({reason})"
    if trace is None:
        return (f"{head}; no trace is registered for it here (its trace is where its SPECDIFF_TRACE "
                "pointed; `specdiff info TRACE` shows the crash)")
    if not os.path.exists(trace):
        return f"{head}; its trace {trace} does not exist (was tracing on?)"
    try:
        from specdiff.tracer.crash import describe_crash
        from specdiff.tracer.store import open_trace

        crash = open_trace(trace).contract.get("crash")
    except SpecdiffError:
        crash = None
    what = f"holds the crash: {describe_crash(crash)}" if isinstance(crash, dict) else "holds what it recorded"
    return f"{head}; its trace {trace} {what} (see `specdiff info {trace}`)"
