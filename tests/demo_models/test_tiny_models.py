"""The committed demo models (traces/models) load and are what the recipe says.

Built by ``python -m specdiff.demo_models.tiny_models --out traces/models``; these checks only read
them (a few seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

MODELS = Path(__file__).resolve().parents[2] / "traces" / "models"
TARGET, DRAFT, DATA = MODELS / "target", MODELS / "draft", MODELS / "data"

pytestmark = pytest.mark.skipif(not (DRAFT / "model.safetensors").is_file(),
                                reason="demo models not built (traces/models)")


@pytest.fixture(scope="module")
def tokenizer():
    from specdiff.demo_models.tiny_models import load_tokenizer
    return load_tokenizer(TARGET)


@pytest.fixture(scope="module")
def target():
    from specdiff.demo_models.tiny_models import load_target
    return load_target(TARGET)


@pytest.fixture(scope="module")
def draft(target):
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.model.target_capture import target_embedding
    return load_draft(DRAFT, target_embedding=target_embedding(target).float())


def test_tokenizer_round_trip(tokenizer):
    assert len(tokenizer) == 4096
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    text = "def f(x):\n    return {'a': x ** 2}  # caf\u00e9 \u2713\n"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 0
    assert ids.count(0) == 1
    assert max(ids) < 4096
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(ids) < len(text)  # BPE merges actually happen


def test_target_config_and_weights(target):
    cfg = json.loads((TARGET / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["torch_dtype"] == "bfloat16" and cfg["dtype"] == "bfloat16"
    for k, v in dict(num_hidden_layers=8, hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                     intermediate_size=512, vocab_size=4096, max_position_embeddings=2048,
                     tie_word_embeddings=False, bos_token_id=0).items():
        assert cfg[k] == v, k
    assert next(target.parameters()).dtype == torch.bfloat16
    from safetensors import safe_open
    with safe_open(str(TARGET / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_data_file():
    from specdiff.demo.data import load_prompt_lens, load_sequences
    train, held = load_sequences(DATA, "train"), load_sequences(DATA, "heldout")
    assert len(train) == 800 and len(held) == 64
    plens = load_prompt_lens(DATA)
    for s, p in zip(train + held, plens):
        assert s.dtype == torch.int64 and s[0] == 0
        assert 17 <= p <= 49 and 64 <= len(s) - p <= 96
        assert int(s.max()) < 4096


def test_draft_checkpoint_format(draft):
    cfg = json.loads((DRAFT / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 5]
    assert "eagle_aux_hidden_state_layer_ids" not in cfg  # SGLang would ignore a top-level key
    assert cfg["draft_vocab_size"] == 1024 and cfg["target_hidden_size"] == 256
    assert cfg["intermediate_size"] == 1024 and cfg["num_hidden_layers"] == 1
    assert cfg.get("tie_word_embeddings") is False
    from safetensors.torch import load_file
    sd = load_file(str(DRAFT / "model.safetensors"))
    assert "embed_tokens.weight" not in sd
    assert tuple(sd["fc.weight"].shape) == (256, 768)
    assert tuple(sd["lm_head.weight"].shape) == (1024, 256)
    assert any(k.startswith("midlayer.") for k in sd)
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert draft.format == "specforge" and draft.model.embed_source == "target"
    assert draft.contract_facts(8)["aux_hf_indices"] == [0, 3, 6]
    assert not [n for n in draft.notes if "d2t" in n]


def test_d2t_consistent_with_t2d(draft):
    d2t, t2d = draft.model.d2t, draft.model.t2d
    hot = torch.arange(1024) + d2t
    assert int(t2d.sum()) == 1024
    assert torch.equal(torch.nonzero(t2d).flatten(), hot)  # ascending, one-to-one
    assert int(hot.min()) >= 0 and int(hot.max()) < 4096


def test_draft_predicts_target_on_heldout(target, draft):
    """Correct aux layers beat the seed's wrong ones on a few held-out sequences."""
    from specdiff.demo.data import load_prompt_lens, load_sequences
    from specdiff.demo_models.train_draft import (
        SEED_WRONG_HF_INDICES,
        TRAIN_HF_INDICES,
        capture_features,
        evaluate,
    )
    held, plens = load_sequences(DATA, "heldout")[:8], load_prompt_lens(DATA, "heldout")[:8]
    model = draft.model.float()
    good = evaluate(model, capture_features(target, held, TRAIN_HF_INDICES), plens)
    bad = evaluate(model, capture_features(target, held, SEED_WRONG_HF_INDICES), plens)
    assert good["acc"][0] > 0.7
    assert good["accept_length"] > bad["accept_length"]
