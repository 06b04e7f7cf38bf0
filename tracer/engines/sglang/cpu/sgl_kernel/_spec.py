"""Pure-torch ports of sgl-kernel's speculative-decoding and KV-cache CPU ops.

Each function mutates its output arguments in place (as the C++ ops do) unless it says it
returns a tensor. Semantics follow SGLang 0.5.23's Triton reference kernels in
``sglang/kernels/ops/speculative/{spec_tree,eagle,cache_locs}.py`` and
``sglang/kernels/ops/kvcache/cache_move.py``, and the C++ CPU kernels they stand in for
(``sgl-kernel/csrc/cpu/spec.cpp``, ``kvcache.cpp``). Batch loops run in Python: batches on a
CPU test server are small, and clarity beats speed here.
"""

from __future__ import annotations

import ctypes

import torch


def _ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


# --------------------------------------------------------------------------- KV cache moves


def copy_all_layer_kv_cache(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every K/V buffer b: ``buf_b[tgt_loc[i], :] = buf_b[src_loc[i], :]`` (byte rows).

    data_ptrs: [num_bufs] uint64 (or int64) base addresses of each buffer; strides: [num_bufs]
    int64 bytes per slot row; tgt_loc / src_loc: [num_locs] int32/int64 slot indices.
    All sources are read before any target is written (gather then scatter), so overlapping
    locations are safe, as in the Triton kernel ``copy_all_layer_kv_cache_tiled``.
    The buffers are addressed through ctypes views of the raw pointers (the op only gets
    addresses, like the Triton and C++ kernels).
    """
    n = int(tgt_loc.numel())
    if n == 0 or data_ptrs.numel() == 0:
        return
    src = src_loc.reshape(-1).to(torch.int64)
    tgt = tgt_loc.reshape(-1).to(torch.int64)
    rows = int(max(int(src.max()), int(tgt.max()))) + 1
    ptrs = _ints(data_ptrs.view(torch.int64) if data_ptrs.dtype == torch.uint64 else data_ptrs)
    for ptr, stride in zip(ptrs, _ints(strides), strict=True):
        ptr &= (1 << 64) - 1
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        staged = buf.index_select(0, src)
        buf.index_copy_(0, tgt, staged)


# --------------------------------------------------------------------------- cache locations


def assign_req_to_token_pool(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[rpi[i], start[i]:end[i]] = out_cache_loc[prefix[i]:prefix[i+1]]``.

    req_pool_indices: [bs] int; req_to_token: [max_reqs, pool_len] int32 (written);
    start/end_offset: [bs] int; out_cache_loc: [sum(end-start)] int64; prefix = exclusive
    cumsum of (end - start). Port of sgl-kernel ``assign_req_to_token_pool_cpu``.
    """
    flat = req_to_token.view(-1)
    off = 0
    for r, s, e in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset), strict=True):
        n = e - s
        if n > 0:
            base = r * pool_len + s
            flat[base : base + n] = out_cache_loc[off : off + n].to(flat.dtype)
        off += max(n, 0)


def assign_extend_cache_locs(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``out_cache_loc[prefix[i]:prefix[i+1]] = req_to_token[rpi[i], start[i]:end[i]]``.

    Inverse direction of :func:`assign_req_to_token_pool`; out_cache_loc int64 (written).
    Port of SGLang 0.5.23 ``kernels/ops/speculative/cache_locs.py:assign_extend_cache_locs``.
    """
    flat = req_to_token.reshape(-1)
    off = 0
    for r, s, e in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset), strict=True):
        n = e - s
        if n > 0:
            base = r * pool_len + s
            out_cache_loc[off : off + n] = flat[base : base + n].to(out_cache_loc.dtype)
        off += max(n, 0)


def assign_draft_cache_locs_contiguous(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``out_cache_loc[i*topk*S : (i+1)*topk*S] = req_to_token[rpi[i], seq_lens[i] : +topk*S]``.

    out_cache_loc: [bs*topk*num_steps] int64 (written). Port of SGLang 0.5.23
    ``cache_locs.py:assign_draft_cache_locs_contiguous`` (positions are not written on CPU).
    """
    n = topk * num_steps
    flat = req_to_token.reshape(-1)
    for i, (r, s) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens), strict=True)):
        base = r * pool_len + s
        out_cache_loc[i * n : (i + 1) * n] = flat[base : base + n].to(out_cache_loc.dtype)


