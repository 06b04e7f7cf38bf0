"""Windowed draft attention served by a real SGLang 0.5.23 CPU server: the demo draft trained within
SGLang's draft window 8 (``traces/models/draftw``: ``python -m specdiff.demo_models.train_draft --window 8``)
served with ``--speculative-draft-window-size 8`` (every draft layer's RadixAttention window,
srt/models/llama_eagle3.py:286-299) on prompts longer than the window.

- The serving contract records the window each live draft layer holds (``draft_attention_window``), and the
  trained draft really drafts (accept length well above 1).
- ``record train --draft-window 8`` computes SGLang's rule (eagle3/attention_window.py ``kv``): diff exit 0,
  no divergence, and the served option is not reported against the engine's default (the window both
  sides computed is compared instead).
- The same serving trace against a training side at another window (16) or at full attention: exit 1, first
  divergence ``draft.hidden_out``, the differing window named with its fix; for the full-attention side
  ``fix --verify`` writes the draft as it was with the option dropped, re-serves it (a second server start)
  and verifies the pair agrees.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from builders import serve_demo_prompts, train_and_diff

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.demo.verify_fix import served_options, training_options
from specdiff.tracer.store import open_trace

pytestmark = [pytest.mark.server, pytest.mark.slow]

DRAFT = REPO_MODELS / "draftw"
if not (DRAFT / "config.json").exists():
    pytest.skip("the windowed demo draft is not built (traces/models/draftw)", allow_module_level=True)
W = 8  # >= the 4 draft tokens SGLang requires (srt/arg_groups/speculative_hook.py:427-433)


def test_a_draft_trained_within_a_window_served_with_it_matches_the_reference_and_not_at_another_window(tmp_path):
    assert min(len(p) for p in demo_prompts(REPO_MODELS, 2)) > 2 * W  # the window hides keys of most rows
    serve, accepted = serve_demo_prompts(DRAFT, tmp_path, "--speculative-draft-window-size", str(W))
    assert min(a for a in accepted if a is not None) > 2.0, accepted  # trained within the window it is served with
    contract = open_trace(str(serve)).contract
    assert contract["draft_attention_window"] == [{"window": W, "distance": "kv"}]
    # what `fix --verify` serves the fixed draft with: the window again, none of the CPU recipe's flags
    assert served_options(contract) == ["--speculative-draft-window-size", str(W)]

    proc = train_and_diff(DRAFT, serve, tmp_path / "train.trace", "--draft-window", str(W))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["first_divergence"] is None, report["first_divergence"]
    assert training_options(open_trace(str(tmp_path / "train.trace")).contract) == ["--draft-window", str(W)]
    fields = {m["field"] for m in report["contract_mismatches"]}
    assert not {"draft_attention_window", "engine_options.speculative_draft_window_size"} & fields, fields

    proc = train_and_diff(DRAFT, serve, tmp_path / "w16.trace", "--draft-window", str(2 * W))  # another window
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["first_divergence"]["tensor"] == "draft.hidden_out", report["first_divergence"]
    assert "draft_attention_window" in {m["field"] for m in report["contract_mismatches"]}

    proc = train_and_diff(DRAFT, serve, tmp_path / "full.trace")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["first_divergence"]["tensor"] == "draft.hidden_out", report["first_divergence"]
    named = {m["field"]: m for m in report["contract_mismatches"]}
    assert "draft_attention_window" in named, sorted(named)
    assert "--speculative-draft-window-size" in named["draft_attention_window"]["fix"]

    # `fix --verify` on that pair: the option is the cause, so the fix is the served draft as it was, served
    # without the window (replay/fix/plan.py OPTION_PLANNERS); re-served and re-recorded, the pair agrees
    out = tmp_path / "fixed"
    fix = subprocess.run([sys.executable, "-m", "specdiff.tui", "fix", tmp_path / "full.trace", serve, "-o", out,
                          "--verify", "--format", "json"], capture_output=True, text=True, timeout=900)
    assert fix.returncode == 0, (fix.stdout[-3000:], fix.stderr[-3000:])
    done = json.loads(fix.stdout)
    assert done["cause"] == "contract.draft_attention_window" and done["config"] == done["tensors"] == []
    assert done["options"] == [{"flag": "--speculative-draft-window-size", "old": W, "new": None}]
    assert done["verify"]["verified"], done["verify"]["line"]
    reserved = open_trace(done["verify"]["traces"][1]).contract
    assert reserved["draft_attention_window"] == [None]  # served without the window this time
