"""State no checkpoint holds and a dead engine core on real vLLM 0.32.0 CPU servers (the SGLang servers:
test_overrides_and_state_servers.py, test_dead_servers.py), with the test plugin
tests/server/bug_plugins/specdiff_vllm_state_bugs.py; served ``--enforce-eager``.

- ``engine_exit_in_first_propose``: the process that drafts ends with ``os._exit`` as the first ``propose`` begins,
  no crash recorded. The trace it leaves was never closed and holds no request; ``diff`` against the training
  side of the same prompt says nothing was compared, what the trace holds, that it was not closed and that no
  crash is recorded, and exits 1.
- ``draft_rope_angles_negated``: the draft's rotary cache rotates the other way from the first ``propose`` on,
  after the recorder read the live models: no recorded fact sees it; the draft's attention output agrees at
  position 0 of every sequence and nowhere after, which the rows' structure names.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.bug_server import NEW_TOKENS, PLUGIN_DIR, diff_both, entry_point_dir, injected, specdiff
from support.vllm_draft import vllm_draft
from support.vllm_server import NEEDS_VLLM, vllm_server

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.tracer.store import open_trace

BUG = "engine_exit_in_first_propose"

pytestmark = [pytest.mark.server, pytest.mark.slow,
              NEEDS_VLLM,
              pytest.mark.skipif(not (REPO_MODELS / "draft" / "config.json").exists(),
                                 reason="the demo models are not built")]


def test_a_vllm_engine_core_that_exits_on_its_first_request_leaves_nothing_compared(tmp_path, server_env):
    draft = vllm_draft(tmp_path / "draft")
    serve = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread", SPECDIFF_TEST_BUG=BUG,
                     PYTHONPATH=f"{entry_point_dir(tmp_path / 'eps', 'vllm', 'specdiff_vllm_state_bugs')}:{PLUGIN_DIR}")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": demo_prompts(REPO_MODELS, 1)[0]}) + "\n")
    with vllm_server(tmp_path, draft, env) as srv:
        client = subprocess.run([sys.executable, "-m", "specdiff.tui", "record", "client", "--url", srv.url,
                                 "--prompts", str(prompts), "--max-new-tokens", "16"], capture_output=True, text=True,
                                timeout=300)
    assert injected(tmp_path, BUG)
    # vLLM's API server outlives its engine core and answers the request with its error
    assert client.returncode == 2 and "HTTP 500" in client.stderr and "EngineCore encountered an issue" in \
        client.stderr, client.stdout + client.stderr
    t = open_trace(str(serve))
    assert not t.closed and not t.sequences and "crash" not in t.contract, (t.closed, t.names, t.contract.get("crash"))
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", draft, "--prompts", prompts,
                   "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    d = specdiff("diff", train, serve)
    assert d.returncode == 1 and "Traceback" not in d.stderr, d.stdout + d.stderr[-2000:]
    lead = " ".join(d.stdout.split("\n\n")[0].split())
    assert lead.startswith("nothing compared: no tensor row of the 0 aligned sequences is held by both sides "
                           f"(training {open_trace(str(train)).records} records, serving {t.records}); serving trace "
                           f"cut off (not closed: it holds 0 sequences, {t.records} records"), lead
    assert "no crash recorded, so equivalence is not shown; record the serving side again: its server ended before " \
           "it wrote a request" in lead, lead


def test_the_drafts_rope_negated_on_vllm_after_the_recorder_read_it_is_named_by_the_rows_structure(tmp_path,
                                                                                                  server_env):
    bug = "draft_rope_angles_negated"
    draft = vllm_draft(tmp_path / "draft")
    serve = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread", SPECDIFF_TEST_BUG=bug,
                     PYTHONPATH=f"{entry_point_dir(tmp_path / 'eps', 'vllm', 'specdiff_vllm_state_bugs')}:{PLUGIN_DIR}")
    with vllm_server(tmp_path, draft, env) as srv:
        srv.generate(input_ids=demo_prompts(REPO_MODELS, 2), max_new_tokens=NEW_TOKENS)  # two: two positions 0
    assert injected(tmp_path, bug)
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", draft, "--replay", serve,
                   "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    tc, sc = open_trace(str(train)).contract, open_trace(str(serve)).contract
    assert sc["draft_rope"] == tc["draft_rope"]  # read at load, before the bug
    proc, report, text = diff_both(train, serve)
    assert proc.returncode == 1, text
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.hidden_out", 0) and first["pos"] > 0, first
    assert not any(report["tensors"][n]["diverged"] for n in report["tensors"] if n.startswith("target.aux")), text
    cause = report["explanations"][0]
    assert cause["cause"] == "position_dependent", cause
    assert cause["message"].startswith("draft.hidden_out agrees at position 0 of every sequence and differs from "
                                       "every later position"), cause["message"]
    assert "target_rope / draft_rope" in cause["fix"], cause["fix"]
