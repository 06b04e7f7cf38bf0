"""A multi-layer draft's later layers normalise their input with a norm each engine names differently
(SGLang 0.5.23 ``hidden_norm``, vLLM 0.32.0 / speculators ``input_layernorm``): the contract's
``draft_layer_input_norms`` is what each side's live layers read, and a difference is named at the draft's
layers with the fix that says which name each engine reads. The layer outputs order the first divergence:
``draft.layer_out.{i}`` before ``draft.hidden_out``, in layer order."""

from __future__ import annotations

import json

import numpy as np

from specdiff.tracer.schema import ordered, sort_key, spec_for
from specdiff.tracer.store import TraceWriter

BASE = {"engine": "test", "num_layers": 8, "hidden_size": 16, "vocab_size": 64, "draft_hidden_size": 16,
        "draft_vocab_size": 32, "spec_algorithm": "EAGLE3", "dtype": "float32", "spec_steps": 3, "spec_topk": 1}
TRAINED = {"layers.1": "a" * 16, "layers.2": "c" * 16}


def _trace(path, side, norms, *, diverge: dict[str, bool]):
    rng = np.random.default_rng(0)
    with TraceWriter(str(path), side=side, contract={**BASE, "draft_layer_input_norms": norms}) as tw:
        tw.add_sequence(np.arange(1, 13, dtype=np.int32), prompt_len=4, rid="r0")
        for name, moved in diverge.items():
            data = rng.standard_normal((8, 16)).astype(np.float32)
            tw.append(name, -data + 3.0 if moved else data, seq=0, pos=np.arange(8))
    return str(path)


def test_layer_outputs_sort_before_hidden_out_in_layer_order():
    names = ["draft.hidden_out", "draft.layer_out.1", "draft.attn_in", "draft.layer_out.0", "draft.logits"]
    assert ordered(names) == ["draft.attn_in", "draft.layer_out.0", "draft.layer_out.1", "draft.hidden_out",
                              "draft.logits"]
    assert spec_for("draft.layer_out.7").stage == "draft.hidden_out" and spec_for("draft.layer_out.7").by_depth
    assert sort_key("draft.layer_out.0") < sort_key("draft.hidden_out")


def test_another_later_layer_input_norm_is_named_at_the_first_layer_that_diverges(tmp_path, run_cli):
    outputs = {"draft.layer_out.0": False, "draft.layer_out.1": True, "draft.hidden_out": True}
    train = _trace(tmp_path / "train.trace", "train", TRAINED, diverge=dict.fromkeys(outputs, False))
    serve = _trace(tmp_path / "serve.trace", "serve", {**TRAINED, "layers.2": "0" * 16}, diverge=outputs)
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 1, r.output
    j = json.loads(r.output)
    first = j["first_divergence"]
    assert first["tensor"] == "draft.layer_out.1"  # layer 0 agrees: layer 1's output is the first that differs
    assert "draft_layer_input_norms.layers.2" in first["contract_bearing"], first
    named = [m for m in j["contract_mismatches"] if m["field"] == "draft_layer_input_norms.layers.2"]
    assert len(named) == 1 and named[0]["severity"] == "warn"
    assert "hidden_norm" in named[0]["fix"] and "input_layernorm" in named[0]["fix"]
    assert not any(m["field"] == "draft_layer_input_norms.layers.1" for m in j["contract_mismatches"])


def test_the_same_later_layer_input_norms_name_nothing(tmp_path, run_cli):
    same = dict.fromkeys(("draft.layer_out.0", "draft.hidden_out"), False)
    train = _trace(tmp_path / "train.trace", "train", TRAINED, diverge=same)
    serve = _trace(tmp_path / "serve.trace", "serve", dict(TRAINED), diverge=same)
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert not any(m["field"].startswith("draft_layer_input_norms") for m in j["contract_mismatches"])
