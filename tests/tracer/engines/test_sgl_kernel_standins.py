"""The pure-torch ``sgl_kernel`` stand-ins against references derived from SGLang 0.5.23's
Triton kernels (``kernels/ops/speculative/{spec_tree,eagle,cache_locs}.py``,
``kernels/ops/kvcache/cache_move.py``): the ops the stand-in registers, cache locations, accept
bookkeeping, the KV copy, and the draft tree's build and greedy verify. The attention ops are
test_sgl_kernel_attention.py's.

Triton cannot run on a CPU, so each reference below is the kernel's per-program logic
written as a plain loop or a direct formula, on random inputs. Runs in seconds; needs no
SGLang import (importing sglang takes ~30 s).
"""

from __future__ import annotations

import pytest
import torch

import specdiff.tracer.engines.sglang.cpu.sgl_kernel as sk
from specdiff.tracer.engines.sglang.cpu import STANDIN_PATH

OPS = torch.ops.sgl_kernel


def test_standin_registers_the_cpu_ops_sglang_needs_and_hides_weight_packing():
    needed = [
        "copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu",
        "assign_draft_cache_locs_contiguous_cpu", "build_draft_decode_metadata_cpu",
        "fill_bonus_tokens_cpu", "fill_accept_out_cache_loc_cpu", "build_tree_kernel_efficient_cpu",
        "verify_tree_greedy_cpu", "decode_attention_cpu", "extend_attention_cpu",
    ]
    for name in needed:
        assert hasattr(OPS, name), name
        assert callable(getattr(sk, name, None)) or name.endswith("attention_cpu"), name
    # SGLang probes this op to pick AMX weight-packed paths; it must stay absent.
    assert not hasattr(OPS, "convert_weight_packed")
    assert STANDIN_PATH.endswith("cpu") and sk.__file__.startswith(STANDIN_PATH)


def test_standin_can_be_imported_twice_under_two_names():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "sgl_kernel_second_copy", f"{STANDIN_PATH}/sgl_kernel/__init__.py",
        submodule_search_locations=[f"{STANDIN_PATH}/sgl_kernel"],
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sgl_kernel_second_copy"] = mod
    try:
        spec.loader.exec_module(mod)  # must not raise "op already defined"
        assert mod.IS_SPECDIFF_STANDIN
    finally:
        for k in [k for k in sys.modules if k.startswith("sgl_kernel_second_copy")]:
            del sys.modules[k]


# ----------------------------------------------------------------------------- cache locations


def _pool(g, reqs=6, pool_len=40, slots=500):
    return torch.randint(0, slots, (reqs, pool_len), generator=g, dtype=torch.int32)


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_assign_req_to_token_pool_scatters_new_slots_per_request(idx_dtype):
    g = torch.Generator().manual_seed(0)
    rtt = _pool(g)
    rpi = torch.tensor([4, 0, 2], dtype=torch.int64)
    start = torch.tensor([3, 0, 10], dtype=idx_dtype)
    end = torch.tensor([7, 5, 10], dtype=idx_dtype)
    n = int((end - start).sum())
    ocl = torch.randint(0, 999, (n,), generator=g, dtype=torch.int64)
    ref = rtt.clone()
    off = 0  # Triton: out_offset = sum of (end - start) over earlier programs
    for i in range(3):
        for j in range(int(start[i]), int(end[i])):
            ref[rpi[i], j] = ocl[off + j - int(start[i])]
        off += int(end[i] - start[i])
    sk.assign_req_to_token_pool_cpu(rpi, rtt, start, end, ocl, rtt.shape[1])
    assert torch.equal(rtt, ref)


def test_assign_extend_cache_locs_gathers_slots_in_request_order():
    g = torch.Generator().manual_seed(1)
    rtt = _pool(g)
    rpi = torch.tensor([1, 5, 3], dtype=torch.int64)
    start = torch.tensor([2, 8, 0], dtype=torch.int32)
    end = torch.tensor([6, 12, 3], dtype=torch.int32)
    out = torch.full((11,), -7, dtype=torch.int64)
    ref = torch.cat([rtt[r, s:e].long() for r, s, e in zip(rpi, start, end, strict=True)])
    sk.assign_extend_cache_locs_cpu(rpi, rtt, start, end, out, rtt.shape[1])
    assert torch.equal(out, ref)


