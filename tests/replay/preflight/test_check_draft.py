"""``specdiff check`` on the draft's vocab map, weights and config against the target and the server:
d2t / t2d, missing, misshapen, unexpected or mistyped weights, rope, the algorithm, the chat
template, the checkpoint format, the context, the served dtype and tied embeddings. On the tiny pair
of tests/support/preflight_pair.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from support.preflight_pair import VD, H, L, V, edit_config, edit_weights, one_finding

from specdiff.replay.model.checkpoint import load_draft, save_draft
from specdiff.replay.preflight.check import run_preflight
from specdiff.replay.preflight.rules.vocab import check_vocab


# ---- vocab map --------------------------------------------------------------------------------
def test_d2t_as_direct_ids(pair):
    target, draft, hot = pair
    edit_weights(draft, lambda sd: sd.update(d2t=hot.clone()))
    report = run_preflight(target, draft)
    f = one_finding(report, "vocab.d2t_direct")
    assert f.severity == "error" and "d2t holds direct target ids, not offsets" in f.message
    assert "t2d marks exactly the ids d2t holds" in f.message


def test_d2t_inconsistent_with_t2d(pair):
    target, draft, hot = pair

    def bump(sd):
        d2t = hot - torch.arange(VD)
        free = sorted(set(range(V)) - set(hot.tolist()))[0]
        d2t[5] = free - 5  # draft 5 now maps to a token t2d does not mark
        sd["d2t"] = d2t
    edit_weights(draft, bump)
    report = run_preflight(target, draft)
    f = one_finding(report, "vocab.t2d_mismatch")
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


def test_d2t_direct_ids_without_t2d_is_a_warning():
    ids = torch.tensor([0, 3, 7, 9, 20, 21, 30, 31])
    fs = check_vocab(ids, None, draft_vocab_size=8, vocab_size=64)
    f = [f for f in fs if f.kind == "vocab.d2t_direct"][0]
    assert f.severity == "warn" and "d2t is strictly increasing (0, 3, 7, ...)" in f.message
    # proper offsets of a sorted vocab (they repeat) give no such warning
    fs = check_vocab(ids - torch.arange(8), None, draft_vocab_size=8, vocab_size=64)
    assert not [f for f in fs if f.kind == "vocab.d2t_direct"]


# ---- weights ----------------------------------------------------------------------------------
def test_missing_weight(pair):
    target, draft, _ = pair
    edit_weights(draft, lambda sd: sd.pop("midlayer.hidden_norm.weight"))
    report = run_preflight(target, draft)
    f = one_finding(report, "weights.missing")
    assert f.severity == "error" and f.message.startswith("midlayer.hidden_norm.weight [64] is missing")


def test_weight_of_wrong_width(pair):
    target, draft, _ = pair
    edit_weights(draft, lambda sd: sd.update({"fc.weight": torch.zeros(H, 2 * H)}))
    report = run_preflight(target, draft)
    f = one_finding(report, "weights.shape")
    assert f.severity == "error"
    assert f.message.startswith("fc.weight is [64, 128] but 3 aux slots x target hidden 64 = 192")
    edit_weights(draft, lambda sd: sd.update({"fc.weight": torch.zeros(H, 3 * H),
                                                "midlayer.self_attn.q_proj.weight": torch.zeros(H, H)}))
    f = one_finding(run_preflight(target, draft), "weights.shape")
    assert "midlayer.self_attn.q_proj.weight is [64, 64] but attention input is 2 x draft hidden = 128" in f.message


def test_unexpected_and_ignored_weights_and_dtype(pair):
    target, draft, _ = pair
    edit_weights(draft, lambda sd: sd.update({"input_norm.weight": torch.ones(3 * H),
                                                "verifier_lm_head.weight": torch.zeros(2, 2),
                                                "norm.weight": torch.ones(H, dtype=torch.bfloat16)}))
    report = run_preflight(target, draft)
    assert "input_norm.weight" in one_finding(report, "weights.unexpected").message
    assert one_finding(report, "norm.flag_missing").severity == "error"
    assert "verifier_lm_head.weight" in one_finding(report, "weights.ignored").message
    assert "mixed float dtypes" in one_finding(report, "weights.dtype").message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_a_vocab_map_in_another_dtype_is_read_and_named(pair, dtype):
    # the pre-flight reads d2t / t2d through safetensors' numpy reader (replay/model/weight_files.py);
    # numpy has no bf16, so that one is read by the torch reader, as float32
    target, draft, _ = pair
    edit_weights(draft, lambda sd: sd.update(d2t=sd["d2t"].to(dtype), t2d=sd["t2d"].to(torch.int32)))
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
    edit_config(draft, lambda c: c.update(rope_theta=500000.0, max_position_embeddings=128))
    report = run_preflight(target, draft)
    f = one_finding(report, "rope.theta")
    assert f.message.startswith("draft rope_theta 500000 but target rope_theta 10000")
    assert "draft max_position_embeddings 128 (context 128) < the served context 512: SGLang 0.5.23 refuses to " \
        "start" in one_finding(report, "rope.max_positions", "sglang").message
    edit_config(draft, lambda c: c.update(rope_theta=10000.0, max_position_embeddings=512,
                                           rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert "draft rope_scaling {'rope_type': 'linear', 'factor': 2.0} but target rope_scaling None" in \
        one_finding(run_preflight(target, draft), "rope.scaling").message


def test_eagle_algorithm_with_eagle3_checkpoint(pair, run_cli):
    target, draft, _ = pair
    r = run_cli("check", "--target", target, "--draft", draft, "--speculative-algorithm", "EAGLE")
    assert r.exit_code == 1 and "algorithm.mismatch" in r.output
    f = one_finding(run_preflight(target, draft, speculative_algorithm="EAGLE"), "algorithm.mismatch")
    assert "fc is skipped" in f.message


def test_chat_template_differs(pair):
    target, draft, _ = pair
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (draft / "tokenizer_config.json").write_text(json.dumps({"chat_template": "<s>{{ messages }}"}))
    f = one_finding(run_preflight(target, draft), "tokenizer.chat_template")
    assert f.severity == "warn" and "draft chat template sha256" in f.message


def test_speculators_format_is_unsupported_by_sglang(pair, tmp_path):
    target, draft, _ = pair
    from specdiff.replay.model.checkpoint import load_draft
    out = save_draft(load_draft(draft).model, tmp_path / "spec", "speculators", target_num_layers=L)
    report = run_preflight(target, out, training_layers=[0, 4, 7])
    assert one_finding(report, "format.unsupported", "sglang").severity == "error"
    assert report.captures["vllm"].hf_indices == (0, 4, 7) and report.captures["vllm"].outcome == "ok"
    assert not [f for f in report.errors if f.engine != "sglang"]


# ---- one vocab-map rule, one weights reader ---------------------------------------------------
def test_check_and_load_read_a_placeholder_d2t_the_same_way(pair):
    target, draft, _ = pair
    edit_weights(draft, lambda sd: sd.update(d2t=torch.arange(VD)))
    report = run_preflight(target, draft)
    assert one_finding(report, "vocab.d2t_arange").severity == "warn"
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


# ---- every rope key SGLang reads, the served dtype, tied embeddings ----------------------------
def test_max_positions_shorter_than_the_served_context_is_sglangs_refusal_to_start(pair):
    target, draft, _ = pair
    edit_config(draft, lambda c: c.update(max_position_embeddings=64))
    f = one_finding(run_preflight(target, draft), "rope.max_positions", "sglang")
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
    edit_config(draft, lambda c: c.update(rope_is_neox_style=False, partial_rotary_factor=0.5))
    report = run_preflight(target, draft)
    assert "interleaved pairs" in one_finding(report, "rope.style", "sglang").message
    f = one_finding(report, "rope.partial_rotary", "sglang")
    assert "rotates only the first 8 of each head's 16 dims (llama.py:199-200)" in f.message


def test_a_config_window_sglang_ignores_is_a_finding_with_the_server_option_that_serves_it(pair):
    """speculators' layer_types / sliding_window (eagle3/attention_window.py): SGLang 0.5.23 builds full
    attention from them; the fix names --speculative-draft-window-size S - 1, and says what it cannot serve."""
    target, draft, _ = pair
    assert not [f for f in run_preflight(target, draft).findings if f.kind.startswith("window.")]
    edit_config(draft, lambda c: c.update(layer_types=["sliding_attention"], sliding_window=8))
    f = one_finding(run_preflight(target, draft), "window.config_ignored", "sglang")
    assert f.severity == "warn" and "every layer an attention window of [7] keys back" in f.message
    assert "--speculative-draft-window-size 7" in f.fix and "depth >= 1" in f.fix
    assert not [x for x in run_preflight(target, draft, engines=("vllm",)).findings if x.kind.startswith("window.")]


def test_tie_word_embeddings_is_a_finding_with_its_fix_not_a_refusal(pair, run_cli):
    target, draft, _ = pair
    edit_config(draft, lambda c: c.update(tie_word_embeddings=True))
    f = one_finding(run_preflight(target, draft), "weights.tied_lm_head", "sglang")
    assert f.severity == "warn" and "the target's embedding" in f.message and "llama_eagle3.py:303-304" in f.message
    assert "tie_word_embeddings to false" in f.fix
    r = run_cli("check", "--target", target, "--draft", draft)
    assert r.exit_code == 0 and "weights.tied_lm_head" in r.output, r.output


def test_served_dtype_against_the_trained_one(pair):
    target, draft, _ = pair
    edit_weights(draft, lambda sd: sd.update({k: v.to(torch.bfloat16) for k, v in sd.items()
                                                if v.is_floating_point()}))
    edit_config(draft, lambda c: c.update(torch_dtype="bfloat16"))
    assert not [f for f in run_preflight(target, draft).findings if f.kind == "weights.served_dtype"]
    f = one_finding(run_preflight(target, draft, served_dtype="float16"), "weights.served_dtype", "sglang")
    assert f.severity == "warn" and "65504" in f.message and f.fix == "serve in bfloat16: --dtype bfloat16"
    # --dtype auto on a config that says float32 (or nothing) is float16 in SGLang 0.5.23
    edit_config(draft, lambda c: c.update(torch_dtype="float32"))
    f = one_finding(run_preflight(target, draft), "weights.served_dtype", "sglang")
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
