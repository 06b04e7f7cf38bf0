"""A server that refuses to start is reported with the engine's own error line.

``specdiff record serve`` relays the server's stderr and keeps its tail; when the server exits
before any trace exists and its log ends in a traceback, the command fails (exit 2) with that
traceback's last line, not a guess about the install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from specdiff.tui.cmd_record import engine_error_line

#: the tail of a real SGLang 0.5.23 start-up failure (srt/configs/model_config.py:1314), as its
#: scheduler subprocess prints it (log prefix, then the traceback)
SGLANG_TAIL = [
    "[2026-12-01 16:01:02] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/x/sglang/srt/configs/model_config.py", line 1314, in _derive_context_length',
    "    raise ValueError(",
    "ValueError: Warning: Target model's context_length (2048) is greater than the derived context_length (64). "
    "To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
    "[2026-12-01 16:01:03] Received sigquit from a child process. It usually means the child failed.",
]


def test_the_engine_error_line_is_the_last_tracebacks_last_line():
    assert engine_error_line(SGLANG_TAIL).startswith("ValueError: Warning: Target model's context_length (2048)")
    assert engine_error_line(["[t] torch.OutOfMemoryError: CUDA out of memory"]) == \
        "torch.OutOfMemoryError: CUDA out of memory"
    # a log without a traceback, or one that ends on the user's own Ctrl-C, names no error
    assert engine_error_line(["INFO: server ready", "Received sigquit from a child process."]) is None
    assert engine_error_line(["KeyboardInterrupt"]) is None


@pytest.mark.server
@pytest.mark.timeout(600)
def test_a_draft_shorter_than_the_targets_context_is_sglangs_own_refusal(repo_models, tmp_path, server_env):
    pytest.importorskip("sglang")
    from specdiff.tracer.engines.server import free_port
    from specdiff.tracer.engines.sglang.cpu.launch import SpecSettings

    draft = tmp_path / "draft"
    shutil.copytree(repo_models / "draft", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["max_position_embeddings"] = 64  # shipped so by public heads; the target serves 2048
    (draft / "config.json").write_text(json.dumps(cfg))
    trace = tmp_path / "serve.trace"
    argv = [sys.executable, "-m", "specdiff.tui", "record", "serve", "--cpu", "--trace", str(trace), "--",
            "--model-path", str(repo_models / "target"), "--port", str(free_port()),
            *SpecSettings(num_steps=3, topk=1, num_draft_tokens=4).args(draft)]
    env = {k: v for k, v in server_env().items() if k != "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"}
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=540)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("specdiff: error:")]
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert len(errors) == 1, r.stderr[-3000:]
    assert "exited" in errors[0] and "before it served: ValueError: " in errors[0] and "context_length" in errors[0]
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in errors[0]
    assert "was specdiff installed" not in r.stdout + r.stderr
    assert not os.path.exists(trace)


#: the lines a real SGLang 0.5.23 server printed when specdiff's plugin raised at import (a
#: half-edited checkout, 2026-12-01): SGLang logged the traceback (srt/plugins/__init__.py:135) and
#: served on, untraced, and the user learned it only from a missing trace afterwards
PLUGIN_FAILED_TAIL = [
    "[2026-12-01 21:44:43] Failed to execute general plugin: specdiff",
    "Traceback (most recent call last):",
    '  File "/x/sglang/srt/plugins/__init__.py", line 133, in load_plugins',
    "    func()",
    '  File "/x/specdiff/tracer/engines/sglang/hooks.py", line 53, in <module>',
    "    class Recorder(ServingRecorder):",
    "NameError: name 'ServingRecorder' is not defined",
    "[2026-12-01 21:44:43] Init parallel begin.",
]


def test_a_plugin_that_fails_to_load_is_named_and_the_untraced_server_stopped():
    from specdiff.tui.cmd_record import UntracedWatch

    stopped = []
    w = UntracedWatch(on_found=lambda: stopped.append(1))
    for line in PLUGIN_FAILED_TAIL + PLUGIN_FAILED_TAIL:  # every SGLang process logs it; one report
        w.feed(line)
    assert stopped == [1]
    assert w.reason == "specdiff's plugin failed to load in the server (NameError: name 'ServingRecorder' is not defined)"
    assert "specdiff installed" in w.action
    # an exception whose name the traceback pattern does not know: the next log line ends it
    odd = UntracedWatch()
    for line in PLUGIN_FAILED_TAIL[:6] + ["StopIteration", "[2026-12-01 21:44:43] Init parallel begin."]:
        odd.feed(line)
    assert odd.reason == "specdiff's plugin failed to load in the server (its traceback is in the server log above)"
    refused = UntracedWatch()
    refused.feed("[2026-12-01 10:00:00] specdiff: tracing refused: SPECDIFF_MAX_QUEUE_MB='x' is not valid; "
                 "the server runs untraced")
    assert refused.reason.startswith("the recorder refused to trace: SPECDIFF_MAX_QUEUE_MB='x' is not valid")
    # a traced server's log, errors included (a request's traceback), is not mistaken for an untraced one
    quiet = UntracedWatch()
    for line in SGLANG_TAIL + ["[t] Executed general plugin: specdiff", "Traceback (most recent call last):",
                               "ValueError: bad request"]:
        quiet.feed(line)
    assert quiet.reason is None


@pytest.mark.server
@pytest.mark.timeout(600)
def test_record_serve_stops_a_server_whose_recorder_refused_to_trace(repo_models, tmp_path, server_env):
    pytest.importorskip("sglang")
    from specdiff.tracer.engines.server import free_port
    from specdiff.tracer.engines.sglang.cpu.launch import SpecSettings

    trace = tmp_path / "serve.trace"
    argv = [sys.executable, "-m", "specdiff.tui", "record", "serve", "--cpu", "--trace", str(trace), "--",
            "--model-path", str(repo_models / "target"), "--port", str(free_port()),
            *SpecSettings(num_steps=3, topk=1, num_draft_tokens=4).args(repo_models / "draft")]
    r = subprocess.run(argv, env=server_env(SPECDIFF_MAX_QUEUE_MB="lots"), capture_output=True, text=True,
                       timeout=540)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("specdiff: error:")]
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert len(errors) == 1, r.stderr[-3000:]
    assert "ran untraced, so it was stopped: the recorder refused to trace: SPECDIFF_MAX_QUEUE_MB='lots'" in errors[0]
    assert not os.path.exists(trace)
