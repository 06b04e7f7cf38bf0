"""Serving bugs in what a later draft step is fed and in what the verify accepts, put into a real SGLang 0.5.23
CPU server by the test bug plugin (tests/server/bug_plugins/specdiff_feed_bugs.py says where each acts) and
found as a user finds them: the server traced, ``record train --replay``, ``diff``.

- What the draft is fed at depth >= 1: the step is fed another id than the one its previous step selected
  (the verify tree keeps the selection). The diff compares those rows where serving's own pick was the
  teacher's token (replay/diff/compare/fed_path.py) and names the first divergence at ``draft.input_ids``
  with both ids and what turns one into the other (replay/diff/explain/draft_inputs.py).
- What the verify accepts: no tensor of either model changes, only how many drafts a verify step accepts;
  ``diff`` exits 1 with "the outcome differs" naming the depths (replay/diff/compare/outcome.py).

One server per kind (the recorder writes one trace per server process), one prompt, no repeat. The feed
bugs get ``FEED_TOKENS`` new tokens, the verify bugs ``VERIFY_TOKENS``: a depth's gap is a verdict at an exact
McNemar p < 1e-3, which takes at least 11 verify steps that disagree in one direction.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.bug_server import diff_both, injected, serve_traced

from specdiff.demo.run import REPO_MODELS
from specdiff.demo.scenarios import write_served_draft

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)

#: the depth-2 rows compared need verify steps whose depth-1 pick was the teacher's token
FEED_TOKENS = 32
#: under these bugs the demo pair accepts 2-3 tokens a step: 64 tokens give 22-32 verify steps (measured at 48
#: tokens: 17 steps, 13 of them accepting the last draft on training's side only)
VERIFY_TOKENS = 64


@pytest.fixture(scope="module")
def served_draft(tmp_path_factory) -> Path:
    return write_served_draft("correct", REPO_MODELS / "draft", tmp_path_factory.mktemp("draft") / "draft")


def found(tmp_path: Path, served_draft: Path, server_env, bug: str, new_tokens: int) -> tuple[dict, str]:
    """Serve one prompt with ``bug``, diff: the plugin said the bug acted and ``diff`` exits 1. Returns the
    JSON report and the text one."""
    train, serve = serve_traced(tmp_path, served_draft, server_env, bug, prompts=1, repeats=1,
                                new_tokens=new_tokens)
    proc, report, text = diff_both(train, serve)
    assert injected(tmp_path, bug)
    assert proc.returncode == 1, text
    return report, text


def fed_example(cause: dict) -> tuple[int, int, str]:
    """(serving's fed id, training's id, what relates them) of the explanation's example row."""
    m = re.search(r"serving fed (\d+), training (\d+); (.*)$", cause["evidence"][1])
    assert m, cause["evidence"]
    return int(m[1]), int(m[2]), m[3]


def test_a_stale_input_ids_buffer_feeds_depth_2_what_depth_1_was_fed(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "stale_draft_input", FEED_TOKENS)
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.input_ids", 2), first
    assert text.startswith("first divergence: draft.input_ids")
    cause = report["explanations"][0]
    assert cause["cause"] == "draft_input_stale", cause
    assert "fed the later draft step the id it had fed the step before it" in cause["message"]
    assert "stale input-ids buffer" in cause["message"] and cause["fix"]
    assert cause["evidence"][0].startswith("100.0% of"), cause["evidence"]
    served, trained, how = fed_example(cause)
    assert how == f"serving fed depth 1 {served}" and served != trained, cause["evidence"]


def test_the_previous_pick_mapped_to_the_target_vocabulary_twice(tmp_path, served_draft, server_env):
    from safetensors import safe_open

    report, text = found(tmp_path, served_draft, server_env, "draft_input_mapped_twice", FEED_TOKENS)
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.input_ids", 1), first
    cause = report["explanations"][0]
    assert cause["cause"] == "draft_input_mapped_twice", cause
    assert "mapped the previous pick to the target vocabulary twice" in cause["message"] and cause["fix"]
    served, trained, how = fed_example(cause)
    with safe_open(str(REPO_MODELS / "draft" / "model.safetensors"), framework="pt") as f:
        d2t = f.get_tensor("d2t").long().numpy()
    assert how == f"d2t[{trained}] = {d2t[trained]}" and served == trained + d2t[trained] != trained, cause


def outcome(report: dict) -> dict[int, dict]:
    """The depths ``the outcome differs`` names: depth -> its paired counts."""
    assert report["first_divergence"] is None and report["verdict"].startswith("the outcome differs"), report["verdict"]
    return {d["depth"]: d for d in report["outcome_differs"]}


def test_a_verify_that_accepts_at_most_one_draft_is_an_outcome_gap(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "accept_capped", VERIFY_TOKENS)
    gaps = outcome(report)
    assert sorted(gaps) == [2, 3], gaps  # depth 1 is accepted as training accepts it
    assert all(d["serving"] == 0 and d["training"] >= 11 for d in gaps.values()), gaps
    assert "depth 2: serving 0.00, training" in report["verdict"] and "depth 3: serving 0.00" in report["verdict"]
    assert text.startswith("the outcome differs: no tensor diverged, yet serving accepts differently")


def test_a_last_draft_the_verify_never_gets_is_an_outcome_gap_at_the_last_depth(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "last_draft_mangled", VERIFY_TOKENS)
    gaps = outcome(report)
    assert sorted(gaps) == [3], gaps
    d = gaps[3]  # accepted only where the last two drafts repeat a token
    assert d["only_training"] >= 11 and d["serving"] <= d["steps"] // 10, d
    assert "depth 3: serving 0." in report["verdict"] and "depth 2" not in report["verdict"].split("serving rows")[0]