def build_draft_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Return [num_seqs*topk, pool_len] int32: row b*topk+k = committed prefix of request b
    followed by candidate k's draft slots (laid out at seq_len + k*num_steps).

    Only the first seq_lens[b] + num_steps entries of each row are defined (the rest are 0
    here). Port of sgl-kernel ``build_draft_decode_metadata_cpu`` (spec.cpp).
    """
    rpi, sls = _ints(req_pool_indices), _ints(seq_lens)
    out = torch.zeros((len(rpi) * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b, (r, sl) in enumerate(zip(rpi, sls, strict=True)):
        src = req_to_token[r]
        for k in range(topk):
            row = out[b * topk + k]
            row[:sl] = src[:sl]
            start = sl + k * num_steps
            row[sl : sl + num_steps] = src[start : start + num_steps]
    return out


# --------------------------------------------------------------------------- accept bookkeeping


def fill_bonus_tokens(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[i] = accept_tokens.flat[accept_stride*i + accept_lens[i] - 1]``.

    accept_tokens: [bs, accept_stride] int32; accept_lens: [bs] int32 (bonus included);
    bonus_tokens: [bs] int32 (written). Port of SGLang 0.5.23
    ``kernels/ops/speculative/eagle.py:fill_bonus_tokens``.
    """
    bs = accept_lens.shape[0]
    idx = torch.arange(bs, dtype=torch.int64, device=accept_lens.device) * accept_stride
    idx = idx + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Compact the accepted KV slots: for each ``accept_index.flat[i] > -1``, in order,
    ``accept_out_cache_loc[dst] = out_cache_loc[accept_index.flat[i]]``, dst counting up.

    accept_index: [bs, S+1] int32/int64 with -1 for rejected; out_cache_loc: [bs*N] int64;
    accept_out_cache_loc: [num_accepted] int64 (written). Port of SGLang 0.5.23
    ``kernels/ops/speculative/eagle.py:fill_accept_out_cache_loc``.
    """
    ai = accept_index.reshape(-1).to(torch.int64)
    src = ai[ai > -1]
    n = src.numel()
    accept_out_cache_loc[:n] = out_cache_loc.reshape(-1)[src].to(accept_out_cache_loc.dtype)


def rotate_input_ids(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each request's extend segment of ``input_ids`` left by one and write the new
    draft token at its end (or at ``select_index[i]``). int64 in place. Port of sgl-kernel
    ``rotate_input_ids_cpu`` (used by multi-layer EAGLE)."""
    starts, lens, new = _ints(extend_start_loc), _ints(extend_seq_lens), _ints(topk_index)
    sel = _ints(select_index) if select_index is not None else None
    for i, (s, n) in enumerate(zip(starts, lens, strict=True)):
        if n > 1:
            input_ids[s : s + n - 1] = input_ids[s + 1 : s + n].clone()
        if n > 0:
            input_ids[sel[i] if sel is not None else s + n - 1] = new[i]


# --------------------------------------------------------------------------- tree build / verify


