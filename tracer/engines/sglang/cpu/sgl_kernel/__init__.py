"""specdiff's pure-torch stand-in for the ``sgl_kernel`` package on a CPU.

Not the PyPI ``sglang-kernel`` wheel (which installs a CUDA-only package of the same name):
this package registers the ``*_cpu`` ops that SGLang 0.5.23 uses with
``SGLANG_USE_CPU_ENGINE=1 --device cpu --attention-backend intel_amx`` as
``torch.ops.sgl_kernel.<name>``, implemented in plain torch, and re-exports Python wrappers
with the wheel's names and signatures (``sgl_kernel/speculative.py``, ``kvcacheio.py``
of sglang-kernel 0.4.10). It does *not* provide ``convert_weight_packed``, so SGLang's
layers take their plain-torch paths. Put the folder that contains it first on
``PYTHONPATH`` (``specdiff.tracer.engines.sglang.cpu.STANDIN_PATH``).
"""

from __future__ import annotations

from ._ops import register as _register
from ._ops import registered_ops

_register()

from .kvcacheio import copy_all_layer_kv_cache_cpu  # noqa: E402
from .speculative import (  # noqa: E402
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__version__ = "0.0.0+specdiff.cpu"
IS_SPECDIFF_STANDIN = True

__all__ = [
    "IS_SPECDIFF_STANDIN",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "registered_ops",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]
