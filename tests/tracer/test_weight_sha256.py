"""``weight_sha256`` hashes a block of rows at a time: the digest is the one of the whole weight's float32
C-order bytes (what every trace recorded before), for every shape, dtype and row cut."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from specdiff.tracer import contract
from specdiff.tracer.contract import weight_sha256


def _whole(w: torch.Tensor, rows: int | None = None) -> str:
    w = w if rows is None else w[:rows]
    return hashlib.sha256(np.ascontiguousarray(w.float().numpy()).tobytes()).hexdigest()


@pytest.mark.parametrize("shape", [(), (7,), (0, 5), (13, 5), (9, 2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_blockwise_digest_is_the_whole_weights(monkeypatch, shape, dtype):
    monkeypatch.setattr(contract, "HASH_BLOCK_BYTES", 24)  # a few rows a block: every boundary is crossed
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert weight_sha256(w) == _whole(w)
    if w.dim() and len(w) > 2:
        assert weight_sha256(w, rows=len(w) - 2) == _whole(w, len(w) - 2)
        assert weight_sha256(w.transpose(0, -1)) == _whole(w.transpose(0, -1))  # not contiguous
