"""Engine-aware explanations on hand-built traces whose contracts say which engine
recorded them: the aux fix in the diverging engine's terms, the default fallback named from the
contract, serve-vs-serve sides named by engine and version, and the culprit engine said."""

from __future__ import annotations

import numpy as np
import pytest

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_json

VLLM = {"engine": "vllm", "engine_version": "0.32.0",
        "engine_runner": "v1 vllm.v1.worker.cpu_model_runner.CPUModelRunner"}
SGLANG = {"engine": "sglang", "engine_version": "0.5.23"}


@pytest.fixture
def write(aux_traces, monkeypatch):
    """``write(path, facts, side=..., hf=..., ...)``: ``aux_traces.write`` with ``facts`` added to the
    trace's contract (the writer is the real TraceWriter, its contract merged at creation)."""
    from specdiff.tracer import store

    base = store.TraceWriter

    def _write(path, facts, *, accept=None, **kw):
        """``accept``: every sequence also gets verify.accept_length rows of that value."""
        class _Writer(base):
            def __init__(self, *a, contract=None, **k):
                super().__init__(*a, contract={**(contract or {}), **facts}, **k)

            def add_sequence(self, tokens, **k):
                sid = super().add_sequence(tokens, **k)
                if accept is not None:
                    for p in range(4, len(tokens), accept):
                        self.append("verify.accept_length", np.array([accept]), seq=sid, pos=p)
                return sid

        monkeypatch.setattr(store, "TraceWriter", _Writer)
        try:
            return aux_traces.write(path, **kw)
        finally:
            monkeypatch.setattr(store, "TraceWriter", base)
    return _write


def test_a_vllm_layer_shift_gets_the_fix_in_vllms_key_and_numbering(tmp_path, write):
    """The seed's mistake in vLLM's numbering: trained on HF [0, 3, 6], vLLM captured [1, 4, 7]
    (ids [1, 4, 7] at the top level): the fix writes [0, 3, 6] into the top-level key (id = HF)."""
    a = write(tmp_path / "a", {}, side="train", hf=[0, 3, 6], probes=True)
    b = write(tmp_path / "b", {**VLLM, "aux_native_ids": [1, 4, 7],
                               "aux_ids_source": "top-level eagle_aux_hidden_state_layer_ids"},
              side="serve", hf=[1, 4, 7])
    report = diff_traces(a, b)
    assert report.first.name.startswith("target.aux")
    [cause] = report.explanations
    assert cause.cause == "aux_layer_shift"
    assert cause.fix == ("set the draft config's top-level eagle_aux_hidden_state_layer_ids to [0, 3, 6] "
                         "(vLLM id = HF index)")
    assert "every layer off by one (vLLM id k = HF k; SGLang id k captures HF k+1)" in cause.message
    assert "eagle_config" not in cause.fix and "fell back" not in cause.message


def test_the_same_shift_on_sglang_keeps_sglangs_fix(tmp_path, write):
    a = write(tmp_path / "a", {}, side="train", hf=[0, 3, 6], probes=True)
    b = write(tmp_path / "b", SGLANG, side="serve", hf=[1, 4, 7])
    [cause] = diff_traces(a, b).explanations
    assert cause.fix.startswith("set the draft config's eagle_config.eagle_aux_hidden_state_layer_ids to [-1, 2, 5]")
    assert "SGLang id k captures HF k+1, vLLM/speculators id k = HF k" in cause.message


def test_vllms_default_fallback_is_named_from_the_contract_even_when_no_layer_matches(tmp_path, write):
    """vLLM V1 read no ids (they sat in a key it ignores) and captured its default HF [2, 4, 5]; the
    other side holds none of those layers, so no transform closes the gap: the contract says why."""
    a = write(tmp_path / "a", {}, side="train", hf=[0, 3, 6])
    b = write(tmp_path / "b", {**VLLM, "aux_native_ids": None, "aux_ids_source":
                               "default fallback get_eagle3_default_aux_hidden_state_layers (2, L//2, L-3)"},
              side="serve", hf=[2, 4, 5])
    report = diff_traces(a, b)
    [cause] = report.explanations
    assert cause.cause == "aux_ids_default"
    assert ("vLLM V1 read no ids from top-level eagle_aux_hidden_state_layer_ids or eagle_config."
            "eagle_aux_hidden_state_layer_ids or dflash_config.target_layer_ids: it fell back to its default "
            "HF [2, 4, 5]") in cause.message
    assert cause.fix.endswith("top-level eagle_aux_hidden_state_layer_ids to [0, 3, 6] (vLLM id = HF index)")
    assert any("aux_ids_source" in e for e in cause.evidence)


