"""Every recorded fact compared key by key (replay/diff/contract/fact_diff.py): a fact the table knows is a
warning with its first stage and its fix, any other still a warning ("unlisted difference: KEY: training X,
serving Y; stage unknown"); the engine's options, the configs, the weights per tensor and per layer, and
the parameters a model built that its checkpoint did not provide. Synthetic pairs (tests/builders.py) whose
rows agree: only the contract facts differ."""

from __future__ import annotations

import pytest
from builders import dataflow_pair

from specdiff.replay.diff.contract.check import check_contracts
from specdiff.replay.diff.contract.facts import fact_row
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.diff.types import Pair
from specdiff.tracer.store import open_trace

BASE = {"hidden_size": 16, "draft_hidden_size": 16, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16"}
TRAIN = {"engine": "specdiff-reference"}
SERVE = {"engine": "sglang"}
LAYERS = {f"model.layers.{i}": f"{i:016x}" for i in range(8)}


def _mismatches(tmp_path, *, train: dict, serve: dict, base: dict | None = None):
    a, b = dataflow_pair(tmp_path, contract=base or BASE, train={**TRAIN, **train}, serve={**SERVE, **serve})
    return {m.field: m for m in check_contracts(Pair(open_trace(a), open_trace(b)))}, (a, b)


def test_a_fact_no_table_lists_is_still_named_with_both_values(tmp_path):
    found, _ = _mismatches(tmp_path, train={"kv_quant_mode": "none"}, serve={"kv_quant_mode": "fp8"})
    m = found["kv_quant_mode"]
    assert m.severity == "warn" and m.stages == ()
    assert m.message == "unlisted difference: kv_quant_mode: training 'none', serving 'fp8'; stage unknown"


def test_a_draft_config_key_is_compared_leaf_by_leaf_with_its_stage_and_fix(tmp_path):
    cfg = {"num_hidden_layers": 1, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
           "_name_or_path": "/a", "rms_norm_eps": 1e-6}
    found, _ = _mismatches(tmp_path, train={"draft_config": cfg},
                           serve={"draft_config": {**cfg, "num_hidden_layers": 2, "_name_or_path": "/b",
                                                   "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}})
    layers = found["draft_config.num_hidden_layers"]
    assert layers.message.startswith("draft_config.num_hidden_layers: training 1, serving 2 (acts from draft.hidden_out)")
    assert layers.fix == fact_row("draft_config.num_hidden_layers").fix and "num_hidden_layers in the draft config to the number of decoder layers the checkpoint holds" in layers.fix
    assert "draft_config.rope_parameters.rope_theta" in found
    assert not [f for f in found if "_name_or_path" in f]  # a path: never compared


def test_an_option_the_operator_gave_is_compared_with_the_engines_default(tmp_path):
    given = {"speculative_draft_window_size": {"value": 4, "default": None}, "port": {"value": 1, "default": 30000},
             "attention_backend": {"value": "intel_amx", "default": None},
             "some_new_option": {"value": True, "default": False}}
    found, _ = _mismatches(tmp_path, train={"engine_options": {"steps": 3}},
                           serve={"engine_options": {"port": 1}, "engine_options_given": given})
    window = found["engine_options.speculative_draft_window_size"]
    assert window.message.startswith("engine_options.speculative_draft_window_size: training None (SGLang's default, "
                                     "what the reference computes), serving 4 (given)")
    assert window.stages[0] == "draft.hidden_out" and "--speculative-draft-window-size" in window.fix
    assert found["engine_options.some_new_option"].message.endswith("stage unknown")
    assert "engine_options.port" not in found and "engine_options.attention_backend" not in found


SPEC_W7 = [{"window": 7, "distance": "prefix"}]  # speculators: sliding_window 8 (eagle3/attention_window.py)
SGL_W7 = [{"window": 7, "distance": "kv"}]  # SGLang --speculative-draft-window-size 7


@pytest.mark.parametrize("train_w, serve_w, given", [
    ([None], SGL_W7, True),  # trained on full attention, served with a window
    (SPEC_W7, [None], False),  # trained windowed by speculators, served by SGLang, which ignores layer_types
    (SPEC_W7, SGL_W7, True),  # the same window, counted by the two rules (depth >= 1 differs)
], ids=["served-window-only", "trained-window-only", "rules-differ"])
def test_the_draft_attention_windows_both_sides_computed_are_compared(tmp_path, train_w, serve_w, given):
    """The window each side computed is the fact compared (at draft.hidden_out, with the fix naming the
    served option), whatever the reason they differ; the option itself is then not compared with the
    engine's default (a window the training side also computed is correct)."""
    opts = {"engine_options_given": {"speculative_draft_window_size": {"value": 7, "default": None}}} if given else {}
    found, _ = _mismatches(tmp_path, train={"draft_attention_window": train_w},
                           serve={"draft_attention_window": serve_w, **opts})
    m = found["draft_attention_window"]
    assert m.severity == "warn" and m.stages[0] == "draft.hidden_out"
    assert "--speculative-draft-window-size" in m.fix and "speculators' rule" in m.fix
    assert "engine_options.speculative_draft_window_size" not in found


def test_the_same_window_on_both_sides_is_no_difference_and_the_given_option_is_not_flagged(tmp_path):
    opts = {"engine_options_given": {"speculative_draft_window_size": {"value": 7, "default": None}}}
    found, _ = _mismatches(tmp_path, train={"draft_attention_window": SGL_W7},
                           serve={"draft_attention_window": SGL_W7, **opts})
    assert "draft_attention_window" not in found and "engine_options.speculative_draft_window_size" not in found
    # a training side that records no window (an older trace): the option against the default, as before
    found, _ = _mismatches(tmp_path / "old", train={}, serve={"draft_attention_window": SGL_W7, **opts})
    assert "engine_options.speculative_draft_window_size" in found


def test_two_traces_of_one_engine_compare_every_resolved_option(tmp_path):
    opts = {"kv_cache_dtype": "auto", "port": 1, "mem_fraction_static": 0.1}
    found, _ = _mismatches(tmp_path, train={"engine": "sglang", "engine_options": opts},
                           serve={"engine_options": {**opts, "kv_cache_dtype": "fp8_e5m2", "port": 2,
                                                     "mem_fraction_static": 0.5}})
    assert set(f for f in found if f.startswith("engine_options")) == {"engine_options.kv_cache_dtype"}


def test_weights_are_compared_per_checkpoint_tensor_and_per_target_layer(tmp_path):
    draft = {"fc.weight": "a" * 16, "midlayer.mlp.up_proj.weight": "b" * 16, "lm_head.weight": "c" * 16}
    found, _ = _mismatches(tmp_path, train={"draft_weights": draft, "target_weights": LAYERS},
                           serve={"draft_weights": {**draft, "lm_head.weight": "d" * 16},
                                  "target_weights": {**LAYERS, "model.layers.5": "e" * 16}})
    head = found["draft_weights.lm_head.weight"]
    assert head.stages[0] == "draft.logits" and head.fix == fact_row("draft_weights.lm_head.weight").fix
    layer = found["target_weights.model.layers.5"]
    assert layer.message.startswith(f"target_weights.model.layers.5: training fingerprint {LAYERS['model.layers.5']}, "
                                    f"serving fingerprint {'e' * 16} (acts from target.aux)")
    assert "every layer" in layer.fix


def test_a_target_layer_after_every_captured_one_acts_first_at_verify(tmp_path):
    found, _ = _mismatches(tmp_path, train={"target_weights": LAYERS},
                           serve={"target_weights": {**LAYERS, "model.layers.7": "e" * 16}})
    assert found["target_weights.model.layers.7"].stages[0] == "verify"  # HF 7 is the last captured: layer 7 is after


def test_one_draft_in_two_checkpoint_layouts_is_compared_by_canonical_name(tmp_path):
    found, _ = _mismatches(tmp_path, train={"draft_weights": {"midlayer.mlp.up_proj.weight": "a" * 16}},
                           serve={"draft_weights": {"layers.0.mlp.up_proj.weight": "a" * 16}})
    assert not [f for f in found if f.startswith("draft_weights")]


def test_parameters_a_model_built_that_its_checkpoint_did_not_provide_are_named_per_unit(tmp_path):
    left = [f"model.layers.1.{p}" for p in ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight",
                                            "input_layernorm.weight")]
    found, _ = _mismatches(tmp_path, train={"draft_unloaded": []}, serve={"draft_unloaded": left})
    m = found["draft_unloaded.model.layers.1"]
    assert m.stages[0] == "draft.hidden_out" and m.severity == "warn"
    assert "serving 4 parameter(s) its checkpoint did not provide, left as allocated: model.layers.1.input_layernorm" \
           in m.message and "(+1 more)" in m.message and "training every one loaded" in m.message


@pytest.mark.parametrize("facts", [{}, {"draft_config": {"num_hidden_layers": 1}}])
def test_old_traces_without_the_facts_still_diff_and_say_what_is_unknown(tmp_path, facts):
    found, (a, b) = _mismatches(tmp_path, train={}, serve=facts)
    if not facts:  # neither side recorded them: nothing to say
        assert not [f for f in found if f in ("live_facts", "one_sided_facts")]
    else:
        assert found["live_facts"].severity == "info"
        assert "training records no draft_config" in found["live_facts"].message
        assert "unknown, not compared" in found["live_facts"].message
    report = diff_traces(a, b, narrow=False)
    assert report.first is None and render_text(report)


def test_a_passing_pair_whose_facts_differ_leads_with_the_contract_warning(tmp_path):
    _, (a, b) = _mismatches(tmp_path, train={"target_weights": LAYERS},
                            serve={"target_weights": {**LAYERS, "model.layers.3": "e" * 16}})
    report = diff_traces(a, b, narrow=False)
    assert report.first is None
    assert report.verdict().endswith("but the contract differs: target_weights.model.layers.3, see contract warnings")
    text = render_text(report)
    head = "\ncontract warnings (recorded facts that differ though no tensor shows it)\n"
    assert text.index(head) < text.index("\ncontract\n")  # before everything but the verdict
    assert text.split(head)[1].startswith("  [warn] target_weights.model.layers.3: training fingerprint")
    assert text.count("target_weights.model.layers.3:") == 1  # said once


def test_structures_are_compared_between_traces_of_one_engine_one_line_per_unit(tmp_path):
    built = {"model.fc.weight": "[16, 48] bfloat16", "model.layers.0.self_attn.qkv_proj.weight": "[48, 32] bfloat16"}
    extra = {f"model.layers.1.{p}": "[16] bfloat16" for p in ("input_layernorm.weight", "hidden_norm.weight", "x.weight")}
    found, _ = _mismatches(tmp_path, train={"engine": "sglang", "draft_structure": built},
                           serve={"draft_structure": {**built, **extra}})
    (m,) = [m for f, m in found.items() if f.startswith("draft_structure")]
    assert m.field == "draft_structure.model.layers.1" and m.stages[0] == "draft.hidden_out"
    assert m.message.startswith("draft_structure.model.layers.1: training not built, serving model.layers.1.")
    assert "(+1 more)" in m.message
    # another engine names its parameters otherwise (SGLang's qkv_proj is the checkpoint's q/k/v_proj): not compared
    found, _ = _mismatches(tmp_path / "other", train={"draft_structure": {"midlayer.q_proj.weight": "[48, 32] bfloat16"}},
                           serve={"draft_structure": {**built, **extra}})
    assert not [f for f in found if f.startswith("draft_structure")]


@pytest.mark.parametrize(("served", "differs"), [("deepseek_yarn", False), ("linear", True)])
def test_an_engines_own_name_for_the_same_rope_is_no_difference(tmp_path, served, differs):
    # SGLang 0.5.23 writes rope_type 'deepseek_yarn' into the DeepSeek config it loaded
    # (deepseek_v2.py:2066): a correct DeepSeek-V3 pair read it as a target_config difference
    rope = {"factor": 4.0, "rope_theta": 10000.0, "rope_type": "yarn", "mscale": 1.0}
    found, _ = _mismatches(tmp_path, train={"target_config": {"rope_parameters": rope}},
                           serve={"target_config": {"rope_parameters": {**rope, "rope_type": served}}})
    assert ("target_config.rope_parameters.rope_type" in found) is differs, found


def test_state_no_checkpoint_holds_is_compared_per_layer_with_its_stage(tmp_path):
    # a rotary cache lost after load: one layer's rope table differs, weights untouched (tracer/state_facts.py)
    rope = {f"layers.{i}": f"{i:016x}" for i in range(8)}
    found, _ = _mismatches(tmp_path, train={"target_rope": rope, "draft_rope": {"layers.0": "a" * 16}},
                           serve={"target_rope": {**rope, "layers.3": "f" * 16}, "draft_rope": {"layers.0": "b" * 16}})
    assert found["target_rope.layers.3"].stages[0] == "target.aux" and "rotary" in found["target_rope.layers.3"].fix
    assert found["draft_rope.layers.0"].stages[0] == "draft.hidden_out"
    assert not [f for f in found if f.startswith("target_rope.layers.") and f != "target_rope.layers.3"]
    assert not [f for f in found if f in ("target_rope", "draft_rope")]  # never a whole-dict "unlisted difference"


def test_buffers_are_compared_between_traces_of_one_engine_only(tmp_path):
    buf = {"model.layers.0.self_attn.rotary_emb.cos_sin_cache": "1" * 16}
    lost = {"model.layers.0.self_attn.rotary_emb.cos_sin_cache": "meta"}
    same, _ = _mismatches(tmp_path / "one", train={"engine": "sglang", "target_buffers": buf},
                          serve={"target_buffers": lost})
    assert same["target_buffers.model.layers.0.self_attn.rotary_emb.cos_sin_cache"].stages[0] == "target.aux"
    other, _ = _mismatches(tmp_path / "two", train={"target_buffers": buf}, serve={"target_buffers": lost})
    assert not [f for f in other if f.startswith("target_buffers")]  # each engine names its own buffers


def test_a_served_override_is_named_with_its_option_and_stage(tmp_path):
    override = {"rope_scaling": {"value": {"rope_type": "yarn", "factor": 4.0}, "source": "json_model_override_args"}}
    found, _ = _mismatches(tmp_path, train={"target_config_overrides": {}},
                           serve={"target_config_overrides": override})
    m = found["target_config_overrides.rope_scaling"]
    assert m.stages[0] == "target.aux" and "json_model_override_args" in m.message and "not overridden" in m.message
    assert "override" in m.fix


def test_a_rope_table_that_differs_under_the_same_rope_settings_is_fixed_at_the_cache_not_the_config(tmp_path):
    # the served draft's rotary cache zeroed from a position after load: its config's rope is training's
    cfg = {"rope_theta": 10000.0, "head_dim": 32, "rope_scaling": None}
    table = {"draft_rope": {"layers.0": "a" * 16}, "draft_config": cfg, "target_config": cfg}
    found, _ = _mismatches(tmp_path, train=table, serve={**table, "draft_rope": {"layers.0": "b" * 16}})
    fix = found["draft_rope.layers.0"].fix
    assert fix.startswith("the rope settings of both configs agree") and "draft config" not in fix, fix
    # other rope settings: the table follows the config, whose fix names it
    served = {**table, "draft_rope": {"layers.0": "b" * 16}, "draft_config": {**cfg, "rope_theta": 5e5}}
    found, _ = _mismatches(tmp_path / "other", train=table, serve=served)
    assert "draft config's rope" in found["draft_rope.layers.0"].fix
