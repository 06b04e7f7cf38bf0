"""record train loads the reference draft built at its compute dtype (replay/record/record_train.py
``_built_at``): the loaded draft is the plain load's bit for bit (every parameter, buffer and the rope's inverse
frequencies), at bf16 and at float32, and torch's default dtype is put back, also when the load fails."""

from __future__ import annotations

import pytest
import torch

from specdiff.replay.model.checkpoint import load_draft
from specdiff.replay.model.draft_config_read import CheckpointError
from specdiff.replay.model.target_capture import target_embedding, target_lm_head
from specdiff.replay.record.record_train import load_train_side


def _tensors(model) -> dict:
    rope = {f"rope{i}": m.inv_freq for i, m in enumerate(m for m in model.modules() if type(m).__name__ == "_Rope")}
    assert rope
    return {**model.state_dict(), **rope}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_draft_built_at_its_dtype_is_the_plain_loads(repo_models, dtype):
    side = load_train_side(repo_models / "target", repo_models / "draft", dtype=dtype, target_dtype="bfloat16",
                           probe_positions=0, device="cpu")
    assert torch.get_default_dtype() == torch.float32
    plain = load_draft(repo_models / "draft", dtype=getattr(torch, dtype), target_embedding=target_embedding(side.target),
                       target_lm_head=target_lm_head(side.target))
    ours, theirs = _tensors(side.loaded.model), _tensors(plain.model)
    assert ours.keys() == theirs.keys()
    for k, v in theirs.items():
        assert ours[k].dtype == v.dtype and torch.equal(ours[k], v), k
    assert side.loaded.notes == plain.notes and side.loaded.weights_sha256 == plain.weights_sha256


def test_the_default_dtype_is_put_back_when_the_load_fails(repo_models, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):  # raised inside load_draft
        load_train_side(repo_models / "target", tmp_path, dtype="bfloat16", probe_positions=0, device="cpu")
    assert torch.get_default_dtype() == torch.float32
