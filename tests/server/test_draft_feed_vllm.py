"""A bug in what a later draft step is fed, and one in what the verify accepts, put into a real vLLM 0.32.0 CPU
server by a test-owned vLLM general plugin (tests/server/bug_plugins/specdiff_vllm_feed_bugs.py: where each
acts, and how it is loaded) and found as a user finds them: the server traced by specdiff's recorder,
``record train --replay``, ``diff``. The SGLang instances of these classes: test_draft_feed_and_verify_bugs.py.

One eager server per bug (``--enforce-eager``: the bugs are in the proposer's and the rejection sampler's
Python, not the compiled forward), one prompt. The feed bug gets ``FEED_TOKENS`` new tokens, the verify bug
``VERIFY_TOKENS``: a depth's gap is a verdict at an exact McNemar p < 1e-3, which takes at least 11 verify steps
that disagree in one direction.
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
#: the depth-2 rows compared need verify steps whose depth-1 pick was the teacher's token
FEED_TOKENS = 32
#: capped at one accepted draft serving commits at most 2 tokens a verify step: 64 tokens gave 32 verify steps,
#: 28 (depth 2) and 25 (depth 3) of them accepted on training's side only
VERIFY_TOKENS = 64

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


def test_the_rejection_sampler_lines_the_plugin_relies_on_hold_what_it_says():
    """No engine: the installed wheel's lines where ``accept_capped`` acts (the plugin's module doc)."""
    lines = (SITE / "v1" / "sample" / "rejection_sampler.py").read_text().splitlines()
    assert lines[37].strip() == "PLACEHOLDER_TOKEN_ID: tl.constexpr = -1"  # :38, a column past the accepted
    assert lines[105].strip() == "def forward("  # :106, RejectionSampler.forward
    assert lines[187].strip() == "output_token_ids = rejection_sample("  # :188, a module global looked up per call
    assert lines[409].strip() == "def rejection_sample("  # :410
    assert lines[443:445] == ["    output_token_ids = torch.full(", "        (batch_size, max_spec_len + 1),"]


def served(tmp_path, server_env, bug: str, new_tokens: int):
    """Serve one demo prompt for ``new_tokens`` on an eager vLLM server with ``bug`` put in, traced, then
    ``record train --replay`` and ``diff --format json``: the diff's process. The plugin must have said the
    bug acted."""
    draft = vllm_draft(tmp_path / "draft")
    serve, log = tmp_path / "serve.trace", tmp_path / "server.log"
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread", SPECDIFF_TEST_BUG=bug,
                     PYTHONPATH=f"{entry_point_dir(tmp_path / 'entry-points', 'vllm', 'specdiff_vllm_feed_bugs')}:{PLUGIN_DIR}")
    with vllm_server(tmp_path, draft, env, log=log) as server:
        server.generate(input_ids=demo_prompts(REPO_MODELS, 1), max_new_tokens=new_tokens)
    assert f"specdiff_bug_plugins: {bug} injected" in log.read_text()
    return train_and_diff(draft, serve, tmp_path / "train.trace")


def test_a_stale_input_ids_buffer_on_vllm_feeds_depth_2_what_depth_1_was_fed(tmp_path, server_env):
    proc = served(tmp_path, server_env, "stale_draft_input", FEED_TOKENS)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, report["verdict"]
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.input_ids", 2), report["verdict"]
    cause = report["explanations"][0]
    assert cause["cause"] == "draft_input_stale" and "stale input-ids buffer" in cause["message"], cause
    assert cause["fix"]
    m = re.search(r"serving fed (\d+), training (\d+); serving fed depth 1 (\d+)$", cause["evidence"][1])
    assert m and m[1] == m[3] != m[2], cause["evidence"]


def test_a_rejection_sampler_capped_at_one_draft_on_vllm_is_an_outcome_gap(tmp_path, server_env):
    proc = served(tmp_path, server_env, "accept_capped", VERIFY_TOKENS)
    report = json.loads(proc.stdout)
    print(report["verdict"], report.get("outcome_differs"))  # kept in the test log: the measured counts
    assert proc.returncode == 1, report["verdict"]
    assert report["first_divergence"] is None, report["first_divergence"]
    assert report["verdict"].startswith("the outcome differs"), report["verdict"]
    gaps = {d["depth"]: d for d in report["outcome_differs"]}
    assert sorted(gaps) == [2, 3], gaps  # depth 1 is accepted as training accepts it
    assert all(d["serving"] == 0 and d["only_training"] >= 11 for d in gaps.values()), gaps
    assert "depth 2: serving 0.00, training" in report["verdict"] and "depth 3: serving 0.00" in report["verdict"]
