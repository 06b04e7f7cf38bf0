"""``sgl_kernel.speculative`` stand-in: Python wrappers with sglang-kernel 0.4.10's names and
signatures, calling the pure-torch ops registered in ``_ops`` (semantics in ``_spec``)."""

from __future__ import annotations

import torch

from ._ops import register

register()


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verify; shapes in ``_spec.verify_tree_greedy``. Mutates the first three."""
    torch.ops.sgl_kernel.verify_tree_greedy_cpu(
        predicts, accept_index, accept_token_num, candidates,
        retrive_index, retrive_next_token, retrive_next_sibling, target_predict,
    )


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the verify tree; shapes in ``_spec.build_tree_kernel_efficient``."""
    torch.ops.sgl_kernel.build_tree_kernel_efficient_cpu(
        parent_list, selected_index, verified_seq_len, tree_mask, positions,
        retrive_index, retrive_next_token, retrive_next_sibling,
        int(topk), int(depth), int(draft_token_num), int(tree_mask_mode),
    )


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Scatter new KV slots into req_to_token; see ``_spec.assign_req_to_token_pool``."""
    torch.ops.sgl_kernel.assign_req_to_token_pool_cpu(
        req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, int(pool_len)
    )


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Expanded [num_seqs*topk, pool_len] int32 req_to_token for multi-step draft decode."""
    return torch.ops.sgl_kernel.build_draft_decode_metadata_cpu(
        req_to_token, req_pool_indices, seq_lens, int(topk), int(num_steps), int(pool_len)
    )


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """bonus_tokens[i] = last accepted token of request i; see ``_spec.fill_bonus_tokens``."""
    torch.ops.sgl_kernel.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, int(accept_stride))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact accepted KV slots; see ``_spec.fill_accept_out_cache_loc``."""
    torch.ops.sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Read back each request's topk*num_steps draft slots; see ``_spec``."""
    torch.ops.sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
        req_pool_indices, req_to_token, seq_lens, out_cache_loc, int(pool_len), int(topk), int(num_steps)
    )


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather each request's slots in [start, end) into out_cache_loc; see ``_spec``."""
    torch.ops.sgl_kernel.assign_extend_cache_locs_cpu(
        req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, int(pool_len)
    )


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each extend segment left by one and append the new token; see ``_spec``."""
    torch.ops.sgl_kernel.rotate_input_ids_cpu(
        input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index
    )
