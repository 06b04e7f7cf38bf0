"""Re-execution decides the verdict: a draft stage is the first divergence only
where the draft, re-run on serving's own inputs, does not reproduce serving there.

Real parts: the committed demo target and draft, ``record_train`` on both sides (as in
test_narrow.py). The "serving" side replays the training sequences with

- a target whose layer-2 MLP is scaled by 1.2: every aux slot stays inside its tolerance (max rel
  0.039 against 0.05), but the moved aux rows tip the draft's top-k ids on ~10 % of the rows. With the
  noise floor record train measures, the aux rows are a systematic shift: the first divergence is
  target.aux.1, named by the target's weights. Without floors (traces judged by rows alone), row
  comparison blamed the draft ("draft.logits_topk.ids ... the lm_head differs"); the draft re-run on
  serving's aux rows computes exactly serving's ids: inherited, not a divergence;
- a draft whose MLP changed (test_narrow's first case): no serving input reproduces serving, so the
  draft stage stays the first divergence, now proven;
- the same pair without the draft checkpoint: the re-run cannot run; today's judgement, marked.
"""

from __future__ import annotations

import json

import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.record.record_train import record_train

pytestmark = pytest.mark.slow

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)



def test_a_draft_stage_serving_inputs_reproduce_is_not_the_first_divergence(training_trace, scaled_copy, run_cli):
    root, measured = training_trace
    target = scaled_copy(REPO_MODELS / "target", root / "target-near", "model.layers.2.mlp.down_proj.weight", 1.2)
    # with each side's noise floor measured (record train's default), the target's other weights are what they
    # are: every aux row after layer 2 moved well above the floor, inside rel 0.05 (judge/shift.py)
    near = root / "target-near-measured.trace"
    record_train(target, REPO_MODELS / "draft", str(near), replay=str(measured), probe_positions=0)
    shifted = diff_traces(str(measured), str(near))
    assert shifted.first is not None and shifted.first.name == "target.aux.1" and shifted.first.shift_only
    assert shifted.explanations[0].cause == "contract.target_weights"
    # traces without a floor (--no-noise-floor, or recorded before it) are judged by their rows: there the
    # draft is what re-execution decides about
    train, serve = root / "train-nofloor.trace", root / "target-near.trace"
    record_train(REPO_MODELS / "target", REPO_MODELS / "draft", str(train), replay=str(measured), probe_positions=0,
                 noise_floor=False)
    record_train(target, REPO_MODELS / "draft", str(serve), replay=str(measured), probe_positions=0,
                 noise_floor=False)
    # judged by rows alone, the draft is blamed ...
    rows_only = diff_traces(str(train), str(serve), narrow=False)
    assert rows_only.first is not None and rows_only.first.name == "draft.logits_topk.ids"
    assert not any(c.diverged for n, c in rows_only.comparisons.items() if n.startswith("target.aux"))
    # ... re-executed on serving's inputs, it computes what serving did: no divergence, exit 0
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 0, r.output[-3000:]
    js = json.loads(r.stdout)
    assert js["report_format"] == 1 and js["first_divergence"] is None and not js["diverged"]
    (step,) = js["reexecution"]
    assert step["stage"] == "draft.logits_topk.ids" and step["outcome"] == "reproduced"
    assert step["inputs"] == ["target.aux_cat"] and step["rows"] > 0
    assert "draft.logits_topk.ids is not a divergence" in js["verdict"] and "serving's target.aux_cat" in js["verdict"]
    # the recorded fact that differs still leads the report: another target's weights
    assert "contract differs: target_weights.model.layers.2" in js["verdict"]
    text = run_cli("diff", train, serve)
    assert text.exit_code == 0 and text.stdout.startswith("no divergence")
    assert "draft.logits_topk.ids: not a divergence, inherited from serving's inputs" in text.stdout


def test_a_changed_draft_mlp_stays_the_first_divergence_proven(training_trace, scaled_copy):
    root, train = training_trace
    draft = scaled_copy(REPO_MODELS / "draft", root / "draft-mlp", "midlayer.mlp.down_proj.weight", 1.5)
    serve = root / "draft-mlp.trace"
    record_train(REPO_MODELS / "target", draft, str(serve), replay=str(train), probe_positions=0)
    report = diff_traces(str(train), str(serve))
    assert report.first is not None and report.first.name.startswith("draft.")
    (step,) = report.reexecution.steps
    assert step.stage == report.first.name and step.outcome == "not_reproduced"
    assert report.narrowing is not None and not isinstance(report.narrowing, str)  # the same re-run, reused
    assert not report.narrowing.upstream.reproduces
    assert "the first divergence, proven by re-execution" in render_text(report)
    # without the draft checkpoint the re-run cannot run: today's judgement, marked as such
    gone = diff_traces(str(train), str(serve), draft_path=str(root / "no-such-draft"))
    assert gone.first.name == report.first.name
    (step,) = gone.reexecution.steps
    assert step.outcome == "not_run" and "not found" in step.reason
    assert "judged by its rows (re-execution could not decide)" in render_text(gone)
    assert gone.to_json()["reexecution"][0]["outcome"] == "not_run"
