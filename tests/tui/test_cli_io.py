"""What the CLI prints around its results and how it talks HTTP: the progress bar of ``specdiff
diff`` (a terminal's stderr only, never in the report), and ``record client`` against servers that
fail in each way an HTTP exchange can (no answer, an error status, a body that is not JSON): one
``specdiff: error:`` line, exit 2, with the cause in a few words.
"""

from __future__ import annotations

import os
import pty
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


# ---- lazy subcommands ----------------------------------------------------------------------------
def test_every_registered_subcommand_is_in_the_lazy_table():
    """A command module missing from ``SUBCOMMANDS`` would never be imported: the command would vanish."""
    import importlib

    from specdiff.tui import cli as cli_module

    for module in sorted({m for mods in cli_module.SUBCOMMANDS.values() for m in mods}):
        importlib.import_module(f"specdiff.tui.{module}")
    assert sorted(cli_module.cli.commands) == sorted(cli_module.SUBCOMMANDS)
    record = cli_module.cli.commands["record"]
    assert sorted(record.commands) == ["client", "serve", "train"]


def test_diff_starts_without_loading_torch(tmp_path, aux_traces):
    """``specdiff diff`` (and ``view``) import only their own command: torch alone takes seconds to load,
    and the first divergence is meant to show within a second."""
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 6, 7])
    probe = ("import sys; from specdiff.tui.cli import main\n"
             "try:\n    main(['diff', sys.argv[1], sys.argv[2], '--format', 'json'])\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('torch loaded' if 'torch' in sys.modules else 'no torch', code, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", probe, a, b], capture_output=True, text=True, timeout=300)
    assert p.stderr.strip().splitlines()[-1] == "no torch 1", p.stderr  # diverges and is explained


# ---- diff's progress bar --------------------------------------------------------------------------
def _on_pty(argv: list[str], *, all_streams: bool = False, timeout: int = 300) -> tuple[int, str, str]:
    """Run ``argv`` with stderr (``all_streams``: stdin, stdout and stderr) on a pseudo-terminal;
    (exit code, stdout when piped else '', what the terminal received)."""
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    streams = dict(stdin=slave, stdout=slave) if all_streams else dict(stdout=subprocess.PIPE, text=True)
    try:
        p = subprocess.run(argv, stderr=slave, timeout=timeout, **streams)
    finally:
        os.close(slave)
    reader.join(30)
    os.close(master)
    return p.returncode, p.stdout or "", b"".join(chunks).decode(errors="replace")


def _diff(a: str, b: str, *, stderr_tty: bool) -> tuple[int, str, str]:
    """``specdiff diff A B --format text`` in a child process; (exit code, stdout, stderr), stderr
    attached to a pseudo-terminal when ``stderr_tty``."""
    argv = [sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "text"]
    if not stderr_tty:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        return p.returncode, p.stdout, p.stderr
    return _on_pty(argv)


def test_diff_draws_a_progress_bar_on_a_terminal_and_nothing_into_a_pipe(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 6, 7])
    rc, report, err = _diff(a, b, stderr_tty=False)
    assert rc == 1 and report.startswith("first divergence: target.aux.0") and err == ""
    rc_tty, report_tty, bar = _diff(a, b, stderr_tty=True)
    assert (rc_tty, report_tty) == (rc, report)  # the bar never reaches the report
    assert "comparing" in bar and "100%" in bar, bar
    assert "draft.topk_target" in bar  # the tensor being compared is named beside the bar


def test_diff_on_a_terminal_prints_the_report_not_the_app(tmp_path, aux_traces):
    """``diff A B`` on a terminal opened the app, though the README calls it a report (the
    app is ``view``). Stdin, stdout and stderr on a pseudo-terminal: the app would wait for keys and
    the run time out."""
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 6, 7])
    rc, _, out = _on_pty([sys.executable, "-m", "specdiff.tui", "diff", a, b], all_streams=True, timeout=120)
    assert rc == 1, out
    assert "first divergence: target.aux.0" in out and "\ntensors" in out.replace("\r\n", "\n"), out


# ---- record client against failing servers -----------------------------------------------------
@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"text": "def f():"}\n')
    return p


def test_a_server_that_closes_the_connection_unanswered_died_during_the_request(prompts, run_cli, tmp_path,
                                                                                monkeypatch):
    from specdiff.tracer import live

    monkeypatch.setattr(live, "registry_dir", lambda: str(tmp_path / "reg"))  # no trace registered here
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def accept_then_die():
        while True:
            conn, _ = listener.accept()
            # Read the whole request first: closing with unread bytes sends a reset ("Connection reset
            # by peer") instead of closing the connection unanswered, which flaked under load.
            got = b""
            while b"\r\n\r\n" not in got:
                got += conn.recv(65536)
            head, _, body = got.partition(b"\r\n\r\n")
            if head.startswith(b"GET /v1/models"):  # record client asks which engine it talks to first
                models = b'{"data": [{"id": "m", "owned_by": "sglang"}]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(models), models))
                conn.close()
                continue
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            listener.close()  # the process is gone: /health is refused
            conn.close()
            return

    threading.Thread(target=accept_then_die, daemon=True).start()
    r = run_cli("record", "client", "--url", f"http://127.0.0.1:{port}", "--prompts", prompts)
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.startswith("specdiff: error:")]
    assert len(lines) == 1, r.output
    assert lines[0].startswith(f"specdiff: error: the server at http://127.0.0.1:{port} died during request 0 "
                               "(Remote end closed connection without response); no trace is registered")


class _Answer(BaseHTTPRequestHandler):
    status, body = 200, b""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("status", "body", "says"), [
    (400, b'{"error": "max_new_tokens too large"}', 'answered HTTP 400: {"error": "max_new_tokens too large"}'),
    (200, b"<html>a proxy page</html>", "answered HTTP 200 with a body that is not JSON: '<html>a proxy page</html>'"),
])
def test_a_server_that_answers_badly_is_one_line_with_its_answer(prompts, run_cli, status, body, says):
    handler = type("Handler", (_Answer,), {"status": status, "body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        r = run_cli("record", "client", "--url", url, "--prompts", prompts)
    finally:
        server.shutdown()
        server.server_close()
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.startswith("specdiff: error:")]
    assert lines == [f"specdiff: error: {url}/generate {says}"], r.output


def test_request_failures_are_named_by_their_innermost_cause():
    import requests

    from specdiff.tracer.engines.sglang.cpu.launch import free_port
    from specdiff.tui.serve_http import request_failure

    with pytest.raises(requests.ConnectionError) as err:
        requests.get(f"http://127.0.0.1:{free_port()}/health", timeout=5)
    assert request_failure(err.value) == "Connection refused"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts into the backlog, never answers
    try:
        with pytest.raises(requests.Timeout) as err:
            requests.get(f"http://127.0.0.1:{silent.getsockname()[1]}/health", timeout=0.5)
    finally:
        silent.close()
    assert request_failure(err.value) == "timed out"


def test_the_recorder_benchmark_takes_a_target_only_with_its_draft():
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "benchmarks" / "recorder_overhead.py"),
                        "--device", "cuda", "--target", "/models/t"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == ("recorder_overhead.py: error: --target and --draft go together "
                                         "(a target checkpoint and its EAGLE-3 draft)")
