"""The tiny targets of every family (``specdiff.demo_models.families``) and their EAGLE-3 drafts.

- every family builds, deterministically (same seed -> byte-identical safetensors; another seed
  -> other bytes), with the architecture's defining parts (MLA + grouped routing + shared
  expert, sliding/full + sinks, experts), and runs a bf16 forward with L + 1 hidden states;
- the brief language-model training is deterministic;
- the SGLang aux-id rule used for each family's draft is the one SGLang 0.5.23's own
  ``set_eagle3_layers_to_capture`` applies (called on a stand-in ``self``);
- the trained draft (``family_models`` fixture, built once and cached) predicts the target
  far above chance, measured again here from the saved bf16 files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from specdiff.demo_models import families as F

FAMILIES = F.FAMILIES


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _text_ids(target: Path) -> torch.Tensor:
    from specdiff.demo_models.tiny_models import load_tokenizer

    tok = load_tokenizer(target)
    return torch.tensor([tok("def read_texts(files):\n    return [p.read_text() for p in files]\n")["input_ids"]])


# ---- random-init targets --------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_target_builds_deterministically_and_runs(family, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    a = F.build_family_target(family, tmp_path / "a", trained=False)
    b = F.build_family_target(family, tmp_path / "b", trained=False)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    other = F.save_family_target(F.init_family_model(family, seed=F.SEEDS[family] + 1000), family, tmp_path / "c")
    assert _sha(other / "model.safetensors") != _sha(a / "model.safetensors")

    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == [F.ARCHITECTURES[family]]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (8, 256, 4096)
    assert cfg["torch_dtype"] == "bfloat16"
    with safe_open(str(a / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_slice(n).get_dtype() for n in names} == {"BF16"}
    _assert_family_parts(family, cfg, names)

    model = AutoModelForCausalLM.from_pretrained(str(a), dtype=torch.bfloat16, local_files_only=True).eval()
    ids = _text_ids(a)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == 8 + 1
    assert all(h.shape == (1, ids.shape[1], 256) and h.dtype == torch.bfloat16 for h in out.hidden_states)
    assert out.logits.shape == (1, ids.shape[1], 4096) and bool(out.logits.isfinite().all())


def _assert_family_parts(family: str, cfg: dict, names: set[str]) -> None:
    """What makes the family itself, read from the written config and checkpoint keys."""
    if family == "deepseek_v3":
        assert (cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == (64, 32, 16, 32)
        assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["rope_scaling"]["type"] == "yarn"
        assert (cfg["n_routed_experts"], cfg["n_shared_experts"], cfg["num_experts_per_tok"]) == (4, 1, 2)
        assert cfg["n_group"] > cfg["topk_group"] >= 1, "grouped top-k must drop a group"
        assert cfg["first_k_dense_replace"] == 1 and cfg["topk_method"] == "noaux_tc"
        assert "model.layers.0.mlp.gate_proj.weight" in names            # dense first layer
        assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in names
        assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
        assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in names   # MLA latent
    elif family == "gpt_oss":
        assert cfg["layer_types"] == ["sliding_attention", "full_attention"] * 4
        assert cfg["sliding_window"] == F.SLIDING_WINDOW
        assert (cfg["num_local_experts"], cfg["num_experts_per_tok"]) == (4, 2)
        assert "model.layers.0.self_attn.sinks" in names
    elif family == "qwen3_moe":
        # transformers 5 writes num_local_experts; SGLang reads config.num_experts (attribute_map)
        from transformers import AutoConfig

        assert (AutoConfig.for_model(**cfg).num_experts, cfg["num_experts_per_tok"]) == (4, 2)
        assert {f"model.layers.{i}.mlp.experts.3.down_proj.weight" for i in range(8)} <= names
    elif family == "qwen3":
        assert "model.layers.0.self_attn.q_norm.weight" in names


def test_unknown_family_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown target family 'mixtral'; known: llama, qwen3"):
        F.build_family_target("mixtral", tmp_path, trained=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_target_training_is_deterministic(family, monkeypatch):
    monkeypatch.setattr(F, "LM_STEPS", 2)
    monkeypatch.setattr(F, "TEXT_FILES", 2)
    monkeypatch.setattr(F, "VAL_FILES", 1)
    (m1, s1), (m2, _) = (F.train_family_target(family, log=lambda m: None) for _ in range(2))
    init = F.init_family_model(family).state_dict()
    sd1, sd2 = m1.state_dict(), m2.state_dict()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    assert any(not torch.equal(sd1[k], init[k]) for k in sd1), "training changed no weight"
    assert s1["steps"] == 2


# ---- SGLang aux ids ----------------------------------------------------------------------------------
_SGLANG_CLASSES = {"llama": ("llama", "LlamaForCausalLM"), "qwen3": ("qwen3", "Qwen3ForCausalLM"),
                   "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
                   "deepseek_v3": ("deepseek_v2", "DeepseekV3ForCausalLM"),
                   "gpt_oss": ("gpt_oss", "GptOssForCausalLM")}


def _sglang_capture(family: str, ids: list[int], num_layers: int = 8) -> list[int]:
    """``layers_to_capture`` after SGLang's own ``set_eagle3_layers_to_capture(ids)``."""
    import importlib
    from types import SimpleNamespace

    module, name = _SGLANG_CLASSES[family]
    cls = getattr(importlib.import_module(f"sglang.srt.models.{module}"), name)
    inner = SimpleNamespace()  # qwen3_moe hands the shifted ids to its inner model's setter
    inner.set_eagle3_layers_to_capture = lambda got: setattr(inner, "layers_to_capture", list(got))
    self = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                           config=SimpleNamespace(num_hidden_layers=num_layers), model=inner)
    cls.set_eagle3_layers_to_capture(self, ids)
    return inner.layers_to_capture


