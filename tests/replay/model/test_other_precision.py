"""A model at its other precision without a copy (replay/model/other_precision.py): the draft cast whole computes
bit for bit what a float32 copy computes, an embedding read only by its lookup keeps its table (its output is cast),
a table read any other way is cast, and every original tensor is put back (same storage); the diff's re-run at the
other precision (replay/diff/rerun/noise.py ``other_precision``) is the same object, not a copy."""

from __future__ import annotations

import copy

import pytest
import torch

from specdiff.eagle3.norms import NORMS_OFF
from specdiff.replay.diff.rerun import noise
from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig
from specdiff.replay.model.other_precision import cast_whole, lookup_tables, other_dtype, whole_cast_bytes


def _draft(dtype=torch.bfloat16, **kw) -> Eagle3Draft:
    cfg = Eagle3DraftConfig(**{**dict(hidden_size=32, intermediate_size=40, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, vocab_size=64, draft_vocab_size=16,
                                      target_hidden_size=24, num_aux=3, rms_norm_eps=1e-5, rope_theta=10000.0,
                                      rope_scaling=None, **NORMS_OFF), **kw})
    torch.manual_seed(0)
    model = Eagle3Draft(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.to(dtype).eval()


def _state(m: torch.nn.Module) -> dict:
    return {k: (v.dtype, v.data_ptr(), v.clone()) for k, v in m.state_dict(keep_vars=True).items()}


def _same(m: torch.nn.Module, before: dict) -> bool:
    now = m.state_dict(keep_vars=True)
    return all(now[k].dtype == d and now[k].data_ptr() == p and torch.equal(now[k], v) for k, (d, p, v) in before.items())


def _run(model):
    g = torch.Generator().manual_seed(1)
    aux, ids = torch.randn(2, 6, 72, generator=g), torch.randint(3, 64, (2, 6), generator=g)
    with torch.no_grad():
        out = model.ttt_forward(aux, ids, 3)
    return [*out.attn_in, *out.hidden_out, *out.logits, out.fc_out]


def _equal(a: list, b: list) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_draft_cast_whole_keeps_its_lookup_table_and_computes_what_a_copy_computes(dtype):
    draft = _draft(dtype)
    before, other = _state(draft), other_dtype(dtype)
    copied = _run(copy.deepcopy(draft).to(other))
    with cast_whole(draft, other) as same:
        assert same is draft
        # the table is not cast: its lookup's rows are cast instead (the same values, not its bytes at float32)
        assert draft.embed_tokens.weight.dtype == dtype and draft.embed_tokens.weight.data_ptr() == before[
            "embed_tokens.weight"][1]
        assert draft.fc.weight.dtype == other and draft.d2t.dtype == torch.int64
        assert _equal(_run(draft), copied)
    assert _same(draft, before)
    table = draft.embed_tokens.weight.numel() * torch.empty((), dtype=other).element_size()
    everything = sum(p.numel() for p in draft.parameters()) * torch.empty((), dtype=other).element_size()
    assert whole_cast_bytes(draft, other) == everything - table


def test_a_table_the_tied_head_reads_is_cast():
    """``tie_word_embeddings``: the draft's head reads the embedding's weight directly, not through its lookup."""
    draft = _draft(tie_word_embeddings=True)
    before = _state(draft)
    assert lookup_tables(draft) == []
    copied = _run(copy.deepcopy(draft).float())
    with cast_whole(draft, torch.float32):
        assert draft.embed_tokens.weight.dtype == torch.float32
        assert _equal(_run(draft), copied)
    assert _same(draft, before)


class _Scaled(torch.nn.Embedding):
    """An embedding whose forward computes on its rows (Gemma's scaled word embedding)."""

    def forward(self, ids):
        return super().forward(ids) * 1.7


class _Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = torch.nn.Embedding(8, 4)
        self.tied = torch.nn.Embedding(8, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.tied.weight
        self.scaled = _Scaled(8, 4)
        self.renormed = torch.nn.Embedding(8, 4, max_norm=1.0)


def test_only_a_plain_embedding_read_by_its_lookup_alone_keeps_its_table():
    m = _Heads()
    assert lookup_tables(m) == [m.plain]


def test_the_diffs_rerun_at_the_other_precision_is_the_draft_itself_put_back_after():
    draft = _draft()
    before = _state(draft)
    copied = _run(copy.deepcopy(draft).float())
    with noise.other_precision(draft) as other:
        assert other is draft and draft.fc.weight.dtype == torch.float32
        assert _equal(_run(other), copied)
    assert _same(draft, before)
    with pytest.raises(RuntimeError, match="boom"), noise.other_precision(draft):
        raise RuntimeError("boom")
    assert _same(draft, before)