def build_tree_kernel_efficient(
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
    """Build the verify tree: attention mask, positions and retrieval links.

    parent_list: [bs, topk*(depth-1)+1]; selected_index: [bs, N-1]; verified_seq_len: [bs];
    tree_mask (bool, written): QLEN_ONLY (mode 1) [bs*N*N], FULL_MASK (mode 0)
    [sum(seq_len*N) + bs*N*N]; positions [bs*N]; retrive_index / retrive_next_token /
    retrive_next_sibling [bs, N] (next_token / next_sibling pre-filled with -1).
    Node j of request b is global index b*N+j; node 0 is the previous bonus token.
    Port of SGLang 0.5.23 ``kernels/ops/speculative/spec_tree.py:
    sgl_build_tree_kernel_efficient_triton`` (and sgl-kernel spec.cpp).
    """
    if tree_mask_mode == 2:
        raise NotImplementedError("build_tree_kernel_efficient_cpu: QLEN_ONLY_BITPACKING is not supported on CPU")
    n = draft_token_num
    bs = parent_list.shape[0]
    parents = parent_list.reshape(bs, -1).tolist()
    sel = selected_index.reshape(bs, -1).tolist()
    seq_lens = _ints(verified_seq_len)
    ri = retrive_index.view(-1)
    rnt = retrive_next_token.reshape(bs, n).tolist()
    rns = retrive_next_sibling.reshape(bs, n).tolist()
    pos = [0] * (bs * n)
    mask_flat = tree_mask.view(-1)

    def find(b: int, tok_idx: int) -> int:
        for p in range(n - 1):
            if sel[b][p] == tok_idx:
                return p
        return -1

    acc = 0
    for b in range(bs):
        seq_len = seq_lens[b]
        off = b * n
        pos[off] = seq_len
        for i in range(n - 1, 0, -1):
            parent_tb = sel[b][i - 1] // topk
            if parent_tb == 0:
                parent_position = 0
            else:
                p = find(b, parents[b][parent_tb])
                if p < 0:
                    continue
                parent_position = p + 1
            first = rnt[b][parent_position]
            rnt[b][parent_position] = i
            if first != -1:
                rns[b][i] = first
        # mask rows
        if tree_mask_mode == 1:
            row_len, row0 = n, b * n * n
        else:
            row_len, row0 = seq_len + n, b * n * n + acc
            acc += seq_len * n
        rows = torch.zeros((n, n), dtype=torch.bool)
        rows[:, 0] = True
        for tid in range(1, n):
            position, cur = 0, tid - 1
            for _ in range(max(depth, n)):
                position += 1
                rows[tid, cur + 1] = True
                ptb = sel[b][cur] // topk
                if ptb == 0:
                    break
                cur = find(b, parents[b][ptb])
                if cur < 0:
                    break
            pos[off + tid] = position + seq_len
        view = mask_flat[row0 : row0 + n * row_len].view(n, row_len)
        view[:, row_len - n :] = rows
    ri.copy_(torch.arange(bs * n, dtype=ri.dtype))
    retrive_next_token.copy_(torch.tensor(rnt, dtype=retrive_next_token.dtype).view_as(retrive_next_token))
    retrive_next_sibling.copy_(torch.tensor(rns, dtype=retrive_next_sibling.dtype).view_as(retrive_next_sibling))
    positions.copy_(torch.tensor(pos, dtype=positions.dtype).view_as(positions))


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: walk from the root, at each level take the first child
    (following next_sibling) whose draft token equals the target's argmax at the last
    accepted node.

    predicts [bs*N] int32 (written at accepted nodes: target token there); accept_index
    [bs, S] int32 (written: root global index, then accepted global indices; untouched
    beyond); accept_token_num [bs] int32 (written: accepted drafts, bonus excluded);
    candidates / retrive_* / target_predict [bs, N] (target_predict read flat by global
    node index). Port of SGLang 0.5.23 ``spec_tree.py:verify_tree_greedy_kernel_triton``.
    """
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand = candidates.tolist()
    ri = retrive_index.tolist()
    rnt = retrive_next_token.tolist()
    rns = retrive_next_sibling.tolist()
    tp = target_predict.reshape(-1).tolist()
    pred_flat = predicts.view(-1)
    ai_flat = accept_index.view(-1)
    for b in range(bs):
        last = ri[b][0]
        ai_flat[b * steps] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = rnt[b][cur]
            while cur != -1:
                if cand[b][cur] == tp[last]:
                    pred_flat[last] = tp[last]
                    num += 1
                    ai_flat[b * steps + num] = ri[b][cur]
                    last = ri[b][cur]
                    break
                cur = rns[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = num
        pred_flat[last] = tp[last]
