"""Servers that die on their first request with no crash recorded, on a real SGLang 0.5.23 CPU server: the trace
they leave is diffed as a user would, and zero rows compared is no verdict.

- the scheduler process ends with ``os._exit`` as its first draft forward begins (bug plugin kind
  ``exit_in_first_draft_forward``): no Python exception, no atexit, no signal handler: the recorder writes nothing
  more and records no crash;
- the server killed from outside (SIGKILL to its process group) while its first draft forward runs (kind
  ``stall_first_draft_forward`` holds it there).

Either way the serving trace holds the vocab map written at start-up and not one request (the recorder writes a
request's rows and tokens when its iteration ends), and was never closed. ``record client`` says the server
died, ``record train --replay`` has no sequence to replay, so the user records the training side from the same
prompts (``record train --prompts``); ``diff`` says nothing was compared, what the trace holds, that it was not
closed and that no crash is recorded, and exits 1. The plugin is tests/server/bug_plugins/specdiff_state_bugs.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.bug_server import CHUNK, PLUGIN_DIR, entry_point_dir, injected, specdiff

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.demo.scenarios import write_served_draft
from specdiff.tracer.store import open_trace

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


def _dies(tmp_path: Path, server_env, bug: str, *, kill: bool) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """Serve the demo pair with ``bug`` and send one demo prompt with ``record client``; ``kill``: SIGKILL the
    server's process group once the bug says it holds the first draft forward. Returns (serving trace, the
    prompt file, the client's run)."""
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    draft = write_served_draft("correct", REPO_MODELS / "draft", tmp_path / "draft")
    serve = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(serve), PYTHONPATH=f"{entry_point_dir(tmp_path / 'eps')}:{PLUGIN_DIR}",
                     SPECDIFF_TEST_BUG=bug)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": demo_prompts(REPO_MODELS, 1)[0]}) + "\n")
    srv = ServerProcess(REPO_MODELS / "target", draft_model_path=draft, spec=SpecSettings(), env=env,
                        extra_args=["--chunked-prefill-size", str(CHUNK), "--dtype", "bfloat16"],
                        log_path=tmp_path / "server.log")
    srv.start(wait=False)  # SGLang's /health runs a generation, which these servers do not survive
    try:
        srv.wait_ready(path="/model_info")
        client = subprocess.Popen([sys.executable, "-m", "specdiff.tui", "record", "client", "--url", srv.url,
                                   "--prompts", str(prompts), "--max-new-tokens", "16"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if kill:
            deadline = time.monotonic() + 300
            while not injected(tmp_path, bug) and time.monotonic() < deadline:
                time.sleep(0.2)
            os.killpg(srv.proc.pid, signal.SIGKILL)
        out, _ = client.communicate(timeout=300)
        srv.proc.wait(120)
    finally:
        srv.stop()
    assert injected(tmp_path, bug)
    return serve, prompts, subprocess.CompletedProcess(client.args, client.returncode, out, "")


def _nothing_compared(tmp_path: Path, serve: Path, prompts: Path, client) -> str:
    """What the user sees, checked: the client, the trace, ``record train``, ``diff``. Returns diff's lead."""
    assert client.returncode == 2 and "died during request 0" in client.stdout, client.stdout
    t = open_trace(str(serve))
    assert (t.closed, len(t.sequences), t.records, t.names) == (False, 0, 1, ["draft.d2t"])
    assert "crash" not in t.contract
    replay = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", REPO_MODELS / "draft",
                      "--replay", serve, "-o", tmp_path / "replay.trace")
    assert replay.returncode == 2 and "no token sequences to replay: it was never closed and records no crash" in \
        " ".join(replay.stderr.split()), replay.stderr[-2000:]
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", REPO_MODELS / "draft",
                   "--prompts", prompts, "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    d = specdiff("diff", train, serve)
    assert d.returncode == 1 and "Traceback" not in d.stderr, d.stdout + d.stderr[-2000:]
    lead = " ".join(d.stdout.split("\n\n")[0].split())
    assert lead.startswith("nothing compared: no tensor row of the 0 aligned sequences is held by both sides "
                           f"(training {open_trace(str(train)).records} records, serving 1); serving trace cut off "
                           "(not closed: it holds 0 sequences, 1 records: draft.d2t), no crash recorded, so "
                           "equivalence is not shown; record the serving side again: its server ended before it "
                           "wrote a request"), lead
    js = json.loads(specdiff("diff", train, serve, "--format", "json").stdout)
    assert js["nothing_compared"] is True and js["crash"] is None and not js["diverged"] and js["verdict"] == lead
    return lead


def test_a_scheduler_that_exits_in_its_first_draft_forward_leaves_nothing_compared(tmp_path, server_env):
    serve, prompts, client = _dies(tmp_path, server_env, "exit_in_first_draft_forward", kill=False)
    _nothing_compared(tmp_path, serve, prompts, client)


def test_a_server_killed_during_its_first_request_leaves_nothing_compared(tmp_path, server_env):
    serve, prompts, client = _dies(tmp_path, server_env, "stall_first_draft_forward", kill=True)
    _nothing_compared(tmp_path, serve, prompts, client)