@pytest.mark.parametrize("family", FAMILIES)
def test_aux_id_rule_is_sglangs(family):
    pytest.importorskip("sglang")
    cases = [[-1, 2, 5], [0, 3, 6], [1, 3, 4], [1, 4, 7], [0, 3, 8], [2, 5, 6], [3, 6, 8]]
    for ids in cases:
        assert F.sglang_captured_hf(family, ids) == _sglang_capture(family, ids), (family, ids)
    from specdiff.tui.scenarios import TRAINED_HF

    ids = F.sglang_aux_ids(family, TRAINED_HF)
    assert _sglang_capture(family, ids) == list(TRAINED_HF)
    assert ids == ([0, 3, 6] if family == "deepseek_v3" else [-1, 2, 5])


def test_aux_ids_that_no_rule_reaches_are_refused():
    # DeepSeek: literal [1, ...] is read as [id + 1]; [0, ...] + 1 would need ids[0] == 1
    with pytest.raises(ValueError, match=r"no SGLang aux ids capture HF \[1, 4, 7\] on a 8-layer deepseek_v3"):
        F.sglang_aux_ids("deepseek_v3", [1, 4, 7])
    # GPT-OSS reaches HF L both ways: ids [0, 3, 8] (max id = L, literal) and [-1, 2, 7] (+1)
    assert F.sglang_captured_hf("gpt_oss", [0, 3, 8]) == F.sglang_captured_hf("gpt_oss", [-1, 2, 7]) == [0, 3, 8]


# ---- trained pairs ----------------------------------------------------------------------------------
#: conservative floor for the draft's depth-0 accuracy: chance over a 1024-id draft vocab is ~0.001
MIN_ACC0 = 0.3


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_trained_draft_predicts_its_target(family, family_models):
    from specdiff.demo_models.train_draft import capture_features, evaluate
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.model.target_capture import load_target, target_embedding
    from specdiff.tui.demo_data import load_prompt_lens, load_sequences
    from specdiff.tui.scenarios import TRAINED_HF

    pair = family_models[family]
    man = pair.manifest
    assert man["architecture"] == F.ARCHITECTURES[family]
    acc = man["draft"]["train_acc_last_epoch"]
    assert len(acc) == 3 and acc[0] > MIN_ACC0, acc
    assert man["target"]["val_loss"] < 8.3, "the target learned nothing (uniform over 4096 ids is 8.32)"

    raw = json.loads((pair.draft / "config.json").read_text())
    ids = raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert F.sglang_captured_hf(family, ids) == list(TRAINED_HF)

    # the saved bf16 files, not the manifest: held-out accuracy and chain acceptance
    target = load_target(pair.target, dtype=torch.bfloat16)
    draft = load_draft(pair.draft, target_embedding=target_embedding(target).float()).model
    held = load_sequences(pair.data, "heldout")
    ev = evaluate(draft, capture_features(target, held, TRAINED_HF), load_prompt_lens(pair.data, "heldout"))
    assert ev["acc"][0] > MIN_ACC0 and ev["accept_length"] > 1.3, ev
