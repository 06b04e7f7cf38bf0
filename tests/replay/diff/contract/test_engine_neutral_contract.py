"""The contract check speaks the serving engine's language: fixes in its key and
numbering, unknown facts blamed on the engine that hid them, dropped ids in its own words, sides
named by engine for two engines. Contracts as the two recorders write them; no server needed (the
real vLLM trace's report is checked in tests/demo/test_vllm_demo.py)."""

from __future__ import annotations

from types import SimpleNamespace

from specdiff.replay.diff.contract.check import check_contracts
from specdiff.replay.diff.types import Pair
from specdiff.tracer.contract import unknown_facts

TRAIN = {"side": "train", "aux_hf_indices": [0, 3, 6], "norm_before_fc": False, "rope_theta": 10000.0}


def _serve(engine: str | None, **facts) -> SimpleNamespace:
    c = {"side": "serve", "aux_hf_indices": [3, 6, 7], "norm_before_fc": True, "rope_theta": "unknown", **facts}
    if engine:
        c.update(engine=engine, engine_version={"vllm": "0.32.0", "sglang": "0.5.23"}[engine])
        c["unobservable"] = [{"name": "RotaryEmbedding.base", engine: "x.y", f"{engine}_version": c["engine_version"],
                              "facts": ["rope_theta"], "tensors": []}]
    return SimpleNamespace(side="serve", contract=c)


def _by_field(traces):
    return {m.field: m for m in check_contracts(traces)}


def test_a_vllm_serving_trace_gets_vllms_key_numbering_and_version():
    m = _by_field(Pair(SimpleNamespace(side="train", contract=dict(TRAIN)), _serve("vllm", aux_dropped_ids=[-1])))
    assert m["aux_hf_indices"].fix.startswith("write the training layers into the draft config's top-level "
                                              "eagle_aux_hidden_state_layer_ids (vLLM id = HF index")
    assert "vLLM reads eagle_config's, else the top-level key" in m["norm_before_fc"].fix
    assert "vLLM 0.32.0 has no RotaryEmbedding.base" in m["rope_theta"].message
    assert m["rope_theta"].fix == "check the vLLM version against specdiff's tested range (vLLM 0.32.0)"
    assert "vLLM captures ids 0..L only" in m["aux_dropped_ids"].message
    assert "top-level eagle_aux_hidden_state_layer_ids" in m["aux_dropped_ids"].fix
    for mm in m.values():
        assert "SGLang" not in mm.message + mm.fix or "vLLM" in mm.message + mm.fix, (mm.field, mm.message, mm.fix)


def test_an_sglang_serving_trace_keeps_sglangs_words():
    # also what a trace written before the engine fact existed gets (only SGLang recorded then)
    for engine in ("sglang", None):
        m = _by_field(Pair(SimpleNamespace(side="train", contract=dict(TRAIN)), _serve(engine, aux_dropped_ids=[7])))
        assert m["aux_hf_indices"].fix.startswith("write the training layers into the draft's eagle_config."
                                                  "eagle_aux_hidden_state_layer_ids in SGLang's numbering")
        assert m["norm_before_fc"].fix == "set eagle_config.norm_before_fc in the draft config as in training"
        assert "SGLang's numbering for this target" in m["aux_dropped_ids"].message
    assert unknown_facts(_serve("sglang").contract)["rope_theta"] == "SGLang 0.5.23 has no RotaryEmbedding.base"


def test_two_engines_are_named_by_engine_and_each_fix_in_its_own_terms():
    sg = _serve("sglang", aux_hf_indices=[0, 3, 6], norm_before_fc=False)
    m = check_contracts(Pair(sg, _serve("vllm")))
    aux = next(x for x in m if x.field == "aux_hf_indices")
    assert aux.message == "vLLM 0.32.0 captured HF hidden_states[3, 6, 7]; SGLang 0.5.23 used [0, 3, 6]"
    assert aux.fix.startswith("SGLang: write the training layers into the draft's eagle_config.") and \
        "; vLLM: write the training layers into the draft config's top-level" in aux.fix
