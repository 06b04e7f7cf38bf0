"""``specdiff check``: pre-flight contract findings from a tiny target config + draft checkpoint.

The pair is self-contained (built under tmp_path): an 8-layer Llama target config (no weights
needed: check never loads them) and a random EAGLE-3 draft saved in SpecForge format with
SGLang ids [-1, 3, 6] (= HF [0, 4, 7]) in eagle_config and the same layers as vLLM ids [0, 4, 7]
at the top level, so both engines feed the training layers.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from builders import random_specforge_draft
from safetensors.torch import load_file, save_file

from specdiff.replay.model.checkpoint import load_draft, save_draft
from specdiff.replay.preflight.check import PreflightError, findings_as_facts, run_preflight
from specdiff.replay.preflight.report import Finding
from specdiff.replay.preflight.rules.vocab import check_vocab

L, H, V, VD = 8, 64, 256, 128
TRAIN_HF = "0,4,7"


@pytest.fixture(scope="module")
def pair_src(tmp_path_factory):
    from transformers import LlamaConfig
    root = tmp_path_factory.mktemp("pair")
    target = root / "target"
    LlamaConfig(num_hidden_layers=L, hidden_size=H, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=V, max_position_embeddings=512, rope_theta=10000.0,
                eos_token_id=1, bos_token_id=0).save_pretrained(target)
    draft = root / "draft"
    hot = random_specforge_draft(draft, aux_ids=[-1, 3, 6], hidden=H, vocab=V, draft_vocab=VD)
    _edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 4, 7]))
    return target, draft, hot


@pytest.fixture
def pair(pair_src, tmp_path):
    target, draft, hot = pair_src
    shutil.copytree(target, tmp_path / "target")
    shutil.copytree(draft, tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft", hot


def _edit_config(path, fn):
    f = path / "config.json"
    c = json.loads(f.read_text())
    fn(c)
    f.write_text(json.dumps(c))


def _edit_weights(path, fn):
    f = path / "model.safetensors"
    sd = load_file(str(f))
    fn(sd)
    save_file(sd, str(f))


def _one(report, kind, engine=None) -> Finding:
    got = [f for f in report.findings if f.kind == kind and (engine is None or f.engine == engine)]
    assert got, f"no {kind} finding in {[(f.kind, f.engine) for f in report.findings]}"
    return got[0]


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
    _edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 4, 6]))
    report = run_preflight(target, draft, training_layers=[0, 4, 7])
    f = _one(report, "training.mismatch", "sglang")
    assert f.severity == "error"
    assert report.captures["sglang"].hf_indices == (1, 5, 7) and report.training_hf == (0, 4, 7)
    assert "slot 0: trained on embed, gets out L0" in f.message
    assert "[-1, 3, 6]" in f.fix
    assert _one(report, "training.match", "vllm").severity == "info"
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", TRAIN_HF)
    assert r.exit_code == 1 and "training.mismatch" in r.output
    # the same layers stated as SpecForge ids cannot express the embeddings: exit 2
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", "0,3", "--training-convention", "bogus")
    assert r.exit_code == 2


def test_training_layers_in_specforge_convention(pair):
    target, draft, _ = pair
    report = run_preflight(target, draft, training_layers=[1, 3, 5], training_convention="specforge")
    assert report.training_hf == (2, 4, 6)
    assert _one(report, "training.mismatch", "sglang").fix.endswith("[1, 3, 5]")
    assert _one(report, "training.mismatch", "vllm").fix.endswith("[2, 4, 6]")


def test_id_at_last_layer_is_dropped_by_sglang_and_crashes(pair, run_cli):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[-1, 3, 7]))
    report = run_preflight(target, draft, engines=("sglang",))
    f = _one(report, "aux.dropped_id", "sglang")
    assert f.severity == "error"
    assert report.captures["sglang"].source == "eagle_config" and report.captures["sglang"].dropped_ids == (7,)
    crash = _one(report, "aux.slot_count", "sglang")
    assert len(report.captures["sglang"].hf_indices) == 2 and report.captures["sglang"].slots_expected == 3
    assert "mat1 and mat2 shapes cannot be multiplied" in crash.message  # the engine's own error, as it reads
    assert "(Nx128 and 192xHd)" in crash.message
    assert report.captures["sglang"].outcome == "crash"
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "sglang")
    assert r.exit_code == 1 and "dropped ids [7]" in r.output and "CRASH" in r.output


def test_sglang_ids_read_by_vllm_crash_on_minus_one(pair):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))
    report = run_preflight(target, draft)
    assert report.captures["sglang"].outcome == "ok"
    vl = report.captures["vllm"]
    assert vl.source == "eagle_config" and vl.hf_indices == (3, 6) and vl.outcome == "crash"
    assert vl.dropped_ids == (-1,) and _one(report, "aux.dropped_id", "vllm").severity == "error"
    assert "shape '[-1, 192]' is invalid" in _one(report, "aux.slot_count", "vllm").message


def test_ids_only_at_top_level_are_ignored_by_sglang(pair):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.pop("eagle_config"))
    report = run_preflight(target, draft, training_layers=[0, 4, 7])
    f = _one(report, "aux.ignored_key", "sglang")
    assert f.severity == "error"
    sg = report.captures["sglang"]
    assert sg.source == "default" and sg.native_ids is None and sg.hf_indices == (2, 4, 5)
    assert report.captures["vllm"].hf_indices == (0, 4, 7)
    assert _one(report, "training.mismatch", "sglang").fix.endswith("[-1, 3, 6]")


def test_engines_disagree_without_training_layers(pair):
    target, draft, _ = pair
    _edit_config(draft, lambda c: (c.pop("eagle_aux_hidden_state_layer_ids"),
                                   c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 5])))
    report = run_preflight(target, draft)
    f = _one(report, "aux.engines_disagree")
    assert f.severity == "warn" and f.engine == "all"
    assert report.captures["sglang"].hf_indices == (2, 4, 6) and report.captures["vllm"].hf_indices == (1, 3, 5)


# ---- vocab map --------------------------------------------------------------------------------
def test_d2t_as_direct_ids(pair):
    target, draft, hot = pair
    _edit_weights(draft, lambda sd: sd.update(d2t=hot.clone()))
    report = run_preflight(target, draft)
    f = _one(report, "vocab.d2t_direct")
    assert f.severity == "error" and "d2t holds direct target ids, not offsets" in f.message
    assert "t2d marks exactly the ids d2t holds" in f.message


def test_d2t_inconsistent_with_t2d(pair):
    target, draft, hot = pair

    def bump(sd):
        d2t = hot - torch.arange(VD)
        free = sorted(set(range(V)) - set(hot.tolist()))[0]
        d2t[5] = free - 5  # draft 5 now maps to a token t2d does not mark
        sd["d2t"] = d2t
    _edit_weights(draft, bump)
    report = run_preflight(target, draft)
    f = _one(report, "vocab.t2d_mismatch")
    assert f.severity == "error"
    assert "1 draft id(s) map to tokens t2d does not mark (first: draft 5 ->" in f.message
    assert f"1 token(s) t2d marks are reached by no draft id (first: {int(hot[5])})" in f.message


def test_d2t_arange_and_missing_and_out_of_range():
    fs = check_vocab(torch.arange(8), None, draft_vocab_size=8, vocab_size=64)
    assert any(f.kind == "vocab.d2t_arange" for f in fs)
    fs = check_vocab(None, None, draft_vocab_size=8, vocab_size=64)
    assert [f.kind for f in fs] == ["vocab.d2t_missing"] and fs[0].severity == "error"
    fs = check_vocab(torch.full((8,), 60), None, draft_vocab_size=8, vocab_size=64)
    assert [f.kind for f in fs] == ["vocab.d2t_range"]
    assert "first: draft 4 -> 64" in fs[0].message
    fs = check_vocab(torch.zeros(8, dtype=torch.int64), None, draft_vocab_size=8, vocab_size=8)
    assert "covers 8 of 8 target tokens (100.0%)" in [f for f in fs if f.kind == "vocab.coverage"][0].message


# ---- weights ----------------------------------------------------------------------------------
def test_missing_weight(pair):
    target, draft, _ = pair
    _edit_weights(draft, lambda sd: sd.pop("midlayer.hidden_norm.weight"))
    report = run_preflight(target, draft)
    f = _one(report, "weights.missing")
    assert f.severity == "error" and f.message.startswith("midlayer.hidden_norm.weight [64] is missing")


def test_weight_of_wrong_width(pair):
    target, draft, _ = pair
    _edit_weights(draft, lambda sd: sd.update({"fc.weight": torch.zeros(H, 2 * H)}))
    report = run_preflight(target, draft)
    f = _one(report, "weights.shape")
    assert f.severity == "error"
    assert f.message.startswith("fc.weight is [64, 128] but 3 aux slots x target hidden 64 = 192")
    _edit_weights(draft, lambda sd: sd.update({"fc.weight": torch.zeros(H, 3 * H),
                                                "midlayer.self_attn.q_proj.weight": torch.zeros(H, H)}))
    f = _one(run_preflight(target, draft), "weights.shape")
    assert "midlayer.self_attn.q_proj.weight is [64, 64] but attention input is 2 x draft hidden = 128" in f.message


def test_unexpected_and_ignored_weights_and_dtype(pair):
    target, draft, _ = pair
    _edit_weights(draft, lambda sd: sd.update({"input_norm.weight": torch.ones(3 * H),
                                                "verifier_lm_head.weight": torch.zeros(2, 2),
                                                "norm.weight": torch.ones(H, dtype=torch.bfloat16)}))
    report = run_preflight(target, draft)
    assert "input_norm.weight" in _one(report, "weights.unexpected").message
    assert _one(report, "norm.flag_missing").severity == "error"
    assert "verifier_lm_head.weight" in _one(report, "weights.ignored").message
    assert "mixed float dtypes" in _one(report, "weights.dtype").message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_a_vocab_map_in_another_dtype_is_read_and_named(pair, dtype):
    # the pre-flight reads d2t / t2d through safetensors' numpy reader (replay/model/weight_files.py);
    # numpy has no bf16, so that one is read by the torch reader, as float32
    target, draft, _ = pair
    _edit_weights(draft, lambda sd: sd.update(d2t=sd["d2t"].to(dtype), t2d=sd["t2d"].to(torch.int32)))
    report = run_preflight(target, draft)
    d2t_dtype = str(dtype).replace("torch.", "")
    messages = {f.message: f.severity for f in report.findings if f.kind == "weights.dtype"}
    assert messages[f"d2t has dtype {d2t_dtype}, expected int64"] == ("warn" if dtype == torch.int32 else "error")
    assert messages["t2d has dtype int32, expected bool"] == "warn"
    assert report.draft.d2t.dtype.kind == ("i" if dtype == torch.int32 else "f")
    # int offsets are still read as offsets (the same coverage as int64); float ones are not ids
    assert any(f.kind == "vocab.coverage" for f in report.findings) == (dtype == torch.int32)


# ---- other contract points ---------------------------------------------------------------------
def test_mismatched_rope(pair):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.update(rope_theta=500000.0, max_position_embeddings=128))
    report = run_preflight(target, draft)
    f = _one(report, "rope.theta")
    assert f.message.startswith("draft rope_theta 500000 but target rope_theta 10000")
    assert "draft max_position_embeddings 128 (context 128) < the served context 512: SGLang 0.5.23 refuses to " \
        "start" in _one(report, "rope.max_positions", "sglang").message
    _edit_config(draft, lambda c: c.update(rope_theta=10000.0, max_position_embeddings=512,
                                           rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert "draft rope_scaling {'rope_type': 'linear', 'factor': 2.0} but target rope_scaling None" in \
        _one(run_preflight(target, draft), "rope.scaling").message


def test_eagle_algorithm_with_eagle3_checkpoint(pair, run_cli):
    target, draft, _ = pair
    r = run_cli("check", "--target", target, "--draft", draft, "--speculative-algorithm", "EAGLE")
    assert r.exit_code == 1 and "algorithm.mismatch" in r.output
    f = _one(run_preflight(target, draft, speculative_algorithm="EAGLE"), "algorithm.mismatch")
    assert "fc is skipped" in f.message


def test_chat_template_differs(pair):
    target, draft, _ = pair
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (draft / "tokenizer_config.json").write_text(json.dumps({"chat_template": "<s>{{ messages }}"}))
    f = _one(run_preflight(target, draft), "tokenizer.chat_template")
    assert f.severity == "warn" and "draft chat template sha256" in f.message


def test_speculators_format_is_unsupported_by_sglang(pair, tmp_path):
    target, draft, _ = pair
    from specdiff.replay.model.checkpoint import load_draft
    out = save_draft(load_draft(draft).model, tmp_path / "spec", "speculators", target_num_layers=L)
    report = run_preflight(target, out, training_layers=[0, 4, 7])
    assert _one(report, "format.unsupported", "sglang").severity == "error"
    assert report.captures["vllm"].hf_indices == (0, 4, 7) and report.captures["vllm"].outcome == "ok"
    assert not [f for f in report.errors if f.engine != "sglang"]


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
    _edit_config(draft, lambda c: c.update(architectures=["LlamaForCausalLM"]))
    r = run_cli("check", "--target", target, "--draft", draft)
    assert r.exit_code == 1 and "algorithm.not_eagle3" in r.output
    report = run_preflight(target, draft)
    assert [f.kind for f in report.findings] == ["algorithm.not_eagle3"] and not report.captures


def test_d2t_direct_ids_without_t2d_is_a_warning():
    ids = torch.tensor([0, 3, 7, 9, 20, 21, 30, 31])
    fs = check_vocab(ids, None, draft_vocab_size=8, vocab_size=64)
    f = [f for f in fs if f.kind == "vocab.d2t_direct"][0]
    assert f.severity == "warn" and "d2t is strictly increasing (0, 3, 7, ...)" in f.message
    # proper offsets of a sorted vocab (they repeat) give no such warning
    fs = check_vocab(ids - torch.arange(8), None, draft_vocab_size=8, vocab_size=64)
    assert not [f for f in fs if f.kind == "vocab.d2t_direct"]


# ---- engine rules read from the engines' source (specdiff.eagle3.aux_layers.RULES) -------------
def test_vllm_id_L_is_fed_as_the_last_layer_before_the_final_norm_not_dropped(pair, run_cli):
    # vLLM 0.32.0 llama.py:427-441 captures id idx+1 after layer idx: id L is a real slot (no crash),
    # the output of layer L-1 before the final norm, which no HF hidden_states index holds.
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 4, L]))
    report = run_preflight(target, draft, engines=("vllm",), training_layers=[0, 4, L])
    vl = report.captures["vllm"]
    assert vl.outcome == "ok" and vl.hf_indices == (0, 4) and vl.prenorm_ids == (L,) and vl.dropped_ids == ()
    assert not [f for f in report.findings if f.kind in ("aux.dropped_id", "aux.slot_count")]
    assert "before the final norm" in _one(report, "aux.prenorm_last", "vllm").message
    mism = _one(report, "training.mismatch", "vllm")
    assert "slot 2: trained on final-norm, gets pre-norm out L7" in mism.message
    assert mism.fix == "vLLM captures only HF 0..L-1: retrain on other layers"
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "vllm", "--format", "json")
    assert json.loads(r.output)["captures"]["vllm"]["prenorm_ids"] == [L]
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "vllm")
    assert "-> HF [0=embed, 4=out L3] + pre-norm out L7  [3/3 slots, ok]" in r.output


def test_vllm_ids_past_its_last_capture_point_are_dropped_and_crash(pair):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 4, L + 1]))
    report = run_preflight(target, draft, engines=("vllm",))
    assert report.captures["vllm"].outcome == "crash" and report.captures["vllm"].dropped_ids == (L + 1,)
    assert f"past vLLM's last capture point, id {L}" in _one(report, "aux.dropped_id", "vllm").message


def test_empty_eagle_config_ids_make_sglang_capture_nothing(pair):
    # spec_aux_hidden_state.py:192 passes the list as given; llama.py:941 then captures no layer,
    # while fc is built for 3 slots (llama_eagle3.py:156-161): not the default capture
    target, draft, _ = pair
    _edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[]))
    report = run_preflight(target, draft, engines=("sglang",))
    sg = report.captures["sglang"]
    assert sg.source == "eagle_config" and sg.hf_indices == () and sg.outcome == "crash"
    assert not [f for f in report.findings if f.kind in ("aux.default", "aux.ignored_key")]


def test_empty_top_level_ids_make_vllm_read_eagle_config(pair):
    # vLLM 0.32.0 gpu_model_runner.py:5268-5285: an empty top-level list falls through to eagle_config
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[]))
    vl = run_preflight(target, draft, engines=("vllm",)).captures["vllm"]
    assert vl.source == "eagle_config" and vl.native_ids == (-1, 3, 6) and vl.dropped_ids == (-1,)


# ---- one vocab-map rule, one weights reader ---------------------------------------------------
def test_check_and_load_read_a_placeholder_d2t_the_same_way(pair):
    target, draft, _ = pair
    _edit_weights(draft, lambda sd: sd.update(d2t=torch.arange(VD)))
    report = run_preflight(target, draft)
    assert _one(report, "vocab.d2t_arange").severity == "warn"
    assert any("d2t equals arange(Vd)" in n for n in load_draft(draft).notes)


def test_bin_weights_are_checked_like_safetensors(pair, run_cli):
    target, draft, _ = pair
    before = [(f.kind, f.severity, f.engine) for f in run_preflight(target, draft).findings]
    sd = load_file(str(draft / "model.safetensors"))
    (draft / "model.safetensors").unlink()
    torch.save(sd, draft / "pytorch_model.bin")
    after = run_preflight(target, draft)
    assert [(f.kind, f.severity, f.engine) for f in after.findings] == before
    assert after.draft.d2t is not None and after.draft.tensors["fc.weight"] == ((H, 3 * H), "float32")
    (draft / "pytorch_model.bin").write_bytes(b"not a pickle")
    r = run_cli("check", "--target", target, "--draft", draft)
    assert r.exit_code == 2 and r.output.startswith("specdiff: error: draft weights ") and "weights_only" in r.output


# ---- every rope key SGLang reads, the served dtype, tied embeddings (issue 22) -------------------
def test_max_positions_shorter_than_the_served_context_is_sglangs_refusal_to_start(pair):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.update(max_position_embeddings=64))
    f = _one(run_preflight(target, draft), "rope.max_positions", "sglang")
    assert f.severity == "error"
    assert "draft max_position_embeddings 64 (context 64) < the served context 512" in f.message
    assert "refuses to start" in f.message and "srt/configs/model_config.py:1314" in f.message
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in f.fix and "max_position_embeddings = 512" in f.fix
    # the server's --context-length is what the draft is held to, when given
    assert not [x for x in run_preflight(target, draft, context_length=64).findings if x.kind == "rope.max_positions"]


def test_rope_style_and_partial_rotary_are_read(pair):
    target, draft, _ = pair
    report = run_preflight(target, draft)
    assert not [f for f in report.findings if f.kind in ("rope.style", "rope.partial_rotary")]
    _edit_config(draft, lambda c: c.update(rope_is_neox_style=False, partial_rotary_factor=0.5))
    report = run_preflight(target, draft)
    assert "interleaved pairs" in _one(report, "rope.style", "sglang").message
    f = _one(report, "rope.partial_rotary", "sglang")
    assert "rotates only the first 8 of each head's 16 dims (llama.py:199-200)" in f.message


def test_a_config_window_sglang_ignores_is_a_finding_with_the_server_option_that_serves_it(pair):
    """speculators' layer_types / sliding_window (eagle3/attention_window.py): SGLang 0.5.23 builds full
    attention from them; the fix names --speculative-draft-window-size S - 1, and says what it cannot serve."""
    target, draft, _ = pair
    assert not [f for f in run_preflight(target, draft).findings if f.kind.startswith("window.")]
    _edit_config(draft, lambda c: c.update(layer_types=["sliding_attention"], sliding_window=8))
    f = _one(run_preflight(target, draft), "window.config_ignored", "sglang")
    assert f.severity == "warn" and "every layer an attention window of [7] keys back" in f.message
    assert "--speculative-draft-window-size 7" in f.fix and "depth >= 1" in f.fix
    assert not [x for x in run_preflight(target, draft, engines=("vllm",)).findings if x.kind.startswith("window.")]


def test_tie_word_embeddings_is_a_finding_with_its_fix_not_a_refusal(pair, run_cli):
    target, draft, _ = pair
    _edit_config(draft, lambda c: c.update(tie_word_embeddings=True))
    f = _one(run_preflight(target, draft), "weights.tied_lm_head", "sglang")
    assert f.severity == "warn" and "the target's embedding" in f.message and "llama_eagle3.py:303-304" in f.message
    assert "tie_word_embeddings to false" in f.fix
    r = run_cli("check", "--target", target, "--draft", draft)
    assert r.exit_code == 0 and "weights.tied_lm_head" in r.output, r.output


def test_served_dtype_against_the_trained_one(pair):
    target, draft, _ = pair
    _edit_weights(draft, lambda sd: sd.update({k: v.to(torch.bfloat16) for k, v in sd.items()
                                                if v.is_floating_point()}))
    _edit_config(draft, lambda c: c.update(torch_dtype="bfloat16"))
    assert not [f for f in run_preflight(target, draft).findings if f.kind == "weights.served_dtype"]
    f = _one(run_preflight(target, draft, served_dtype="float16"), "weights.served_dtype", "sglang")
    assert f.severity == "warn" and "65504" in f.message and f.fix == "serve in bfloat16: --dtype bfloat16"
    # --dtype auto on a config that says float32 (or nothing) is float16 in SGLang 0.5.23
    _edit_config(draft, lambda c: c.update(torch_dtype="float32"))
    f = _one(run_preflight(target, draft), "weights.served_dtype", "sglang")
    assert "--dtype auto with config dtype float32" in f.message and f.severity == "warn"


def test_sglang_rules_match_sglangs_own_functions():
    """The context / dtype rules above against SGLang 0.5.23's code, on the same configs."""
    from sglang.srt.configs.model_config import _get_and_verify_dtype
    from sglang.srt.utils.hf_transformers.common import get_context_length
    from transformers import LlamaConfig

    from specdiff.replay.preflight.engines import sglang_context_length, sglang_served_dtype

    for kw in ({"max_position_embeddings": 64}, {"max_position_embeddings": 100,
                                                 "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
               {"max_position_embeddings": 100, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 50}}):
        raw = {"model_type": "llama", **kw}
        assert sglang_context_length(raw) == get_context_length(LlamaConfig(**kw)), kw
    for cdt, arg in (("float32", "auto"), (None, "auto"), ("bfloat16", "auto"), ("bfloat16", "float16")):
        raw = {"model_type": "llama", **({"torch_dtype": cdt} if cdt else {})}
        want = str(_get_and_verify_dtype(raw, arg)).replace("torch.", "")
        assert sglang_served_dtype(raw, arg) == want, (cdt, arg)


