"""Unexplained is said, then narrowed: when no known cause fits the first divergence, the report says
"no known cause" and re-runs the training draft with each serving input grafted in.

Real parts: the committed demo target and draft, ``record_train`` on both sides; the "serving"
side replays the same sequences with one mistake no explainer knows (a fine-tuned target, or a
draft whose MLP weights changed).
"""

from __future__ import annotations

import json
import shutil

import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.diff.rerun.narrow import plan_narrowing
from specdiff.replay.record.record_train import record_train

pytestmark = pytest.mark.slow

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)



@pytest.fixture(scope="module")
def changed_mlp_pair(training_trace, scaled_copy):
    """(training trace, "serving" trace of the draft with its MLP down-projection scaled 1.5x): no
    known cause fits it, so the diff narrows."""
    root, train = training_trace
    draft = scaled_copy(REPO_MODELS / "draft", root / "draft-other", "midlayer.mlp.down_proj.weight", 1.5)
    serve = root / "draft-other.trace"
    record_train(REPO_MODELS / "target", draft, str(serve), replay=str(train), probe_positions=0)
    return train, serve


def test_a_changed_draft_mlp_is_narrowed_to_the_draft_itself(changed_mlp_pair):
    train, serve = changed_mlp_pair
    report = diff_traces(str(train), str(serve))
    assert report.first is not None and report.first.name.startswith("draft.")
    # no known cause is proven; the changed weight is named from the contract's weight fingerprints
    assert [e for e in report.explanations if not e.named_only] == []
    assert [e.cause for e in report.explanations][:1] == ["contract.draft_weights"]
    assert "midlayer.mlp.down_proj.weight" in report.explanations[0].message
    n = report.narrowing
    assert not isinstance(n, str), n
    assert [v.name for v in n.variants] == ["training inputs", "serving's target.aux_cat", "serving's draft.d2t",
                                            "every serving input"]
    assert not any(v.reproduces for v in n.variants)
    assert n.variants[0].scores["draft.fc_out"] < 0.01  # the re-run reproduces training where nothing differs
    assert "inside the draft's own computation" in n.conclusion and "draft_weights_sha256" in n.conclusion
    text = render_text(report)
    assert "explanation: no known mistake's transform closes the gap" in text
    assert "-> no serving input reproduces serving" in text


def test_a_fine_tuned_target_is_narrowed_to_the_aux_hidden_states(training_trace, scaled_copy):
    root, train = training_trace
    target = scaled_copy(REPO_MODELS / "target", root / "target-ft", "model.layers.2.mlp.down_proj.weight", 4.0)
    serve = root / "target-ft.trace"
    record_train(target, REPO_MODELS / "draft", str(serve), replay=str(train), probe_positions=0)
    report = diff_traces(str(train), str(serve))
    assert report.first.name == "target.aux.1"
    assert [e for e in report.explanations if not e.named_only] == []
    assert [e.cause for e in report.explanations][:1] == ["contract.target_weights"]
    assert report.explanations[0].message.startswith("target_weights.model.layers.2: ")  # per decoder layer
    n = report.narrowing
    assert not isinstance(n, str), n
    by = {v.name: v for v in n.variants}
    assert by["serving's target.aux_cat"].reproduces and not by["training inputs"].reproduces
    assert n.conclusion.startswith("substituting serving's target.aux_cat reproduces serving")
    assert "REPRODUCES serving" in render_text(report)


def test_without_the_draft_checkpoint_the_report_says_why_it_did_not_narrow(training_trace, tmp_path, scaled_copy,
                                                                            run_cli):
    root, train = training_trace
    draft = scaled_copy(REPO_MODELS / "draft", tmp_path / "gone", "midlayer.mlp.down_proj.weight", 1.5)
    trained = scaled_copy(REPO_MODELS / "draft", tmp_path / "trained", "midlayer.mlp.up_proj.weight", 1.0)
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    record_train(REPO_MODELS / "target", trained, str(a), replay=str(train), probe_positions=0)
    record_train(REPO_MODELS / "target", draft, str(b), replay=str(train), probe_positions=0)
    shutil.rmtree(trained)  # the training draft is not at hand any more
    report = diff_traces(str(a), str(b))
    assert isinstance(report.narrowing, str) and "not found" in report.narrowing
    assert "narrowing not run: draft checkpoint" in render_text(report)
    # the report says the working command (--draft did nothing without --graft) ...
    assert report.narrowing.endswith(f"pass the checkpoint: specdiff diff {a} {b} --draft DIR")
    assert [m.split(" recorded in ")[0] for m in report.unfound_paths] == [f"A: draft_name {trained}"]
    # ... and that command narrows
    again = scaled_copy(REPO_MODELS / "draft", tmp_path / "again", "midlayer.mlp.up_proj.weight", 1.0)
    r = run_cli("diff", a, b, "--draft", again, "--format", "json")
    narrowing = json.loads(r.stdout)["narrowing"]
    assert "not_run" not in narrowing and narrowing["variants"][0]["name"] == "training inputs", narrowing


def test_the_plan_says_what_it_reruns_compares_and_feeds_each_run(changed_mlp_pair):
    """``NarrowPlan.describe()``: the plan ``narrow`` carries out, said before any re-run (the stages
    compared, the depth, the failing rows, each run's inputs)."""
    train, serve = changed_mlp_pair
    report = diff_traces(str(train), str(serve), narrow=False)
    first = report.first
    plan = plan_narrowing(report.inputs, report.comparisons, first)
    assert str(plan) == plan.describe()
    assert (plan.divergence, plan.depth, plan.seqs, plan.from_stage) == ("draft.hidden_out", 0, [0], "draft.hidden_out")
    assert plan.judged == plan.stages[plan.stages.index("draft.hidden_out"):]
    *lines, fields = plan.describe().splitlines()
    # every input agrees (the draft's weights differ), so each substitution is run but never named; the
    # upstream run feeds serving's data to the draft's own vocab map and flags
    assert lines == [
        f"narrow draft.hidden_out: re-run the training draft through depth 0 on 1 sequence(s) (training seq 0; "
        f"{plan.positions} positions)",
        "compare draft.fc_in, draft.fc_out, draft.hidden_in, draft.attn_in, draft.hidden_out, draft.logits_topk.ids, "
        f"draft.topk, draft.topk_target with serving's {plan.rows} failing row(s) at depth 0; a run reproduces serving "
        "when every stage from draft.hidden_out on matches",
        "run 1. training inputs: target.aux_cat train, tokens train, draft.d2t train, norm flags train",
        "run 2. serving's target.aux_cat: target.aux_cat serve, tokens train, draft.d2t train, norm flags train"
        " (serving holds these inputs as training does: never named)",
        "run 3. serving's draft.d2t: target.aux_cat train, tokens train, draft.d2t serve, norm flags train"
        " (serving holds these inputs as training does: never named)",
        "run 4. every serving input: target.aux_cat serve, tokens serve, draft.d2t serve, norm flags serve"
        " (serving holds these inputs as training does: never named)",
        "run 5. serving's upstream inputs: target.aux_cat serve, tokens serve, draft.d2t train, norm flags train"
        " (the re-execution's verdict, not a variant)"]
    assert 1 <= plan.rows <= plan.positions
    assert fields == "differing contract fields: " + ", ".join(plan.contract_fields)
    assert fields.startswith("differing contract fields: draft_weights_sha256 (")
    assert "draft_weights.midlayer.mlp.down_proj.weight (" in fields
