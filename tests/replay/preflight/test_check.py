"""``specdiff check``: pre-flight contract findings from a tiny target config + draft checkpoint
(tests/support/preflight_pair.py): a correct pair, the aux layers each engine captures, the engine
rules read from the engines' source, and malformed input. The draft's vocab map, weights and config
are test_check_draft.py's; ``check --engine vllm``'s advice is test_check_vllm.py's.
"""

from __future__ import annotations

import json

import pytest
from support.preflight_pair import TRAIN_HF, L, edit_config, one_finding

from specdiff.replay.preflight.check import PreflightError, findings_as_facts, run_preflight


# ---- a correct pair ------------------------------------------------------------------------
def test_correct_pair_has_no_errors_and_prints_resolved_indices_per_engine(pair, run_cli):
    target, draft, _ = pair
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", TRAIN_HF)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "SGLang 0.5.23" in out and "eagle_config ids [-1, 3, 6]" in out
    assert "vLLM" in out and "top-level ids [0, 4, 7]" in out
    assert out.count("-> HF [0=embed, 4=out L3, 7=out L6]") == 3  # sglang, vllm, training
    assert "0 error(s)" in out and "training.match" in out
    report = run_preflight(target, draft, training_layers=[0, 4, 7])
    assert not report.errors
    assert {e: c.hf_indices for e, c in report.captures.items()} == {"sglang": (0, 4, 7), "vllm": (0, 4, 7)}


def test_json_format_and_findings_as_facts(pair, run_cli):
    target, draft, _ = pair
    r = run_cli("check", "--target", target, "--draft", draft, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["captures"]["sglang"]["hf_indices"] == [0, 4, 7]
    assert d["captures"]["vllm"]["source"] == "top-level"
    assert d["counts"]["error"] == 0
    facts = findings_as_facts(run_preflight(target, draft).findings)
    assert facts and all(set(f) == {"kind", "severity", "engine", "message", "fix"} for f in facts)
    json.dumps(facts)
    from specdiff.tracer.contract import validate_contract
    validate_contract({"findings": facts}, where="test")


# ---- aux capture ------------------------------------------------------------------------------
def test_ids_shifted_by_one_mismatch_training_per_engine(pair, run_cli):
    target, draft, _ = pair
    # the seed bug: SGLang ids written as HF indices -> SGLang captures one layer later
    edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 4, 6]))
    report = run_preflight(target, draft, training_layers=[0, 4, 7])
    f = one_finding(report, "training.mismatch", "sglang")
    assert f.severity == "error"
    assert report.captures["sglang"].hf_indices == (1, 5, 7) and report.training_hf == (0, 4, 7)
    assert "slot 0: trained on embed, gets out L0" in f.message
    assert "[-1, 3, 6]" in f.fix
    assert one_finding(report, "training.match", "vllm").severity == "info"
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", TRAIN_HF)
    assert r.exit_code == 1 and "training.mismatch" in r.output
    # the same layers stated as SpecForge ids cannot express the embeddings: exit 2
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", "0,3", "--training-convention", "bogus")
    assert r.exit_code == 2


def test_training_layers_in_specforge_convention(pair):
    target, draft, _ = pair
    report = run_preflight(target, draft, training_layers=[1, 3, 5], training_convention="specforge")
    assert report.training_hf == (2, 4, 6)
    assert one_finding(report, "training.mismatch", "sglang").fix.endswith("[1, 3, 5]")
    assert one_finding(report, "training.mismatch", "vllm").fix.endswith("[2, 4, 6]")


def test_id_at_last_layer_is_dropped_by_sglang_and_crashes(pair, run_cli):
    target, draft, _ = pair
    edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[-1, 3, 7]))
    report = run_preflight(target, draft, engines=("sglang",))
    f = one_finding(report, "aux.dropped_id", "sglang")
    assert f.severity == "error"
    assert report.captures["sglang"].source == "eagle_config" and report.captures["sglang"].dropped_ids == (7,)
    crash = one_finding(report, "aux.slot_count", "sglang")
    assert len(report.captures["sglang"].hf_indices) == 2 and report.captures["sglang"].slots_expected == 3
    assert "mat1 and mat2 shapes cannot be multiplied" in crash.message  # the engine's own error, as it reads
    assert "(Nx128 and 192xHd)" in crash.message
    assert report.captures["sglang"].outcome == "crash"
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "sglang")
    assert r.exit_code == 1 and "dropped ids [7]" in r.output and "CRASH" in r.output


def test_sglang_ids_read_by_vllm_crash_on_minus_one(pair):
    target, draft, _ = pair
    edit_config(draft, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))
    report = run_preflight(target, draft)
    assert report.captures["sglang"].outcome == "ok"
    vl = report.captures["vllm"]
    assert vl.source == "eagle_config" and vl.hf_indices == (3, 6) and vl.outcome == "crash"
    assert vl.dropped_ids == (-1,) and one_finding(report, "aux.dropped_id", "vllm").severity == "error"
    assert "shape '[-1, 192]' is invalid" in one_finding(report, "aux.slot_count", "vllm").message