# ---- check --engine vllm: vLLM 0.32.0's own advice (issue 21 step 5) ------------------------------
def _nested(ids):
    return lambda c: (c.pop("eagle_aux_hidden_state_layer_ids", None), c.update(eagle_config={
        "eagle_aux_hidden_state_layer_ids": ids}))


def _only_key(**kw):
    def edit(c):
        c.pop("eagle_aux_hidden_state_layer_ids", None)
        c.pop("eagle_config", None)
        c.update(kw)
    return edit


# (case, config edit, vLLM V1's source + HF fed, [(kind, severity, words in message or fix)])
VLLM_CASES = [
    ("correct: both keys, one per engine", lambda c: None, ("top-level", (0, 4, 7)), [
        ("aux.source", "info", "reads the aux ids [0, 4, 7] from top-level eagle_aux_hidden_state_layer_ids (its "
         "precedence: top-level eagle_aux_hidden_state_layer_ids, else eagle_config.eagle_aux_hidden_state_layer_ids, "
         "else dflash_config.target_layer_ids (+1); vLLM 0.32.0 v1/worker/gpu_model_runner.py:5268-5283 (V1 runner))")]),
    ("SGLang-format draft: nested ids with -1", _nested([-1, 3, 6]), ("eagle_config", (3, 6)), [
        ("aux.sglang_ids", "error", "eagle_config ids [-1, 3, 6] read in SGLang's numbering are HF [0 (embed), 4 (out "
         "L3), 7 (out L6)]"),
        ("aux.sglang_ids", "error", "id -1 matches no layer, so 2 of 3 slots reach fc and the first request crashes"),
        ("aux.sglang_ids", "error", "fix: add top-level eagle_aux_hidden_state_layer_ids = [0, 4, 7]"),
        ("aux.slot_count", "error", "shape '[-1, 192]' is invalid"),
        ("aux.runner_differs", "warn", "V2 (config/vllm.py:722-738; vLLM 0.32.0 v1/worker/gpu/spec_decode/eagle/"
         "eagle3_utils.py:100-137 (V2 runner)) reads none of its keys"),
        ("aux.runner_differs", "warn", "fix: write the ids at top-level eagle_aux_hidden_state_layer_ids, which both "
         "runners read first: [0, 4, 7] (vLLM id k = HF k)"),
        ("aux.runner_differs", "warn", "HF [2 (out L1), 4 (out L3), 5 (out L4)]")]),
    ("SGLang-format draft without -1: every layer shifted", _nested([1, 3, 6]), ("eagle_config", (1, 3, 6)), [
        ("aux.sglang_ids", "warn", "vLLM feeds HF [1 (out L0), 3 (out L2), 6 (out L5)], SGLang HF [2 (out L1), "
         "4 (out L3), 7 (out L6)] from the same key"),
        ("aux.sglang_ids", "warn", "fix: add top-level eagle_aux_hidden_state_layer_ids = [2, 4, 7]")]),
    ("ids only in a key V1 ignores (eagle_config.layer_ids, read by V2)",
     _only_key(eagle_config={"layer_ids": [0, 4, 7]}), ("default", (2, 4, 5)), [
        ("aux.ignored_key", "error", "eagle_config.layer_ids [0, 4, 7] is not a key vLLM V1 reads"),
        ("aux.ignored_key", "error", "it falls back to its default HF [2 (out L1), 4 (out L3), 5 (out L4)]: vLLM V1 "
         "falls back to get_eagle3_default_aux_hidden_state_layers (interfaces.py:1712-1733) and logs nothing"),
        ("aux.ignored_key", "error", "fix: write the ids at the top level in vLLM's numbering (id k = HF k): "
         "top-level eagle_aux_hidden_state_layer_ids = [0, 4, 7]"),
        ("aux.runner_differs", "warn", "reads eagle_config.layer_ids [0, 4, 7]: HF [0 (embed), 4 (out L3), 7 (out L6)]; "
         "V1 (the CPU build, or VLLM_USE_V2_MODEL_RUNNER=0) feeds HF [2 (out L1), 4 (out L3), 5 (out L4)]")]),
    ("DFlash ids hidden by an eagle_config dict without ids",
     _only_key(dflash_config={"target_layer_ids": [-1, 3, 6]}, eagle_config={"use_aux_hidden_state": True}),
     ("default", (2, 4, 5)), [
        ("aux.shadowed_key", "warn", "dflash_config.target_layer_ids [-1, 3, 6] is not used: vLLM V1 takes no ids "
         "because eagle_config is a dict without eagle_aux_hidden_state_layer_ids"),
        ("aux.runner_differs", "warn", "reads dflash_config.target_layer_ids [0, 4, 7]")]),
    ("fc width from the nested config only", lambda c: c.update(num_aux_hidden_states=4), ("top-level", (0, 4, 7)), [
        ("aux.fc_width", "error", "vLLM builds fc for 4 aux slots (num_aux_hidden_states; llama_eagle3.py:209-216 "
         "does not count the top-level ids) but fc.weight holds 3"),
        ("aux.fc_width", "error", "fix: set num_aux_hidden_states = 3")]),
]


