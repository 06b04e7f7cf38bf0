"""``NarrowPlan.describe()``: the plan ``narrow`` carries out, said before any re-run (the stages compared,
the depth, the failing rows, each run's inputs).

Real parts: the committed demo target and draft, ``record_train`` on both sides; the "serving" side is the
draft with its MLP down-projection scaled (no known cause fits it, so the diff narrows).
"""

from __future__ import annotations

import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.rerun.narrow import plan_narrowing
from specdiff.replay.record.record_train import record_train

pytestmark = pytest.mark.slow

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


def test_the_plan_says_what_it_reruns_compares_and_feeds_each_run(training_trace, scaled_copy):
    root, train = training_trace
    draft = scaled_copy(REPO_MODELS / "draft", root / "draft-plan", "midlayer.mlp.down_proj.weight", 1.5)
    serve = root / "draft-plan.trace"
    record_train(REPO_MODELS / "target", draft, str(serve), replay=str(train), probe_positions=0)
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
