"""Re-execution "reproduces" serving at the stage's measured noise floor, not at its tolerance (rerun/noise.py).

Real parts: the committed demo target and draft, ``record_train`` on both sides (2 demo prompts, 32 greedy
tokens, the noise floor measured as ``record train`` does by default). The "serving" side replays the
training sequences with a served draft that differs inside the tolerance:

- the draft config's ``rms_norm_eps`` 7e-05 (training 1e-06): ``draft.attn_in`` diverges as a shift (about
  4x its floor, every row inside rel 0.05). The re-run with training's eps on serving's inputs scored
  rel 0.0147 on the failing rows, inside the tolerance, and the report said "draft.attn_in is not a divergence
  ... inherited from serving's target.aux_cat and tokens" (serving's inputs were training's own);
- the draft's ``midlayer.hidden_norm.weight`` scaled by 1.03 (a norm weight re-scaled in conversion): the
  same class on the weights, ``draft.attn_in`` a shift of 5x its floor;
- ``rms_norm_eps`` 3e-05: only the top-k ids diverge; the re-run on serving's inputs (training's own) matched
  serving only through the ids' tie allowance the training-inputs run is not given, and the ids were called
  inherited from serving's inputs.

(A served draft ``rope_theta`` 11000 is not of this class on this pair: its failing ``draft.hidden_out`` rows
sit above the tolerance, rel 0.072, and the narrowing already proves them inside the draft's computation.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.diff.rerun import noise, reexec
from specdiff.replay.diff.rerun.narrow import BASE, UPSTREAM, Narrowing, Variant
from specdiff.replay.record.record_train import record_train

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


@pytest.fixture(scope="module")
def measured_pair(tmp_path_factory):
    """``serve(name, draft_dir) -> (train, serve)``: the training trace (2 demo prompts, 32 tokens, floor
    measured) and a serving side replaying it with the draft at ``draft_dir``."""
    root = tmp_path_factory.mktemp("reexec-noise")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in demo_prompts(REPO_MODELS, 2)))
    train = root / "train.trace"
    record_train(REPO_MODELS / "target", REPO_MODELS / "draft", str(train), prompts=prompts, max_new_tokens=32)

    def serve(name: str, draft) -> tuple:
        out = root / f"{name}.trace"
        record_train(REPO_MODELS / "target", draft, str(out), replay=str(train))
        return train, out

    return root, serve


def _config_copy(root, key: str, value) -> object:
    from tests.builders import draft_copy

    cfg = json.loads((REPO_MODELS / "draft" / "config.json").read_text())
    cfg[key] = value
    return draft_copy(REPO_MODELS / "draft", root / f"draft-{key}-{value}", config=cfg)


def _proven_inside_the_draft(report, stage: str, field: str) -> None:
    assert report.first is not None and report.first.name == stage
    (step,) = report.reexecution.steps
    assert step.stage == stage and step.outcome == reexec.NOT_REPRODUCED, step
    assert "noise floor" in step.reason and "x the rows' noise floors" in step.reason
    assert not report.comparisons[stage].stats.get("reproduced_by_reexecution")
    assert field in report.reexecution.narrowing.conclusion
    text = render_text(report)
    assert "not a divergence" not in text.split("\n\n")[0] and "inherited from serving's" not in text


@pytest.mark.slow
def test_a_served_rms_norm_eps_inside_the_tolerance_is_not_reproduced(measured_pair):
    root, serve = measured_pair
    train, srv = serve("eps-7e-05", _config_copy(root, "rms_norm_eps", 7e-05))
    report = diff_traces(str(train), str(srv))
    assert report.comparisons["draft.attn_in"].shift_only  # every failing row inside rel 0.05
    _proven_inside_the_draft(report, "draft.attn_in", "rms_norm_eps")
    assert "draft.attn_in" in report.reexecution.narrowing.limits


@pytest.mark.slow
def test_a_served_norm_weight_inside_the_tolerance_is_not_reproduced(measured_pair, scaled_copy):
    root, serve = measured_pair
    draft = scaled_copy(REPO_MODELS / "draft", root / "draft-hidden-norm", "midlayer.hidden_norm.weight", 1.03)
    train, srv = serve("hidden-norm-1.03", draft)
    report = diff_traces(str(train), str(srv))
    assert report.comparisons["draft.attn_in"].shift_only
    _proven_inside_the_draft(report, "draft.attn_in", "draft_weights")


@pytest.mark.slow
def test_ids_matched_only_by_their_tie_allowance_on_trainings_own_inputs_are_not_inherited(measured_pair):
    root, serve = measured_pair
    train, srv = serve("eps-3e-05", _config_copy(root, "rms_norm_eps", 3e-05))
    report = diff_traces(str(train), str(srv))
    assert report.first is not None and report.first.name == "draft.logits_topk.ids"
    (step,) = report.reexecution.steps
    assert step.outcome == reexec.NOT_RUN and "training's own" in step.reason
    assert not report.reexecution.inherited
    assert any("rms_norm_eps" in m.field for m in report.contract)


def _variant(name: str, reproduces: bool) -> Variant:
    return Variant(name, {"draft.hidden_out": 0.03 if reproduces else 0.1}, {"draft.hidden_out": reproduces}, reproduces)


def test_a_narrowing_that_cannot_decide_is_not_proof():
    """Nothing reproduces serving and the recorded contracts agree: the narrowing cannot decide (state the
    re-run does not take from the trace); re-execution must not call the stage proven."""
    n = Narrowing(("draft.hidden_out",), "draft.hidden_out", 100, rows=21, depth=0, decided=False,
                  conclusion="cannot decide: no serving input reproduces serving ... the recorded contracts agree",
                  variants=[_variant(BASE, False), _variant("serving's target.aux_cat", False),
                            _variant("every serving input", False)], upstream=_variant(UPSTREAM, False))
    step = reexec._step("draft.hidden_out", n, {})
    assert step.outcome == reexec.NOT_RUN and step.reason.startswith("cannot decide") and step.rows == 21
    # with a recorded difference named, the same runs are proof
    n.decided, n.contract_fields = True, ["draft_config.rms_norm_eps (1e-06 vs 7e-05)"]
    assert reexec._step("draft.hidden_out", n, {}).outcome == reexec.NOT_REPRODUCED


def test_a_step_judged_at_the_tolerance_says_the_floor_was_not_measured():
    lim = noise.Limit(0.05, None, "the tolerance rel <= 0.05: the pair's noise floor of draft.hidden_out is not measured")
    n = Narrowing(("draft.hidden_out",), "draft.hidden_out", 100, rows=8, depth=0,
                  variants=[_variant(BASE, False), _variant("serving's target.aux_cat", True),
                            _variant("every serving input", True)], upstream=_variant(UPSTREAM, True),
                  limits={"draft.hidden_out": lim.words})
    step = reexec._step("draft.hidden_out", n, {"draft.hidden_out": None})
    assert step.outcome == reexec.REPRODUCED and step.inputs == ("target.aux_cat",)
    assert "(mean rel 0.03; judged at the tolerance rel <= 0.05: the pair's noise floor" in step.reason
    assert "not measured" in step.reason


def test_the_limit_is_the_rows_noise_where_measured_and_the_tolerance_where_not():
    class Traces:  # a pair whose training side measured draft.attn_in's floor at 0.004
        def __init__(self, measured: bool):
            floor = {"method": "the recorded bfloat16 forward re-run in float32",
                     "tensors": {"draft.attn_in": {"median_rel": 0.004}}} if measured else {
                "method": None, "unmeasured": "record train --no-noise-floor"}
            side = type("Side", (), {"contract": {"noise_floor": floor, "dtype": "bfloat16"},
                                     "info": lambda self, name: type("I", (), {"dtype": "bfloat16"})()})
            self.x, self.y = side(), side()

    pair = noise.limit(Traces(True), "draft.attn_in", 0.05, None, 2)
    assert np.allclose(pair.floors, [0.004, 0.004]) and "the pair's 0.004" in pair.words
    assert pair.judge(np.array([0.0147, 0.0147]))[1] is False  # 3.7x the floor, inside the tolerance
    own = np.array([0.002, 0.03], np.float32)  # the second row's own bf16-vs-float32 error is 0.03
    lim = noise.limit(Traces(True), "draft.attn_in", 0.05, own, 2)
    assert np.allclose(lim.floors, [0.004, 0.03]) and "raised to the row's own error" in lim.words
    assert lim.judge(np.array([0.006, 0.05]))[1] is True  # 1.5x and 1.7x: at the noise
    assert lim.judge(np.array([0.011, 0.095]))[1] is False  # at the noise, but outside the tolerance
    unmeasured = noise.limit(Traces(False), "draft.attn_in", 0.05, own, 2)
    assert unmeasured.floors is None and "tolerance rel <= 0.05" in unmeasured.words and "not measured" in unmeasured.words
    assert unmeasured.judge(np.array([0.0147, 0.0147])) == (None, True)