def test_ids_only_at_top_level_are_ignored_by_sglang(pair):
    target, draft, _ = pair
    edit_config(draft, lambda c: c.pop("eagle_config"))
    report = run_preflight(target, draft, training_layers=[0, 4, 7])
    f = one_finding(report, "aux.ignored_key", "sglang")
    assert f.severity == "error"
    sg = report.captures["sglang"]
    assert sg.source == "default" and sg.native_ids is None and sg.hf_indices == (2, 4, 5)
    assert report.captures["vllm"].hf_indices == (0, 4, 7)
    assert one_finding(report, "training.mismatch", "sglang").fix.endswith("[-1, 3, 6]")


def test_engines_disagree_without_training_layers(pair):
    target, draft, _ = pair
    edit_config(draft, lambda c: (c.pop("eagle_aux_hidden_state_layer_ids"),
                                   c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 5])))
    report = run_preflight(target, draft)
    f = one_finding(report, "aux.engines_disagree")
    assert f.severity == "warn" and f.engine == "all"
    assert report.captures["sglang"].hf_indices == (2, 4, 6) and report.captures["vllm"].hf_indices == (1, 3, 5)


# ---- malformed input ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["no_config", "bad_safetensors", "not_a_model", "no_weights", "no_dir",
                                  "target_not_a_model"])
def test_malformed_inputs_exit_2_with_one_line(pair, case, run_cli):
    target, draft, _ = pair
    if case == "no_config":
        (draft / "config.json").unlink()
    elif case == "bad_safetensors":
        (draft / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    elif case == "not_a_model":
        (draft / "config.json").write_text(json.dumps({"foo": 1}))
    elif case == "no_weights":
        (draft / "model.safetensors").unlink()
    elif case == "no_dir":
        draft = draft / "nope"
    else:
        (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
    r = run_cli("check", "--target", target, "--draft", draft)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: "), r.output
    with pytest.raises(PreflightError):
        run_preflight(target, draft)


def test_draft_that_is_not_eagle3(pair, run_cli):
    target, draft, _ = pair
    edit_config(draft, lambda c: c.update(architectures=["LlamaForCausalLM"]))
    r = run_cli("check", "--target", target, "--draft", draft)
    assert r.exit_code == 1 and "algorithm.not_eagle3" in r.output
    report = run_preflight(target, draft)
    assert [f.kind for f in report.findings] == ["algorithm.not_eagle3"] and not report.captures


# ---- engine rules read from the engines' source (specdiff.eagle3.aux_layers.RULES) -------------
def test_vllm_id_L_is_fed_as_the_last_layer_before_the_final_norm_not_dropped(pair, run_cli):
    # vLLM 0.32.0 llama.py:427-441 captures id idx+1 after layer idx: id L is a real slot (no crash),
    # the output of layer L-1 before the final norm, which no HF hidden_states index holds.
    target, draft, _ = pair
    edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 4, L]))
    report = run_preflight(target, draft, engines=("vllm",), training_layers=[0, 4, L])
    vl = report.captures["vllm"]
    assert vl.outcome == "ok" and vl.hf_indices == (0, 4) and vl.prenorm_ids == (L,) and vl.dropped_ids == ()
    assert not [f for f in report.findings if f.kind in ("aux.dropped_id", "aux.slot_count")]
    assert "before the final norm" in one_finding(report, "aux.prenorm_last", "vllm").message
    mism = one_finding(report, "training.mismatch", "vllm")
    assert "slot 2: trained on final-norm, gets pre-norm out L7" in mism.message
    assert mism.fix == "vLLM captures only HF 0..L-1: retrain on other layers"
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "vllm", "--format", "json")
    assert json.loads(r.output)["captures"]["vllm"]["prenorm_ids"] == [L]
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "vllm")
    assert "-> HF [0=embed, 4=out L3] + pre-norm out L7  [3/3 slots, ok]" in r.output


def test_vllm_ids_past_its_last_capture_point_are_dropped_and_crash(pair):
    target, draft, _ = pair
    edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 4, L + 1]))
    report = run_preflight(target, draft, engines=("vllm",))
    assert report.captures["vllm"].outcome == "crash" and report.captures["vllm"].dropped_ids == (L + 1,)
    assert f"past vLLM's last capture point, id {L}" in one_finding(report, "aux.dropped_id", "vllm").message


def test_empty_eagle_config_ids_make_sglang_capture_nothing(pair):
    # spec_aux_hidden_state.py:192 passes the list as given; llama.py:941 then captures no layer,
    # while fc is built for 3 slots (llama_eagle3.py:156-161): not the default capture
    target, draft, _ = pair
    edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[]))
    report = run_preflight(target, draft, engines=("sglang",))
    sg = report.captures["sglang"]
    assert sg.source == "eagle_config" and sg.hf_indices == () and sg.outcome == "crash"
    assert not [f for f in report.findings if f.kind in ("aux.default", "aux.ignored_key")]


def test_empty_top_level_ids_make_vllm_read_eagle_config(pair):
    # vLLM 0.32.0 gpu_model_runner.py:5268-5285: an empty top-level list falls through to eagle_config
    target, draft, _ = pair
    edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[]))
    vl = run_preflight(target, draft, engines=("vllm",)).captures["vllm"]
    assert vl.source == "eagle_config" and vl.native_ids == (-1, 3, 6) and vl.dropped_ids == (-1,)