def test_assign_draft_cache_locs_contiguous_reads_topk_times_steps_slots():
    g = torch.Generator().manual_seed(2)
    rtt = _pool(g)
    rpi = torch.tensor([2, 0], dtype=torch.int64)
    seq_lens = torch.tensor([5, 11], dtype=torch.int64)
    topk, steps = 2, 3
    out = torch.empty(2 * topk * steps, dtype=torch.int64)
    ref = torch.cat([rtt[r, s : s + topk * steps].long() for r, s in zip(rpi, seq_lens, strict=True)])
    sk.assign_draft_cache_locs_contiguous_cpu(rpi, rtt, seq_lens, out, rtt.shape[1], topk, steps)
    assert torch.equal(out, ref)


def test_build_draft_decode_metadata_expands_each_candidate_row():
    g = torch.Generator().manual_seed(3)
    rtt = _pool(g)
    rpi = torch.tensor([3, 1], dtype=torch.int64)
    seq_lens = torch.tensor([6, 9], dtype=torch.int32)
    topk, steps = 2, 3
    out = sk.build_draft_decode_metadata_cpu(rtt, rpi, seq_lens, topk, steps, rtt.shape[1])
    assert out.shape == (4, rtt.shape[1]) and out.dtype == torch.int32
    for b in range(2):
        sl = int(seq_lens[b])
        for k in range(topk):
            row = out[b * topk + k]
            assert torch.equal(row[:sl], rtt[rpi[b], :sl])
            assert torch.equal(row[sl : sl + steps], rtt[rpi[b], sl + k * steps : sl + (k + 1) * steps])


# ----------------------------------------------------------------------------- accept bookkeeping


def test_fill_bonus_tokens_takes_the_last_accepted_token():
    accept_tokens = torch.arange(100, 100 + 3 * 4, dtype=torch.int32).view(3, 4)
    accept_lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    bonus = torch.zeros(3, dtype=torch.int32)
    sk.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, 4)
    # Triton: bonus = accept_tokens[accept_stride * pid + accept_len - 1]
    assert bonus.tolist() == [100, 107, 109]


def test_fill_accept_out_cache_loc_compacts_accepted_slots():
    g = torch.Generator().manual_seed(4)
    accept_index = torch.tensor([[0, 2, -1, -1], [4, 5, 6, 7], [8, -1, -1, -1]], dtype=torch.int32)
    ocl = torch.randint(0, 1000, (12,), generator=g, dtype=torch.int64)
    out = torch.full((7,), -1, dtype=torch.int64)
    sk.fill_accept_out_cache_loc_cpu(accept_index, ocl, out)
    flat = accept_index.flatten().tolist()
    ref = out.clone()
    for pid, src in enumerate(flat):  # Triton: dst = number of non -1 entries before pid
        if src > -1:
            ref[sum(1 for x in flat[:pid] if x != -1)] = ocl[src]
    assert torch.equal(out, ref)


def test_rotate_input_ids_shifts_segments_and_appends_new_token():
    ids = torch.arange(10, dtype=torch.int64)
    sk.rotate_input_ids_cpu(ids, torch.tensor([0, 4]), torch.tensor([4, 6]), torch.tensor([90, 91]))
    assert ids.tolist() == [1, 2, 3, 90, 5, 6, 7, 8, 9, 91]


