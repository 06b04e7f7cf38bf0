"""The tiny targets of every family (``specdiff.demo_models.families``) and their EAGLE-3 drafts.

- every family builds, deterministically (same seed -> byte-identical safetensors; another seed
  -> other bytes), with the architecture's defining parts (MLA + grouped routing + shared
  expert, sliding/full + sinks, experts), and runs a bf16 forward with L + 1 hidden states;
- the brief language-model training is deterministic;
- the SGLang aux-id rule used for each family's draft (``eagle3.families``) is the one SGLang
  0.5.23's own ``set_eagle3_layers_to_capture`` applies (called on a stand-in ``self``);
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
    monkeypatch.setattr(F, "LM_STEPS_BY_FAMILY", {})
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
    """The rule each family's draft is saved with (``eagle3.aux_layers``, through
    ``families.sglang_rule``) is what SGLang 0.5.23's own setter does, and the ids it gives for
    the trained layers capture exactly those layers there."""
    pytest.importorskip("sglang")
    rule = F.sglang_rule(family)
    assert rule.known and rule.architecture == F.ARCHITECTURES[family]
    cases = [[-1, 2, 5], [0, 3, 6], [1, 3, 4], [1, 4, 7], [0, 3, 8], [2, 5, 6], [3, 6, 8]]
    for ids in cases:
        assert list(rule.capture_indices(ids, 8)) == _sglang_capture(family, ids), (family, ids)
    from specdiff.demo.scenarios import TRAINED_HF

    ids = F.sglang_serve_ids(family, TRAINED_HF)
    assert _sglang_capture(family, ids) == list(TRAINED_HF)
    assert ids == ([0, 3, 6] if family == "deepseek_v3" else [-1, 2, 5])


def test_aux_ids_the_deepseek_rule_reads_otherwise_are_reordered_or_refused():
    import importlib.util

    from specdiff.eagle3.aux_layers import ConventionError

    # DeepSeek: literal [1, ...] would be read as [id + 1]; SGLang captures a set, so [4, 1, 7] does it
    ids = F.sglang_serve_ids("deepseek_v3", [1, 4, 7])
    assert ids == [4, 1, 7]
    if importlib.util.find_spec("sglang") is not None:
        assert sorted(_sglang_capture("deepseek_v3", ids)) == [1, 4, 7]
    with pytest.raises(ConventionError, match="cannot express HF index 8"):  # no DeepSeek id reaches HF L
        F.sglang_serve_ids("deepseek_v3", [0, 3, 8])
    # GPT-OSS reaches capture index L both ways: ids [0, 3, 8] (max id = L, literal) and [-1, 2, 7] (+1)
    rule = F.sglang_rule("gpt_oss")
    assert rule.capture_indices([0, 3, 8], 8) == rule.capture_indices([-1, 2, 7], 8) == (0, 3, 8)


# ---- trained pairs ----------------------------------------------------------------------------------
#: conservative floor for the draft's depth-0 accuracy: chance over a 1024-id draft vocab is ~0.001
MIN_ACC0 = 0.3
#: trained pairs take minutes each to build: by default only the seed's family (DeepSeek-V3) is
#: built; the others are marked family_pair (``make test-families`` / ``--family-pairs``)
PAIR_FAMILIES = [pytest.param(f, marks=() if f == "deepseek_v3" else pytest.mark.family_pair) for f in FAMILIES]
#: a trained target's held-out greedy continuations (16 of 32-40 tokens) must use at least this many
#: distinct token ids together, and half of them at least MIN_DISTINCT_EACH each: a target that
#: loops on one or two tokens makes every draft look right (measured: the 60-step Qwen3 target used
#: 2 ids in all, 1 per continuation; DeepSeek-V3 18 in all, median 8)
MIN_DISTINCT_ALL = 12
MIN_DISTINCT_EACH = 4


@pytest.mark.slow
@pytest.mark.parametrize("family", PAIR_FAMILIES)
def test_trained_target_continuations_are_not_a_loop(family, family_models):
    import numpy as np

    from specdiff.demo.data import load_prompt_lens, load_sequences

    pair = family_models[family]
    seqs, lens = load_sequences(pair.data, "heldout"), load_prompt_lens(pair.data, "heldout")
    conts = [s[p:].tolist() for s, p in zip(seqs, lens, strict=True)]
    each = [len(set(c)) for c in conts]
    union = len(set().union(*conts))
    print(f"{family}: held-out continuations use {union} distinct ids, per continuation {each}; "
          f"pair built in {pair.manifest['total_seconds']:.0f}s")
    assert union >= MIN_DISTINCT_ALL, (family, union, each)
    assert float(np.median(each)) >= MIN_DISTINCT_EACH, (family, each)


@pytest.mark.slow
@pytest.mark.parametrize("family", PAIR_FAMILIES)
def test_trained_draft_predicts_its_target(family, family_models):
    from specdiff.demo.data import load_prompt_lens, load_sequences
    from specdiff.demo.scenarios import TRAINED_HF
    from specdiff.demo_models.train_draft import capture_features, evaluate
    from specdiff.eagle3.aux_layers import engine_capture
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.model.target_capture import load_target, target_embedding

    pair = family_models[family]
    man = pair.manifest
    assert man["architecture"] == F.ARCHITECTURES[family]
    acc = man["draft"]["train_acc_last_epoch"]
    assert len(acc) == 3 and acc[0] > MIN_ACC0, acc
    assert man["target"]["val_loss"] < 8.3, "the target learned nothing (uniform over 4096 ids is 8.32)"

    raw = json.loads((pair.draft / "config.json").read_text())
    ids = raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    plan = engine_capture("sglang", ids, num_layers=8, architecture=F.ARCHITECTURES[family])
    assert list(plan.hf_indices) == list(TRAINED_HF) and not plan.dropped

    # the saved bf16 files, not the manifest: held-out accuracy and chain acceptance
    target = load_target(pair.target, dtype=torch.bfloat16)
    draft = load_draft(pair.draft, target_embedding=target_embedding(target).float()).model
    held = load_sequences(pair.data, "heldout")
    ev = evaluate(draft, capture_features(target, held, TRAINED_HF), load_prompt_lens(pair.data, "heldout"))
    assert ev["acc"][0] > MIN_ACC0 and ev["accept_length"] > 1.3, ev
