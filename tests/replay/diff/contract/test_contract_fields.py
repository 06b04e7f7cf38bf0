"""The complete contract: every field that decides the draft's computation is compared, and a
field that differs is shown beside the first divergence it bears on, with a fix.

Synthetic trace pairs written with the real TraceWriter: both sides hold the same contract and
the same rows except (1) one contract field changed on the serving side and (2) rows that diverge
at a stage that field bears on. The diff must name exactly that field next to the first divergence.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.replay.diff.contract.check import TARGET_IDENTITY
from specdiff.replay.diff.contract.facts import WORDED
from specdiff.tracer.contract_fields import CONTRACT_FIELDS
from specdiff.tracer.store import TraceWriter

BASE = {
    "engine": "test", "num_layers": 8, "hidden_size": 16, "vocab_size": 64, "draft_hidden_size": 16,
    "draft_vocab_size": 32, "spec_algorithm": "EAGLE3", "aux_hf_indices": [2, 4, 5],
    "aux_concat_order": [2, 4, 5], "d2t_sha256": "d" * 64, "hot_token_id_sha256": "h" * 64,
    "t2d_sha256": "t" * 64, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
    "embed_source": "target", "embed_sha256": "e" * 64, "lm_head_source": "draft", "lm_head_sha256": "l" * 64,
    "rope_theta": 10000.0, "rope_scaling": None, "rope_style": "neox", "draft_weights_sha256": "w" * 64,
    "tokenizer_sha256": "k" * 64, "bos_added": True, "chat_template_sha256": "c" * 64, "dtype": "float32",
    "spec_steps": 3, "spec_topk": 1, "aux_prenorm_indices": [], "partial_rotary_factor": 1.0,
}

#: field -> the serving side's value (training keeps BASE's)
CHANGED = {
    "num_layers": 12, "hidden_size": 32, "vocab_size": 128, "draft_vocab_size": 48, "spec_algorithm": "EAGLE",
    "aux_hf_indices": [3, 5, 6], "aux_concat_order": [5, 2, 4], "d2t_sha256": "D" * 64,
    "hot_token_id_sha256": "H" * 64, "t2d_sha256": "T" * 64, "norm_before_fc": True, "fc_norm": True,
    "norm_output": True, "embed_source": "draft", "embed_sha256": "E" * 64, "lm_head_source": "target",
    "lm_head_sha256": "L" * 64, "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
    "rope_style": "gptj", "draft_weights_sha256": "W" * 64, "tokenizer_sha256": "K" * 64, "bos_added": False,
    "chat_template_sha256": "C" * 64, "dtype": "bfloat16", "spec_steps": 5, "spec_topk": 2,
    "aux_prenorm_indices": [5], "partial_rotary_factor": 0.5,
}

#: stage -> (tensor written with diverging rows, row shape, kind)
TENSOR_OF_STAGE = {
    "tokens": ("tokens", (), "int"), "target.aux": ("target.aux.0", (16,), "float"),
    "target.aux_cat": ("target.aux_cat", (48,), "float"), "draft.fc_in": ("draft.fc_in", (48,), "float"),
    "draft.fc_out": ("draft.fc_out", (16,), "float"), "draft.attn_in": ("draft.attn_in", (32,), "float"),
    "draft.hidden_out": ("draft.hidden_out", (16,), "float"), "draft.logits": ("draft.logits", (32,), "float"),
    "draft.topk": ("draft.topk", (1,), "int"), "draft.topk_target": ("draft.topk_target", (1,), "int"),
    "verify": ("verify.accept_length", (), "int"),
}


def test_every_compared_field_is_a_declared_contract_field_and_is_exercised():
    assert set(WORDED) <= set(CONTRACT_FIELDS)
    assert set(CHANGED) == set(WORDED), set(WORDED) ^ set(CHANGED)
    # target identity is compared before everything else (refused, tests/replay/record/test_target_identity.py)
    assert set(TARGET_IDENTITY) <= set(CONTRACT_FIELDS) and not set(TARGET_IDENTITY) & set(WORDED)


def _trace(path, side, contract, *, stage, diverge: bool):
    name, shape, kind = TENSOR_OF_STAGE[stage]
    tokens = np.arange(1, 13, dtype=np.int32)
    rng = np.random.default_rng(0)
    n = 8
    if kind == "float":
        data = rng.standard_normal((n, *shape)).astype(np.float32)
        if diverge:
            data = -data + 3.0
    else:
        data = np.ones((n, *shape), np.int64) * (7 if diverge else 5)
    with TraceWriter(str(path), side=side, contract=contract) as tw:
        tw.add_sequence(tokens, prompt_len=4, rid="r0")
        tw.append(name, data, seq=0, pos=np.arange(n))
    return str(path)


def _primary_stage(field: str) -> str:
    stages = WORDED[field].shows
    return "draft.fc_out" if "*" in stages else stages[0]


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_a_serving_contract_field_that_differs_is_shown_beside_the_first_divergence(tmp_path, field, run_cli):

    stage = _primary_stage(field)
    train = _trace(tmp_path / "train.trace", "train", BASE, stage=stage, diverge=False)
    serve = _trace(tmp_path / "serve.trace", "serve", {**BASE, field: CHANGED[field]}, stage=stage, diverge=True)
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 1, r.output
    j = json.loads(r.output)
    first = j["first_divergence"]
    assert first["tensor"] == TENSOR_OF_STAGE[stage][0]
    assert first["contract_bearing"] == [field]
    assert [m["fix"] for m in j["contract_mismatches"] if m["field"] == field][0]
    text = run_cli("diff", train, serve, "--format", "text").output
    # said once (errors lead the report, the rest in the contract block), its fix under it
    assert text.count(f"] {field}: ") == 1
    entry = text.split(f"[{WORDED[field].severity}] {field}: ", 1)[1].split("\n\n", 1)[0].split("\n  [", 1)[0]
    said, fix = " ".join(entry.split()).split(" fix: ", 1)
    assert fix and (WORDED[field].severity == "error" or said.endswith(f"(bears on {first['tensor']})"))
    if WORDED[field].severity == "error":
        assert text.index(f"] {field}: ") < text.index("\nfirst divergence\n")


def test_an_unknown_serving_fact_is_shown_beside_the_divergence_it_could_explain(tmp_path, run_cli):

    unobs = [{"name": "LlamaModel.layers_to_capture", "sglang": "x", "source": "srt/models/llama.py:463",
              "tensors": [], "facts": ["aux_hf_indices"], "why": "gone", "sglang_version": "0.5.99"}]
    train = _trace(tmp_path / "train.trace", "train", BASE, stage="target.aux", diverge=False)
    serve = _trace(tmp_path / "serve.trace", "serve", {**BASE, "aux_hf_indices": "unknown", "unobservable": unobs},
                   stage="target.aux", diverge=True)
    r = run_cli("diff", train, serve, "--format", "json")
    j = json.loads(r.output)
    assert r.exit_code == 1
    assert j["unknown_facts"]["serving"] == {"aux_hf_indices": "SGLang 0.5.99 has no LlamaModel.layers_to_capture"}
    msgs = [m["message"] for m in j["contract_mismatches"] if m["field"] in j["first_divergence"]["contract_bearing"]]
    assert msgs == ["aux_hf_indices is unknown on serving (SGLang 0.5.99 has no LlamaModel.layers_to_capture): "
                    "not compared"]
    info = run_cli("info", serve).output
    assert "unknown    1 contract fact(s) recorded as unknown" in info
    assert "aux_hf_indices           SGLang 0.5.99 has no LlamaModel.layers_to_capture" in info



def test_a_fact_the_recorder_read_but_could_not_settle_says_why_and_its_own_fix(tmp_path, run_cli):
    """vLLM's draft_attention_window where a layer holds a window its CPU backend may not apply
    (tracer/engines/vllm/contract.py): the reason and fix the recorder wrote, not "re-record"."""
    from specdiff.tracer.engines.vllm.contract import _WINDOW_UNKNOWN

    train = _trace(tmp_path / "train.trace", "train", {**BASE, "draft_attention_window": [{"window": 8,
                                                                                             "distance": "prefix"}]},
                   stage="draft.hidden_out", diverge=False)
    serve = _trace(tmp_path / "serve.trace", "serve", {**BASE, "draft_attention_window": "unknown",
                                                       "unknown_reasons": {"draft_attention_window": _WINDOW_UNKNOWN}},
                   stage="draft.hidden_out", diverge=True)
    j = json.loads(run_cli("diff", train, serve, "--format", "json").output)
    assert j["unknown_facts"]["serving"] == {"draft_attention_window": _WINDOW_UNKNOWN["why"]}
    line = next(m for m in j["contract_mismatches"] if m["field"] == "draft_attention_window")
    assert line["fix"] == _WINDOW_UNKNOWN["fix"] and "re-record" not in line["fix"]
    assert "cpu_attn.py:178-195" in line["message"]

# ---- target identity facts: one computation for both sides ---------------------------------------
def test_target_config_sha256_ignores_what_the_engine_adds_and_sees_what_the_model_computes():
    from transformers import Qwen3MoeConfig

    from specdiff.tracer.contract import config_sha256

    cfg = Qwen3MoeConfig(num_hidden_layers=8, hidden_size=256, num_experts=4, num_experts_per_tok=2)
    served = Qwen3MoeConfig(**cfg.to_dict())
    # what SGLang 0.5.23 writes into the hf_config it loaded (configs/model_config.py:908-913, 1329, 1355-1365,
    # utils/hf_transformers_patches.py:113), and provenance
    served.context_len, served.encoder_only, served.language_model_only = 2048, False, False
    served.swa_head_dim = served.swa_v_head_dim = 64
    served.rope_parameters = {**served.rope_parameters, "type": served.rope_parameters["rope_type"]}
    served._name_or_path = "/somewhere/else"
    assert config_sha256(served) == config_sha256(cfg) == config_sha256(cfg.to_dict())
    yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    ds = {"architectures": ["DeepseekV3ForCausalLM"], "rope_parameters": yarn}
    # deepseek_v2.py:2066 renames the loaded config's yarn in place; another rope is another config
    assert config_sha256({**ds, "rope_parameters": {**yarn, "rope_type": "deepseek_yarn", "type": "yarn"}}) == \
        config_sha256(ds) != config_sha256({**ds, "rope_parameters": {**yarn, "rope_type": "linear"}})
    routed = Qwen3MoeConfig(**{**cfg.to_dict(), "num_experts_per_tok": 1})
    assert config_sha256(routed) != config_sha256(cfg)
    with pytest.raises(TypeError, match="config_sha256 needs a transformers config or a mapping"):
        config_sha256("config.json")


def test_target_weights_fingerprint_is_dtype_independent_and_reads_rows_across_the_vocab():
    import torch

    from specdiff.tracer.contract import FINGERPRINT_ROWS, weights_fingerprint

    V, H = 4096, 64
    fp32 = torch.randn(V, H, generator=torch.Generator().manual_seed(0))
    bf16 = fp32.to(torch.bfloat16)
    fp = weights_fingerprint(fp32, V)
    assert weights_fingerprint(bf16, V) == fp == weights_fingerprint(bf16.float(), V)  # serving bf16, training fp32
    padded = torch.cat([bf16, torch.zeros(64, H, dtype=torch.bfloat16)])  # an engine's vocab padding
    assert weights_fingerprint(padded, V) == fp
    last = (FINGERPRINT_ROWS - 1) * V // FINGERPRINT_ROWS
    for row, changes in ((last, True), (last + 1, False)):  # only the spread rows are read
        w = fp32.clone()
        w[row] += 1.0
        assert (weights_fingerprint(w, V) != fp) is changes, row
    assert weights_fingerprint(fp32[:, :32], V) != weights_fingerprint(fp32[:, 32:], V)
    with pytest.raises(ValueError, match="tensor-parallel shard"):
        weights_fingerprint(fp32[: V // 2], V)


def test_moe_routing_and_identity_facts_for_dense_moe_and_unknown_architectures():
    import torch
    from transformers import DeepseekV3Config, LlamaConfig

    from specdiff.tracer.contract import UNKNOWN, moe_routing_facts, target_identity_facts, validate_contract

    ds = DeepseekV3Config(num_hidden_layers=2, hidden_size=64, vocab_size=128, n_routed_experts=4,
                          num_experts_per_tok=2, architectures=["DeepseekV3ForCausalLM"])
    assert moe_routing_facts(ds, "DeepseekV3ForCausalLM") == {"target_num_experts": 4, "target_experts_per_token": 2}
    assert moe_routing_facts(LlamaConfig(), "LlamaForCausalLM") == {"target_num_experts": None,
                                                                   "target_experts_per_token": None}
    assert set(moe_routing_facts(ds, "SomeNewForCausalLM").values()) == {UNKNOWN}  # never guessed
    facts = target_identity_facts(ds, torch.randn(128, 64))
    assert facts["target_architecture"] == "DeepseekV3ForCausalLM" and facts["target_num_experts"] == 4
    assert len(facts["target_weights_fingerprint"]) == 64
    assert target_identity_facts(ds)["target_weights_fingerprint"] == UNKNOWN
    for field in facts:
        assert field in CONTRACT_FIELDS, field
    validate_contract(dict(facts, aux_capture_rule="sglang srt/models/deepseek_v2.py:3458 x"), where="test")
