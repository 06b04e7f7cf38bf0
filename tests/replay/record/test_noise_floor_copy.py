"""The noise floor's re-run at the other precision without a copy of either model (replay/record/noise_floor.py
``at_other_precision``): the floor is the one float32 (or bf16) copies of both models give, bit for bit, for a
bf16 and a float32 recording; a transformers target is cast one module at a time (only the running module is at
the other precision), the draft whole; and every original tensor is put back as it was (the same storage),
also when the re-run raises."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest
import torch

from specdiff.replay.record import noise_floor
from specdiff.replay.record.noise_floor import at_other_precision, measure_noise_floor


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight  # tie_word_embeddings
        self.norm = torch.nn.LayerNorm(32)
        self.register_buffer("d2t", torch.arange(64, dtype=torch.int64))
        self.register_buffer("cos_sin_cache", torch.randn(16, 8))

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


def _state(m: torch.nn.Module) -> dict:
    return {k: (v.dtype, v.data_ptr(), v.clone()) for k, v in m.state_dict(keep_vars=True).items()}


def _same(m: torch.nn.Module, before: dict) -> bool:
    now = m.state_dict(keep_vars=True)
    return all(now[k].dtype == d and now[k].data_ptr() == p and torch.equal(now[k], v) for k, (d, p, v) in before.items())


def test_the_target_is_cast_module_by_module_the_draft_whole_and_both_put_back():
    torch.manual_seed(0)
    target, draft = Tied().to(torch.bfloat16), Tied().to(torch.bfloat16)
    t0, d0 = _state(target), _state(draft)
    seen = {}
    with at_other_precision(target, draft, torch.float32, torch.float32) as (t, d):
        # runs after the cast's own pre-hook (hooks run in the order registered)
        target.norm.register_forward_pre_hook(lambda m, a: seen.update(norm=m.weight.dtype,
                                                                       embed=target.embed.weight.dtype))
        assert t is target and d is draft  # the same objects, no copy
        assert all(p.dtype == torch.float32 for p in draft.parameters()) and draft.d2t.dtype == torch.int64
        assert draft.head.weight is draft.embed.weight  # still tied
        assert all(p.dtype == torch.bfloat16 for p in target.parameters())  # nothing runs yet
        out = target(torch.arange(8)[None])
        assert out.dtype == torch.float32 and seen == {"norm": torch.float32, "embed": torch.bfloat16}
        assert all(p.dtype == torch.bfloat16 for p in target.parameters())  # each module put back after its forward
    assert _same(target, t0) and _same(draft, d0)
    assert torch.equal(out, Tied.forward(copy.deepcopy(target).float(), torch.arange(8)[None]))


def test_every_tensor_is_put_back_when_the_rerun_raises():
    target, draft = Tied().to(torch.bfloat16), Tied().to(torch.bfloat16)
    t0, d0 = _state(target), _state(draft)

    def boom(m, a):
        raise RuntimeError("boom")

    target.head.register_forward_pre_hook(boom)  # after embed and norm were cast, inside the forward
    with pytest.raises(RuntimeError, match="boom"), at_other_precision(target, draft, torch.float32, torch.float32):
        target(torch.arange(8)[None])
    assert _same(target, t0) and _same(draft, d0)


@contextmanager
def _float32_copies(target, draft, target_dtype, draft_dtype):
    """What the floor re-ran before: deep copies of both models at the other precision."""
    yield copy.deepcopy(target).to(target_dtype), copy.deepcopy(draft).to(draft_dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_floor_is_the_one_copies_at_the_other_precision_give(repo_models, monkeypatch, dtype):
    from specdiff.replay.record.record_train import load_train_side
    from specdiff.replay.record.sequences import sequences_from_trace

    seqs, _ = sequences_from_trace(str(repo_models.parent / "examples" / "seed" / "serve.trace"))
    side = load_train_side(repo_models / "target", repo_models / "draft", dtype=dtype, target_dtype=dtype,
                           probe_positions=4, device="cpu")
    rep, ids = side.replayer, [s.seq_id for s in seqs]
    t0, d0 = _state(rep.target), _state(rep.draft)
    in_place = measure_noise_floor(rep, seqs, ids)
    assert _same(rep.target, t0) and _same(rep.draft, d0)
    monkeypatch.setattr(noise_floor, "at_other_precision", _float32_copies)
    copies = measure_noise_floor(rep, seqs, ids)
    assert in_place == copies
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    assert in_place["method"] == f"the recorded {dtype} forward re-run in {other}"
    assert {"target.aux.1", "target.probe.3", "draft.fc_out", "draft.hidden_out"} <= set(in_place["tensors"])
    assert in_place["tensors"]["draft.fc_out"]["median_rel"] > 0  # a re-run at another precision, not the same


class _HoldsStates(Tied):
    """A target whose states are read, not computed (stored features, an engine)."""

    def capture_batch(self, *args, **kwargs):
        raise AssertionError("not called here")


def test_a_target_holding_its_states_is_not_cast():
    target, draft = _HoldsStates().to(torch.bfloat16), Tied().to(torch.bfloat16)
    t0 = _state(target)
    with at_other_precision(target, draft, torch.float32, torch.float32):
        assert _same(target, t0) and draft.norm.weight.dtype == torch.float32
    draft_bytes = noise_floor.whole_cast_bytes(draft, torch.float32)
    assert noise_floor._need_bytes(target, draft, torch.float32, torch.float32) == draft_bytes


def test_the_floor_of_stored_features_is_the_one_with_their_target_cast(repo_models, monkeypatch, tmp_path):
    """Stored features: the target's states are read from the files, so the draft stages' floor is the same
    whether or not the target's head is cast (its target.* stages are left out either way)."""
    import json

    from builders import write_stored_features

    from specdiff.replay.record.record_features import record_features
    from specdiff.replay.record.sequences import sequences_from_trace
    from specdiff.tracer.store import open_trace

    seqs, _ = sequences_from_trace(str(repo_models.parent / "examples" / "seed" / "serve.trace"))
    tokens = [s.tokens for s in seqs[:2]]
    H = json.loads((repo_models / "target" / "config.json").read_text())["hidden_size"]
    g = torch.Generator().manual_seed(0)
    slots = [torch.randn(len(t), 3, H, generator=g).bfloat16() for t in tokens]
    last = [torch.randn(len(t), H, generator=g).bfloat16() for t in tokens]
    feats = write_stored_features(tmp_path / "f", "speculators", tokens, slots, last)

    def floor(out):
        record_features(feats, repo_models / "target", repo_models / "draft", str(tmp_path / out),
                        aux_layers=[0, 3, 6], aux_convention="hf")
        return open_trace(str(tmp_path / out)).contract["noise_floor"]

    now = floor("now.trace")
    monkeypatch.setattr(noise_floor, "_holds_states", lambda target: False)  # the code before: cast whole
    monkeypatch.setattr(noise_floor, "_by_module", lambda target: False)
    before = floor("before.trace")
    assert now == before and now["tensors"] and all(k.startswith("draft.") for k in now["tensors"])
