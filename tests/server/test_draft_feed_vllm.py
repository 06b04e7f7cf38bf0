"""A bug in what a later draft step is fed, put into a real vLLM 0.32.0 CPU server by a test-owned vLLM
general plugin (tests/server/bug_plugins/specdiff_vllm_feed_bugs.py: where it acts, and how it is loaded) and
found as a user finds it: the server traced by specdiff's recorder, ``record train --replay``, ``diff``. The
SGLang instances of the class: test_draft_feed_and_verify_bugs.py.

One eager server (``--enforce-eager``: the bug is in the proposer's Python, not the compiled forward), one
prompt, 32 new tokens.
"""

from __future__ import annotations

import json
import re

import pytest
from builders import train_and_diff
from support.bug_server import PLUGIN_DIR, entry_point_dir
from support.vllm_draft import vllm_draft
from support.vllm_server import ROOT, VLLM_PY, vllm_server

from specdiff.demo.run import REPO_MODELS, demo_prompts

SITE = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"), None) if VLLM_PY.exists() else None
NEW_TOKENS = 32

pytestmark = [pytest.mark.server, pytest.mark.slow,
              pytest.mark.skipif(SITE is None, reason="no vLLM venv at .venv-vllm (build it with `make vllm-venv`; "
                                                      "`make test` does)"),
              pytest.mark.skipif(not (REPO_MODELS / "draft" / "config.json").exists(),
                                 reason="the demo models are not built")]


def test_the_proposer_lines_the_plugin_relies_on_hold_what_it_says():
    """No engine: the installed wheel's lines where the plugin acts (its module doc)."""
    lines = (SITE / "v1" / "spec_decode" / "llm_base_proposer.py").read_text().splitlines()
    assert lines[719].strip() == "self.input_ids[:batch_size] = input_ids"  # :720, the step's fed ids
    assert lines[733].strip() == '"positions": self._get_positions(input_batch_size),'  # :734, after the copy
    assert lines[511].strip() == "def propose("


def test_a_stale_input_ids_buffer_on_vllm_feeds_depth_2_what_depth_1_was_fed(tmp_path, server_env):
    draft = vllm_draft(tmp_path / "draft")
    serve, log = tmp_path / "serve.trace", tmp_path / "server.log"
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread", SPECDIFF_TEST_BUG="stale_draft_input",
                     PYTHONPATH=f"{entry_point_dir(tmp_path / 'entry-points', 'vllm', 'specdiff_vllm_feed_bugs')}:{PLUGIN_DIR}")
    with vllm_server(tmp_path, draft, env, log=log) as server:
        server.generate(input_ids=demo_prompts(REPO_MODELS, 1), max_new_tokens=NEW_TOKENS)
    assert "specdiff_bug_plugins: stale_draft_input injected" in log.read_text()
    proc = train_and_diff(draft, serve, tmp_path / "train.trace")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, report["verdict"]
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.input_ids", 2), report["verdict"]
    cause = report["explanations"][0]
    assert cause["cause"] == "draft_input_stale" and "stale input-ids buffer" in cause["message"], cause
    assert cause["fix"]
    m = re.search(r"serving fed (\d+), training (\d+); serving fed depth 1 (\d+)$", cause["evidence"][1])
    assert m and m[1] == m[3] != m[2], cause["evidence"]