@pytest.mark.parametrize("case,edit,fed,want", VLLM_CASES, ids=[c[0] for c in VLLM_CASES])
def test_check_engine_vllm_gives_vllms_own_advice(pair, run_cli, case, edit, fed, want):
    target, draft, _ = pair
    _edit_config(draft, edit)
    report = run_preflight(target, draft, engines=("vllm",))
    cap = report.captures["vllm"]
    assert (cap.source, cap.hf_indices) == fed, case
    assert set(report.captures) == {"vllm"} and {f.engine for f in report.findings} <= {"vllm", "all"}
    for kind, sev, words in want:
        got = [f for f in report.findings if f.kind == kind and f.engine == "vllm"]
        assert got, (case, kind, [(f.kind, f.message) for f in report.findings])
        assert any(f.severity == sev and words in f"{f.message} fix: {f.fix}" for f in got), (case, kind, got)
    # vLLM's advice never asks for SGLang's numbering or key
    assert not [f for f in report.findings if "SGLang convention" in f.fix or "HF index - 1" in f.fix]
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "vllm")
    assert r.exit_code == (1 if report.errors else 0), r.output
    assert "SGLang 0.5.23" not in r.output.split("\n\n")[0]  # only vLLM's capture line


def test_check_help_explains_engine(run_cli):
    r = run_cli("check", "--help")
    assert r.exit_code == 0
    text = "".join(r.output.split())  # click wraps (and splits long names) at any width
    for words in ("--engine [sglang|vllm|all]", "reads the top-level eagle_aux_hidden_state_layer_ids first, else "
                  "eagle_config's", "id k = HF k", "id k captures HF k+1", "V2 runner"):
        assert "".join(words.split()) in text, words


