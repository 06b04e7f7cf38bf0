"""Re-execution reproduces serving at the stage's measured noise, not at its tolerance, on a real SGLang 0.5.23
CPU server (replay/diff/rerun/noise.py).

Each server serves a draft checkpoint that differs from the trained one by a weight scaled inside the
stage's 5 % tolerance (a norm or projection re-scaled in a conversion), with no plugin: the shift is small
enough that a re-run judged at the tolerance would "reproduce" serving with training's own weights and
move the stage past as inherited from serving's inputs, which were training's own. Judged at the noise,
the stage stays the first divergence, proven by re-execution, and the contract's per-tensor weight
fingerprint names the checkpoint and its fix:

- ``midlayer.hidden_norm.weight`` x1.03: the norm of the fc output, half of the attention input, so
  ``draft.attn_in`` shifts (the fc output before it agrees);
- ``fc.weight`` x1.03: ``draft.fc_out`` shifts by 3 % on every row; the hidden norm after it takes the
  scale out again, so what follows agrees within the noise.

One prompt, served once, 16 new tokens (``--chunked-prefill-size 16``, bf16), the training side recorded
with ``record train --replay`` of the trained draft (its noise floor measured, as by default). vLLM 0.32.0
serves the fc instance too (``--enforce-eager``: the draft's fc is the same module compiled or not; vLLM records
no ``draft.attn_in``, which it computes inside the compiled draft forward, so a norm instance would be judged
at ``draft.hidden_out`` there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.bug_server import diff_both, serve_traced, specdiff
from support.vllm_server import NEEDS_VLLM, vllm_server

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.demo.scenarios import write_served_draft

#: the weight every instance scales: inside the 5 % tolerance, several times the bf16 noise floor (about 0.004)
SCALE = 1.03

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


@pytest.fixture(scope="module")
def served_draft(tmp_path_factory):
    return write_served_draft("correct", REPO_MODELS / "draft", tmp_path_factory.mktemp("draft") / "draft")


def proven(train: Path, serve: Path, weight: str, stage: str) -> tuple[dict, str]:
    """Diff a training trace against a serving trace whose draft had ``weight`` x``SCALE``: exit 1, ``stage``
    the first divergence as a shift inside its tolerance, proven by re-execution at the rows' noise floors
    (never "inherited" or "no divergence"), the weight's fingerprint the contract difference with its fix.
    Returns the JSON report and the text."""
    proc, report, text = diff_both(train, serve)
    assert proc.returncode == 1, text
    first = report["first_divergence"]
    assert first is not None and first["tensor"] == stage, text
    assert first["stats"]["max_rel"] <= first["tolerance"]["rel"], first  # every row inside the tolerance
    steps = {s["stage"]: s for s in report.get("reexecution", [])}
    assert steps[stage]["outcome"] == "not_reproduced", steps
    assert "x the rows' noise floors" in steps[stage]["reason"], steps[stage]
    assert not any(s["outcome"] == "reproduced" for s in steps.values()), steps
    assert stage not in report["inherited"], report["inherited"]
    verdict = text.split("\n\n")[0]
    assert verdict.startswith(f"first divergence: {stage}"), verdict
    assert "not a divergence" not in verdict and "inherited from serving's" not in verdict, verdict
    (mismatch,) = [m for m in report["contract_mismatches"]
                   if m["field"].startswith("draft_weights.") and m["field"].endswith(weight)]
    assert stage in mismatch["stages"] and mismatch["fix"] == "serve the draft checkpoint that was trained", mismatch
    assert mismatch["field"] in first["contract_bearing"], first
    cause = report["explanations"][0]
    assert cause["cause"] == "contract.draft_weights" and cause["fix"] == mismatch["fix"], cause
    return report, text


def on_sglang(tmp_path, served_draft, server_env, scaled_copy, weight: str) -> tuple[Path, Path]:
    """(train, serve) traces of ``served_draft`` with ``weight`` x``SCALE`` on SGLang against the trained draft."""
    draft = scaled_copy(served_draft, tmp_path / "scaled-draft", weight, SCALE)
    return serve_traced(tmp_path, draft, server_env, None, prompts=1, repeats=1)


def test_a_served_hidden_norm_scaled_inside_the_tolerance_is_proven_at_the_attention_input(
        tmp_path, served_draft, server_env, scaled_copy):
    traces = on_sglang(tmp_path, served_draft, server_env, scaled_copy, "midlayer.hidden_norm.weight")
    report, _ = proven(*traces, "midlayer.hidden_norm.weight", "draft.attn_in")
    assert report["tensors"]["draft.fc_out"]["diverged"] is False  # the norm's input agrees


def test_a_served_fc_scaled_inside_the_tolerance_is_proven_at_the_fc_output(
        tmp_path, served_draft, server_env, scaled_copy):
    report, _ = proven(*on_sglang(tmp_path, served_draft, server_env, scaled_copy, "fc.weight"), "fc.weight",
                       "draft.fc_out")
    assert report["tensors"]["draft.fc_in"]["diverged"] is False  # the target's aux rows agree


@NEEDS_VLLM
def test_a_fc_scaled_inside_the_tolerance_on_vllm_is_proven_at_the_fc_output(tmp_path, server_env, scaled_copy):
    from builders import draft_copy

    from specdiff.demo.scenarios import scenario_ids
    from specdiff.eagle3.config_keys import set_config_value
    cfg = json.loads((REPO_MODELS / "draft" / "config.json").read_text())
    ids = scenario_ids(engine="vllm")  # the aux ids in vLLM's key and numbering, as trained
    set_config_value(cfg, ids.key, list(ids.correct))
    trained = draft_copy(REPO_MODELS / "draft", tmp_path / "draft", config=cfg)
    served = scaled_copy(trained, tmp_path / "scaled-draft", "fc.weight", SCALE)
    serve = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread")
    with vllm_server(tmp_path, served, env) as server:
        server.generate(input_ids=demo_prompts(REPO_MODELS, 1), max_new_tokens=16)
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", trained, "--replay", serve,
                   "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    report, _ = proven(train, serve, "fc.weight", "draft.fc_out")
    assert report["tensors"]["draft.fc_in"]["diverged"] is False