def test_without_a_fallback_and_no_matching_layer_nothing_is_claimed(tmp_path, write):
    a = write(tmp_path / "a", {}, side="train", hf=[0, 3, 6])
    b = write(tmp_path / "b", {**VLLM, "aux_ids_source": "top-level eagle_aux_hidden_state_layer_ids"},
              side="serve", hf=[2, 4, 5])
    report = diff_traces(a, b)
    # nothing is claimed as the cause; the differing layer list is named (every difference is named),
    # marked as named, not proven, so the narrowing still runs
    assert [e.cause for e in report.explanations if not e.named_only] == []
    assert [e.cause for e in report.explanations] == ["contract.aux_hf_indices"]


@pytest.mark.parametrize("culprit", ["x", "y"])
def test_serve_vs_serve_names_the_sides_by_engine_and_says_whose_config_causes_it(tmp_path, write, culprit):
    """SGLang captured the trained HF [0, 3, 6]; vLLM fell back to its default [2, 4, 5]: whichever
    argument order, the sides are 'SGLang 0.5.23' / 'vLLM 0.32.0' and vLLM's config is blamed."""
    sg = write(tmp_path / "sg", {**SGLANG, "aux_native_ids": [-1, 2, 5]}, side="serve", hf=[0, 3, 6])
    vl = write(tmp_path / "vl", {**VLLM, "aux_native_ids": None, "aux_ids_source":
                                 "default fallback get_eagle3_default_aux_hidden_state_layers (2, L//2, L-3)"},
               side="serve", hf=[2, 4, 5])
    x, y = (vl, sg) if culprit == "x" else (sg, vl)
    report = diff_traces(x, y)
    labels = ["vLLM 0.32.0", "SGLang 0.5.23"] if culprit == "x" else ["SGLang 0.5.23", "vLLM 0.32.0"]
    assert [report.labels.x, report.labels.y] == labels
    [cause] = report.explanations
    assert cause.message.startswith("vLLM 0.32.0 captured HF [2, 4, 5] where SGLang 0.5.23 used HF [0, 3, 6]")
    assert cause.message.endswith("vLLM 0.32.0's draft config causes the divergence")
    assert "top-level eagle_aux_hidden_state_layer_ids to [0, 3, 6]" in cause.fix
    assert '"labels": [' in render_json(report) and labels[0] in render_json(report)


@pytest.mark.parametrize("order", ["sg-vl", "vl-sg"])
def test_serve_vs_serve_with_a_shift_on_one_engine_blames_the_engine_that_accepts_less(tmp_path, write, order):
    """The same draft with shifted ids on SGLang only (it captured HF [1, 4, 7], accepting 1 per step);
    vLLM right ([0, 3, 6], accepting 3): neither side holds the other's layers, so the contracts and
    acceptance say it: SGLang's config causes it, and the fix is in SGLang's key and numbering."""
    sg = write(tmp_path / "sg", {**SGLANG, "aux_native_ids": [0, 3, 6]}, side="serve", hf=[1, 4, 7], accept=1)
    vl = write(tmp_path / "vl", {**VLLM, "aux_native_ids": [0, 3, 6],
                                 "aux_ids_source": "top-level eagle_aux_hidden_state_layer_ids"},
               side="serve", hf=[0, 3, 6], accept=3)
    report = diff_traces(*((sg, vl) if order == "sg-vl" else (vl, sg)))
    assert report.first.name.startswith("target.aux")
    [cause] = report.explanations
    assert cause.cause == "aux_capture_differs"
    assert "SGLang 0.5.23 HF [1, 4, 7] from ids [0, 3, 6] in eagle_config.eagle_aux_hidden_state_layer_ids" \
        in cause.message
    assert "vLLM 0.32.0 HF [0, 3, 6] from ids [0, 3, 6] in top-level eagle_aux_hidden_state_layer_ids" in cause.message
    assert "SGLang 0.5.23's draft config causes the divergence: the same draft accepts less there" in cause.message
    assert cause.fix.startswith("set the draft config's eagle_config.eagle_aux_hidden_state_layer_ids to [-1, 2, 5]")


def test_serve_vs_serve_without_acceptance_says_it_cannot_tell_and_gives_both_fixes(tmp_path, write):
    sg = write(tmp_path / "sg", SGLANG, side="serve", hf=[1, 4, 7])
    vl = write(tmp_path / "vl", VLLM, side="serve", hf=[0, 3, 6])
    [cause] = diff_traces(sg, vl).explanations
    assert "cannot tell" in cause.message
    assert cause.fix.startswith("on SGLang 0.5.23: set the draft config's eagle_config.eagle_aux_hidden_state_layer_ids"
                                " to [-1, 2, 5]")
    assert "or on vLLM 0.32.0: set the draft config's top-level eagle_aux_hidden_state_layer_ids to [1, 4, 7]" \
        in cause.fix


def test_two_traces_of_one_engine_version_stay_a_and_b(tmp_path, write):
    a = write(tmp_path / "a", SGLANG, side="serve", hf=[0, 3, 6])
    b = write(tmp_path / "b", SGLANG, side="serve", hf=[0, 3, 6])
    report = diff_traces(a, b)
    assert (report.labels.x, report.labels.y) == ("A", "B")