# ----------------------------------------------------------------------------- KV copy


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer_even_when_overlapping():
    g = torch.Generator().manual_seed(5)
    bufs = [torch.randn(32, 2, 8, generator=g).to(dt) for dt in (torch.bfloat16, torch.float32, torch.bfloat16)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    src = torch.tensor([3, 4, 5, 6, 20], dtype=torch.int64)
    tgt = torch.tensor([4, 5, 6, 7, 0], dtype=torch.int64)  # overlaps src
    refs = []
    for b in bufs:
        r = b.clone()
        r[tgt] = b[src]  # Triton: all loads of a tile, then all stores
        refs.append(r)
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, r in zip(bufs, refs, strict=True):
        assert torch.equal(b, r)


# ----------------------------------------------------------------------------- tree build / verify


def _eagle_draft_tree(g, bs, topk, steps, num_draft_tokens, vocab=50):
    """parent_list, top_scores_index, draft_tokens as SGLang 0.5.23 builds them
    (spec_utils.select_top_k_tokens + eagle_utils.organize_draft_results), random probs."""
    p0 = torch.softmax(torch.randn(bs, topk, generator=g), -1).sort(-1, descending=True).values
    tok0 = torch.randint(0, vocab, (bs, topk), generator=g)
    score_list = [p0.unsqueeze(1)]
    token_list = [tok0]
    parents_list = [torch.arange(-1, topk).expand(bs, -1)]
    scores = p0
    for i in range(1, steps):
        p = torch.softmax(torch.randn(bs * topk, topk, generator=g), -1).sort(-1, descending=True).values
        tok = torch.randint(0, vocab, (bs * topk, topk), generator=g)
        expand = scores.unsqueeze(2) * p.view(-1, topk, topk)
        cs_p, cs_idx = torch.topk(expand.flatten(1), topk, dim=-1)
        score_list.append(expand)
        token_list.append(tok.view(-1, topk * topk))
        parents_list.append(cs_idx + (topk * topk * (i - 1) + topk))
        scores = cs_p
    flat_scores = torch.cat(score_list, dim=1).flatten(1)
    tokens = torch.cat(token_list, dim=1)
    top = torch.sort(torch.topk(flat_scores, num_draft_token_m1 := num_draft_tokens - 1, dim=-1).indices).values
    draft_tokens = torch.gather(tokens, 1, top)
    parent_list = torch.cat(parents_list[:-1], dim=1) if steps > 1 else torch.empty(bs, 0, dtype=torch.long)
    assert top.shape == (bs, num_draft_token_m1)
    return parent_list, top, draft_tokens


def _reference_tree(parent_list, sel, seq_lens, topk, n):
    """Parents of every node from the Triton kernel's rule, then mask / positions / links
    by direct formulas: node i>0 has token index sel[i-1]; its parent is the root if
    sel[i-1] // topk == 0, else the node whose sel equals parent_list[sel[i-1] // topk]."""
    bs = sel.shape[0]
    out = []
    for b in range(bs):
        parent = [-1] * n
        for i in range(1, n):
            ptb = int(sel[b, i - 1]) // topk
            if ptb == 0:
                parent[i] = 0
            else:
                want = int(parent_list[b, ptb])
                hits = [j for j in range(n - 1) if int(sel[b, j]) == want]
                parent[i] = hits[0] + 1 if hits else -2  # -2: invalid, unlinked
        mask = torch.zeros(n, n, dtype=torch.bool)
        depth = [0] * n
        for i in range(n):
            mask[i, 0] = True
            j = i
            while j > 0 and parent[j] >= 0:
                mask[i, j] = True
                depth[i] += 1
                j = parent[j]
        children = {p: sorted(i for i in range(1, n) if parent[i] == p) for p in range(n)}
        nxt = [children[p][0] if children[p] else -1 for p in range(n)]
        sib = [-1] * n
        for kids in children.values():
            for a, c in zip(kids, kids[1:], strict=False):
                sib[a] = c
        out.append(dict(parent=parent, mask=mask, pos=[int(seq_lens[b]) + d for d in depth], nxt=nxt, sib=sib))
    return out


@pytest.mark.parametrize(("topk", "steps", "n"), [(1, 3, 4), (2, 3, 4), (2, 4, 6), (4, 3, 8)])
@pytest.mark.parametrize("mode", [1, 0])  # QLEN_ONLY (CPU default), FULL_MASK
def test_build_tree_matches_parent_rule_of_sglang_triton_kernel(topk, steps, n, mode):
    g = torch.Generator().manual_seed(10 * topk + steps + mode)
    bs = 3
    parent_list, sel, _ = _eagle_draft_tree(g, bs, topk, steps, n)
    seq_lens = torch.tensor([5, 9, 2], dtype=torch.int64)
    if mode == 1:
        tree_mask = torch.full((bs * n * n,), True)
    else:
        tree_mask = torch.full((int(seq_lens.sum()) * n + bs * n * n,), True)
    positions = torch.empty(bs * n, dtype=torch.int64)
    ri = torch.empty(bs, n, dtype=torch.int64)
    nt = torch.full((bs, n), -1, dtype=torch.int64)
    ns = torch.full((bs, n), -1, dtype=torch.int64)
    sk.build_tree_kernel_efficient_cpu(parent_list, sel, seq_lens, tree_mask, positions, ri, nt, ns, topk, steps, n, mode)
    ref = _reference_tree(parent_list, sel, seq_lens, topk, n)
    assert torch.equal(ri, torch.arange(bs * n).view(bs, n))
    off = 0
    for b in range(bs):
        r = ref[b]
        assert nt[b].tolist() == r["nxt"]
        assert ns[b].tolist() == r["sib"]
        assert positions[b * n : (b + 1) * n].tolist() == r["pos"]
        sl = int(seq_lens[b])
        if mode == 1:
            got = tree_mask[b * n * n : (b + 1) * n * n].view(n, n)
        else:
            rows = tree_mask[off : off + n * (sl + n)].view(n, sl + n)
            off += n * (sl + n)
            assert rows[:, :sl].all()  # prefix untouched (pre-filled True)
            got = rows[:, sl:]
        assert torch.equal(got, r["mask"])
    if topk == 1:  # a chain: node j's parent is j-1
        assert nt[0].tolist() == list(range(1, n)) + [-1]


def _reference_verify(cand, nxt, sib, target_predict, steps):
    """Greedy descent, as verify_tree_greedy_kernel_triton: at each level take the first
    child (in next_sibling order) whose token equals the target's token at the last accepted
    node; stop at the first level with no match."""
    bs, n = cand.shape
    tp = target_predict.flatten().tolist()
    accepted, preds = [], {}
    for b in range(bs):
        last, path, cur = b * n, [b * n], 0
        for _ in range(1, steps):
            cur = int(nxt[b, cur])
            while cur != -1 and int(cand[b, cur]) != tp[last]:
                cur = int(sib[b, cur])
            if cur == -1:
                break
            preds[last] = tp[last]
            last = b * n + cur
            path.append(last)
        preds[last] = tp[last]
        accepted.append(path)
    return accepted, preds


@pytest.mark.parametrize(("topk", "steps", "n"), [(1, 3, 4), (2, 3, 4), (4, 3, 8)])
def test_verify_tree_greedy_accepts_the_longest_matching_path(topk, steps, n):
    g = torch.Generator().manual_seed(100 + topk)
    bs = 4
    parent_list, sel, draft_tokens = _eagle_draft_tree(g, bs, topk, steps, n, vocab=4)
    seq_lens = torch.tensor([3, 4, 5, 6])
    tree_mask = torch.full((bs * n * n,), True)
    positions = torch.empty(bs * n, dtype=torch.int64)
    ri = torch.empty(bs, n, dtype=torch.int64)
    nt = torch.full((bs, n), -1, dtype=torch.int64)
    ns = torch.full((bs, n), -1, dtype=torch.int64)
    sk.build_tree_kernel_efficient_cpu(parent_list, sel, seq_lens, tree_mask, positions, ri, nt, ns, topk, steps, n, 1)
    bonus = torch.randint(0, 4, (bs, 1), generator=g)
    cand = torch.cat([bonus, draft_tokens], dim=1)
    # a small vocab makes long accepted paths likely; also force a full match in row 0
    target = torch.randint(0, 4, (bs, n), generator=g)
    node, chain = 0, 0
    while int(nt[0, node]) != -1:
        child = int(nt[0, node])
        target[0, node] = cand[0, child]
        node, chain = child, chain + 1
    spec_steps = steps + 1
    predicts = torch.full((bs * n,), -5, dtype=torch.int32)
    accept_index = torch.full((bs, spec_steps), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), -3, dtype=torch.int32)
    sk.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=cand,
        retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns, target_predict=target,
    )
    paths, preds = _reference_verify(cand, nt, ns, target, spec_steps)
    for b in range(bs):
        assert accept_num[b] == len(paths[b]) - 1
        assert accept_index[b, : len(paths[b])].tolist() == paths[b]
        assert (accept_index[b, len(paths[b]) :] == -1).all()
    ref_pred = torch.full((bs * n,), -5, dtype=torch.int32)
    for k, v in preds.items():
        ref_pred[k] = v
    assert torch.equal(predicts, ref_pred)
    assert int(accept_num[0]) == chain == int(positions[node] - seq_lens[0])
