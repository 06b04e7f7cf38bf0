"""Register the pure-torch stand-ins as ``torch.ops.sgl_kernel.<name>`` (torch.library).

Schemas follow the argument lists SGLang 0.5.23 passes (its CPU call sites and the
``sglang-kernel`` 0.4.10 Python wrappers). Registration is idempotent: if the stand-in is
imported twice under two module names (``sgl_kernel`` and
``specdiff.tracer.engines.sglang.cpu.sgl_kernel``), the ops defined first are kept.
``convert_weight_packed`` is deliberately *not* registered: SGLang probes it to decide
whether the AMX weight-packed paths exist, and without it every layer takes plain torch.
"""

from __future__ import annotations

import torch

from . import _attention, _spec

NAMESPACE = "sgl_kernel"

# name -> (schema, implementation, fake implementation or None for "mutates only")
_SCHEMAS: dict[str, str] = {
    "copy_all_layer_kv_cache_cpu": "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor out_cache_loc, int pool_len) -> ()"
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len) -> ()"
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, "
        "int pool_len, int topk, int num_steps) -> ()"
    ),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, int num_steps, "
        "int pool_len) -> Tensor"
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()"
    ),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc) -> ()"
    ),
    "rotate_input_ids_cpu": (
        "(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, Tensor topk_index, "
        "Tensor? select_index=None) -> ()"
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, Tensor(a!) tree_mask, "
        "Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()"
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor target_predict) -> ()"
    ),
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, float v_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
        "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
    ),
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, Tensor k_buffer, "
        "Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, int? max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? custom_mask, bool is_causal) -> ()"
    ),
}

_IMPLS = {
    "copy_all_layer_kv_cache_cpu": _spec.copy_all_layer_kv_cache,
    "assign_req_to_token_pool_cpu": _spec.assign_req_to_token_pool,
    "assign_extend_cache_locs_cpu": _spec.assign_extend_cache_locs,
    "assign_draft_cache_locs_contiguous_cpu": _spec.assign_draft_cache_locs_contiguous,
    "build_draft_decode_metadata_cpu": _spec.build_draft_decode_metadata,
    "fill_bonus_tokens_cpu": _spec.fill_bonus_tokens,
    "fill_accept_out_cache_loc_cpu": _spec.fill_accept_out_cache_loc,
    "rotate_input_ids_cpu": _spec.rotate_input_ids,
    "build_tree_kernel_efficient_cpu": _spec.build_tree_kernel_efficient,
    "verify_tree_greedy_cpu": _spec.verify_tree_greedy,
    "decode_attention_cpu": _attention.decode_attention,
    "extend_attention_cpu": _attention.extend_attention,
}


#: SGLang before 0.5.20 calls the two attention ops without the KV-cache scales (0.5.19
#: ``layers/attention/intel_amx_backend.py:228`` and ``:291``); from 0.5.20 on ``k_scale, v_scale``
#: follow the cache buffers. Registered: the argument list of the installed SGLang, read from its
#: package metadata (the stand-in imports nothing from SGLang).
KV_SCALE_ARGS_SINCE = "0.5.20"
_KV_SCALES = "float k_scale, float v_scale, "


def sglang_passes_kv_scales(sglang_version: str | None = None) -> bool:
    """True when ``sglang_version`` (default: the installed SGLang's) passes ``k_scale, v_scale``
    to ``decode_attention_cpu`` / ``extend_attention_cpu``; True when SGLang is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    if sglang_version is None:
        try:
            sglang_version = version("sglang")
        except PackageNotFoundError:
            return True
    return Version(Version(sglang_version).base_version) >= Version(KV_SCALE_ARGS_SINCE)


def _without_kv_scales(schema: str, impl):
    """Schema and implementation for SGLang's older argument list: unscaled KV cache (scale 1)."""
    at = schema[:schema.index(_KV_SCALES)].count(",")

    def call(*args):
        return impl(*args[:at], 1.0, 1.0, *args[at:])

    return schema.replace(_KV_SCALES, ""), call


def _fake_draft_metadata(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    return req_to_token.new_empty((req_pool_indices.shape[0] * topk, pool_len))


def _fake_none(*args, **kwargs):
    return None


_LIB: torch.library.Library | None = None


def registered_ops() -> list[str]:
    """Names of the ops this stand-in provides under ``torch.ops.sgl_kernel``."""
    return list(_SCHEMAS)


def register() -> None:
    """Define and implement every stand-in op once per process (idempotent)."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    scales = sglang_passes_kv_scales()
    for name, schema in _SCHEMAS.items():
        impl = _IMPLS[name]
        if not scales and _KV_SCALES in schema:
            schema, impl = _without_kv_scales(schema, impl)
        qualname = f"{NAMESPACE}::{name}"
        if torch._C._dispatch_has_kernel(qualname) and torch._C._dispatch_has_kernel_for_dispatch_key(
            qualname, "CPU"
        ):
            continue  # already provided (stand-in imported under another name, or a real build)
        if not torch._C._dispatch_has_kernel(qualname):
            lib.define(name + schema)
        lib.impl(name, impl, "CPU")
        fake = _fake_draft_metadata if name == "build_draft_decode_metadata_cpu" else _fake_none
        try:
            torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        except Exception:  # noqa: BLE001 - fake kernels are only needed under torch.compile
            pass
    _LIB = lib
