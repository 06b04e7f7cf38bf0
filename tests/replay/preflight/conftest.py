"""The pre-flight tests' pair (tests/support/preflight_pair.py says what it holds): built once per
test module, copied for each test so a test may edit its copy."""

from __future__ import annotations

import shutil

import pytest
from builders import random_specforge_draft
from support.preflight_pair import VD, H, L, V, edit_config


@pytest.fixture(scope="module")
def pair_src(tmp_path_factory):
    """(target folder, draft folder, the draft's hot target ids: int64 [VD]), built under tmp."""
    from transformers import LlamaConfig
    root = tmp_path_factory.mktemp("pair")
    target = root / "target"
    LlamaConfig(num_hidden_layers=L, hidden_size=H, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=V, max_position_embeddings=512, rope_theta=10000.0,
                eos_token_id=1, bos_token_id=0).save_pretrained(target)
    draft = root / "draft"
    hot = random_specforge_draft(draft, aux_ids=[-1, 3, 6], hidden=H, vocab=V, draft_vocab=VD)
    edit_config(draft, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 4, 7]))
    return target, draft, hot


@pytest.fixture
def pair(pair_src, tmp_path):
    """``pair_src`` copied under this test's tmp_path: (target, draft, hot ids)."""
    target, draft, hot = pair_src
    shutil.copytree(target, tmp_path / "target")
    shutil.copytree(draft, tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft", hot