def test_key_precedence_matches_vllms_own_functions():
    """config_aux_ids against vLLM 0.32.0's V1 ``_get_eagle3_aux_layers_from_config`` and V2's
    ``get_eagle3_aux_layers_from_config``, run in the vLLM venv on the same configs."""
    import subprocess
    from pathlib import Path

    from specdiff.eagle3.config_ids import config_aux_ids

    py = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    if not py.exists():
        pytest.skip("no vLLM venv at .venv-vllm (make vllm-venv)")
    configs = [{}, {"eagle_aux_hidden_state_layer_ids": [0, 4, 7]},
               {"eagle_aux_hidden_state_layer_ids": [], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 3]}},
               {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 3, 6]}},
               {"eagle_config": {"layer_ids": [0, 4, 7]}},
               {"dflash_config": {"target_layer_ids": [-1, 3, 6]}},
               {"dflash_config": {"target_layer_ids": [1, 2]}, "eagle_config": {"use_aux_hidden_state": True}},
               {"dflash_config": {"layer_ids": [5]}}, {"target_layer_ids": [1, 2, 3]},
               {"dspark_target_layer_ids": [1, 2]}, {"dspark_target_layer_ids": [1, 2], "model_type": "deepseek_v41"},
               {"eagle_aux_hidden_state_layer_ids": [1, 2], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [7]}}]
    script = (
        "import json, sys\nfrom types import SimpleNamespace as N\n"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n"
        "from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config as v2\n"
        "out = []\n"
        "for c in json.loads(sys.stdin.read()):\n"
        "    sc = N(draft_model_config=N(hf_config=N(**c)))\n"
        "    a = GPUModelRunner._get_eagle3_aux_layers_from_config(N(speculative_config=sc))\n"
        "    b = v2(sc)\n"
        "    out.append([None if a is None else list(a), None if b is None else list(b)])\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([str(py), "-c", script], input=json.dumps(configs), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for c, (v1, v2) in zip(configs, got, strict=True):
        for runner, want in (("v1", v1), ("v2", v2)):
            ids = config_aux_ids("vllm", c, runner=runner).ids
            assert (None if ids is None else list(ids)) == want, (runner, c)
