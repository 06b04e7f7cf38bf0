"""Every difference named (replay/diff/explain/differences.py): where no known mistake's transform closes the
gap at the first divergence, the explanation names the recorded facts that differ and act at or before
that stage, with the fact table's fix, or "stage unknown"; they are named, not proven, so the narrowing
still runs after them. Synthetic pairs (tests/builders.py ``dataflow_pair``): serving's rows of one tensor
moved, one or more contract facts different."""

from __future__ import annotations

from builders import dataflow_pair

from specdiff.replay.diff.contract.facts import fact_row
from specdiff.replay.diff.pipeline import diff_traces, narrowing
from specdiff.replay.diff.report import render_text

BASE = {"hidden_size": 16, "draft_hidden_size": 16, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16"}
TRAIN = {"engine": "specdiff-reference"}
WINDOW = {"engine": "sglang", "engine_options_given": {"speculative_draft_window_size": {"value": 4, "default": None}}}


def _diff(tmp_path, *, serve: dict, train: dict | None = None, moved: str = "draft.hidden_out", nan: bool = False):
    a, b = dataflow_pair(tmp_path, contract=BASE, train={**TRAIN, **(train or {})}, serve=serve, moved=moved, nan=nan)
    return diff_traces(a, b, narrow=False)


def test_a_server_option_that_changes_the_drafts_attention_is_named_with_its_fix(tmp_path):
    report = _diff(tmp_path, serve=WINDOW)
    assert report.first.name == "draft.hidden_out" and not report.comparisons["draft.attn_in"].diverged
    (e,) = report.explanations
    assert e.cause == "contract.engine_options" and e.named_only
    assert e.message.startswith("engine_options.speculative_draft_window_size: training None (SGLang's default, what "
                                "the reference computes), serving 4 (given)")
    assert e.message.endswith("(acts from draft.hidden_out) — no known mistake's transform closes the gap at "
                              "draft.hidden_out")
    assert e.fix == fact_row("engine_options.speculative_draft_window_size").fix
    text = render_text(report)
    assert "no known cause" not in text
    assert "explanation: no known mistake's transform closes the gap; the recorded facts that differ" in text
    assert report.verdict().startswith("first divergence: draft.hidden_out at seq 0 pos 1 — engine_options."
                                       "speculative_draft_window_size")


def test_a_difference_no_table_lists_is_named_with_stage_unknown(tmp_path):
    report = _diff(tmp_path, serve={"draft_quirk": 2}, train={"draft_quirk": 1})
    (e,) = report.explanations
    assert e.cause == "unlisted_difference" and e.named_only
    assert e.message.startswith("unlisted difference: draft_quirk: training 1, serving 2; stage unknown")
    assert e.message.endswith("stage unknown — no known mistake's transform closes the gap at draft.hidden_out")
    assert "stage unknown" in e.fix


def test_the_nearest_fact_comes_first_and_an_unlisted_one_last(tmp_path):
    serve = {**WINDOW, "draft_quirk": 2, "draft_config": {"rms_norm_eps": 1e-5}}
    report = _diff(tmp_path, serve=serve, train={"draft_quirk": 1, "draft_config": {"rms_norm_eps": 1e-6}})
    # rms_norm_eps acts at draft.attn_in, whose rows agree: it changed nothing there, so it is not named
    assert [e.message.split(":")[0] for e in report.explanations] == [
        "engine_options.speculative_draft_window_size", "unlisted difference"]


def test_a_fact_acting_where_the_rows_were_not_recorded_is_named(tmp_path):
    report = _diff(tmp_path, serve={"draft_weights": {"fc.weight": "b" * 16}}, train={"draft_weights": {"fc.weight":
                                                                                                            "a" * 16}})
    (e,) = report.explanations  # fc acts at draft.fc_out, which this pair does not record
    assert e.cause == "contract.draft_weights" and "(acts from draft.fc_out)" in e.message


def test_other_target_decoder_weights_are_named_where_the_aux_diverge(tmp_path):
    layers = {f"model.layers.{i}": f"{i:016x}" for i in range(8)}
    report = _diff(tmp_path, serve={"target_weights": {**layers, "model.layers.3": "e" * 16}},
                   train={"target_weights": layers}, moved="target.aux.1")
    assert report.first.name == "target.aux.1"
    causes = [e.cause for e in report.explanations]
    assert "contract.target_weights" in causes, causes
    e = report.explanations[causes.index("contract.target_weights")]
    assert e.message.startswith("target_weights.model.layers.3: training fingerprint") and e.fix == fact_row(
        "target_weights.model.layers.3").fix


def test_unloaded_parameters_explain_non_finite_values(tmp_path):
    left = ["model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    report = _diff(tmp_path, serve={"draft_unloaded": left, "draft_config": {"num_hidden_layers": 2}},
                   train={"draft_unloaded": [], "draft_config": {"num_hidden_layers": 1}}, nan=True)
    e = report.explanations[0]
    assert e.cause == "unloaded_params" and not e.named_only
    assert "serving's engine built parameters its checkpoint did not provide, left as allocated" in e.message
    assert "num_hidden_layers = the decoder layers it holds" in e.fix
    fields = {m.field for m in report.contract}
    assert {"draft_config.num_hidden_layers", "draft_unloaded.model.layers.1"} <= fields


def test_named_differences_leave_the_narrowing_to_run(tmp_path):
    report = _diff(tmp_path, serve=WINDOW)
    assert report.explanations and all(e.named_only for e in report.explanations)
    assert narrowing(report) is not None  # run (here: the reason it could not, no models at hand)
