"""``sgl_kernel.kvcacheio`` stand-in: only the CPU op SGLang 0.5.23 uses on a CPU."""

from __future__ import annotations

import torch

from ._ops import register

register()


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy KV slot rows ``src_loc -> tgt_loc`` in every buffer (see ``_spec.copy_all_layer_kv_cache``).

    data_ptrs [num_bufs] uint64 addresses, strides [num_bufs] int64 bytes per row,
    tgt_loc / src_loc [num_locs] int. Signature of sglang-kernel 0.4.10 ``kvcacheio.py``.
    """
    torch.ops.sgl_kernel.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc)
