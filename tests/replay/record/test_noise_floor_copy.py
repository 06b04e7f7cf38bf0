"""The noise floor's re-run copies the models at the other precision (replay/record/noise_floor.py
``_recast``): every floating parameter and buffer in that dtype, integer buffers (d2t) kept, tied weights
still one tensor, the original untouched; and the copy is made without a whole second copy at the
recorded dtype (the memory a 7168-wide target cannot spare)."""

from __future__ import annotations

import torch

from specdiff.replay.record.noise_floor import _recast


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight  # tie_word_embeddings
        self.norm = torch.nn.LayerNorm(32)
        self.register_buffer("d2t", torch.arange(64, dtype=torch.int64))
        self.register_buffer("cos_sin_cache", torch.randn(16, 8))


def test_the_copy_is_in_the_other_dtype_with_ints_kept_ties_kept_and_the_original_untouched():
    torch.manual_seed(0)
    m = Tied().to(torch.bfloat16)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    twin = _recast(m, torch.float32)
    assert all(p.dtype == torch.float32 for p in twin.parameters())
    assert twin.cos_sin_cache.dtype == torch.float32 and twin.d2t.dtype == torch.int64
    assert twin.head.weight is twin.embed.weight  # still tied
    assert twin.d2t.data_ptr() != m.d2t.data_ptr() and twin.embed.weight.data_ptr() != m.embed.weight.data_ptr()
    assert torch.equal(twin.embed.weight, m.embed.weight.float()) and torch.equal(twin.norm.bias, m.norm.bias.float())
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert twin.embed.weight.requires_grad == m.embed.weight.requires_grad


def test_no_copy_at_the_recorded_dtype_is_made(monkeypatch):
    # every tensor the copy allocates at the recorded dtype would pass through Tensor.clone / deepcopy of a
    # tensor; with the memo, deepcopy meets no floating tensor it has not already been given converted
    m = Tied().to(torch.bfloat16)
    seen = []
    for cls in (torch.Tensor, torch.nn.Parameter):  # a parameter has its own __deepcopy__
        def counting(self, memo, _deep=cls.__deepcopy__):
            seen.append(self.dtype)
            return _deep(self, memo)

        monkeypatch.setattr(cls, "__deepcopy__", counting)
    _recast(m, torch.float32)
    assert torch.bfloat16 not in seen, seen
