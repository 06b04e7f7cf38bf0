"""The pure-torch ``sgl_kernel`` attention stand-ins (decode and extend, MHA and an MLA latent cache)
against a dense reference derived from SGLang 0.5.23's Triton kernel
(``kernels/ops/attention/extend_attention.py``), and the argument list they take from the installed
SGLang. The other stand-in ops are test_sgl_kernel_standins.py's.

Triton cannot run on a CPU, so the reference is the kernel's logic written as a direct formula, on
random inputs. Runs in seconds; needs no SGLang import (importing sglang takes ~30 s).
"""

from __future__ import annotations

import math

import pytest
import torch

import specdiff.tracer.engines.sglang.cpu.sgl_kernel as sk

OPS = torch.ops.sgl_kernel
#: the KV-cache scale arguments, present in the attention ops' schema for the installed SGLang only
SCALES = (1.0, 1.0) if sk._ops.sglang_passes_kv_scales() else ()


def test_attention_ops_take_the_argument_list_of_the_installed_sglang():
    """SGLang 0.5.19 calls the attention ops without ``k_scale, v_scale`` (0.5.20 added them):
    its server died at the first prefill with "Expected a value of type 'float' for argument
    'k_scale' but instead found type 'Tensor'" until the stand-in took both argument lists."""
    from specdiff.tracer.engines.sglang.cpu.sgl_kernel._ops import (
        _SCHEMAS,
        _without_kv_scales,
        sglang_passes_kv_scales,
    )

    assert [sglang_passes_kv_scales(v) for v in ("0.5.19", "0.5.20", "0.5.23.post1")] == [False, True, True]
    seen = []
    for name, at in (("decode_attention_cpu", 3), ("extend_attention_cpu", 6)):
        schema, call = _without_kv_scales(_SCHEMAS[name], lambda *a: seen.append(a))
        assert "k_scale" not in schema and "v_scale" not in schema
        call(*range(10))
        assert seen[-1] == (*range(at), 1.0, 1.0, *range(at, 10))
    registered = str(OPS.extend_attention_cpu.default._schema)
    assert ("float k_scale" in registered) == bool(SCALES)


# ----------------------------------------------------------------------------- attention


def _dense_attention(q, k, v, visible, scale, cap=0.0, sinks=None):
    """softmax(q.k^T * scale [cap*tanh(./cap)] masked [+ sink column]) . v, one head at a time."""
    h, hkv = q.shape[1], k.shape[1]
    out = torch.empty(q.shape[0], h, v.shape[-1])
    for head in range(h):
        kh, vh = k[:, head // (h // hkv)].double(), v[:, head // (h // hkv)].double()
        s = q[:, head].double() @ kh.T * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        s = s.masked_fill(~visible, -math.inf)
        if sinks is not None:
            s = torch.cat([s, torch.full((s.shape[0], 1), float(sinks[head]), dtype=s.dtype)], 1)
        p = torch.softmax(s, -1)[:, : kh.shape[0]]
        out[:, head] = (p @ vh).float()
    return out


def _kv_pool(g, slots=64, hkv=2, d=16):
    return torch.randn(slots, hkv, d, generator=g), torch.randn(slots, hkv, d, generator=g)


@pytest.mark.parametrize(("cap", "window", "use_sinks"), [(0.0, 0, False), (5.0, 0, False), (0.0, 3, True)])
def test_decode_attention_writes_new_kv_then_attends_over_the_request_slots(cap, window, use_sinks):
    g = torch.Generator().manual_seed(20)
    h, hkv, d = 4, 2, 16
    kbuf, vbuf = _kv_pool(g, hkv=hkv, d=d)
    perm = torch.randperm(64, generator=g).to(torch.int32)
    rtt = perm[:40].view(2, 20).clone()
    rpi = torch.tensor([1, 0])
    seq_lens = torch.tensor([7, 12])
    loc = torch.stack([rtt[1, 6], rtt[0, 11]]).long()
    q = torch.randn(2, h, d, generator=g)
    knew, vnew = torch.randn(2, hkv, d, generator=g), torch.randn(2, hkv, d, generator=g)
    sinks = torch.randn(h, generator=g) if use_sinks else None
    kref, vref = kbuf.clone(), vbuf.clone()
    kref[loc], vref[loc] = knew, vnew
    out = torch.empty(2, h, d)
    logits = torch.empty(2, h, 8, d + 1)
    OPS.decode_attention_cpu(
        q, kbuf, vbuf, *SCALES, out, knew, vnew, loc, logits, rtt, rpi, seq_lens,
        0.25, cap, False, window, None, sinks,
    )
    assert torch.equal(kbuf, kref) and torch.equal(vbuf, vref)
    for b in range(2):
        sl = int(seq_lens[b])
        idx = rtt[rpi[b], :sl].long()
        vis = torch.ones(1, sl, dtype=torch.bool)
        if window > 0:
            vis = ((sl - 1) - torch.arange(sl) < window).view(1, sl)
        ref = _dense_attention(q[b : b + 1], kref[idx], vref[idx], vis, 0.25, cap, sinks)
        torch.testing.assert_close(out[b : b + 1], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["causal", "qlen_tree", "full_tree"])
def test_extend_attention_over_prefix_plus_new_tokens(mask_kind):
    g = torch.Generator().manual_seed(21)
    h, hkv, d = 4, 2, 16
    kbuf, vbuf = _kv_pool(g, hkv=hkv, d=d)
    perm = torch.randperm(64, generator=g).to(torch.int32)
    rtt = perm[:40].view(2, 20).clone()
    rpi = torch.tensor([0, 1])
    prefix = [5, 0] if mask_kind == "causal" else [5, 3]
    ext = [4, 3] if mask_kind == "causal" else [4, 4]
    seq_lens = torch.tensor([p + e for p, e in zip(prefix, ext, strict=True)])
    starts = torch.tensor([0, ext[0]])
    t = sum(ext)
    q = torch.randn(t, h, d, generator=g)
    ke, ve = torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g)
    trees = [torch.tril(torch.randint(0, 2, (e, e), generator=g).bool()) | torch.eye(e, dtype=torch.bool) for e in ext]
    for tr in trees:
        tr[:, 0] = True
    if mask_kind == "qlen_tree":
        custom = torch.cat([tr.flatten() for tr in trees])
    elif mask_kind == "full_tree":
        custom = torch.cat(
            [torch.cat([torch.ones(e, p, dtype=torch.bool), tr], 1).flatten()
             for p, e, tr in zip(prefix, ext, trees, strict=True)]
        )
    else:
        custom = None
    out = torch.empty(t, h, d)
    OPS.extend_attention_cpu(
        q, ke, ve, out, kbuf, vbuf, *SCALES, rtt, rpi, seq_lens, torch.tensor(ext), starts,
        max(ext), 0.3, 0.0, False, 0, None, None, custom, True,
    )
    for b in range(2):
        p, e, s = prefix[b], ext[b], int(starts[b])
        idx = rtt[rpi[b], :p].long()
        k = torch.cat([kbuf[idx], ke[s : s + e]])
        v = torch.cat([vbuf[idx], ve[s : s + e]])
        if custom is None:
            vis = torch.arange(p + e).view(1, -1) <= (p + torch.arange(e)).view(-1, 1)
        else:
            vis = torch.cat([torch.ones(e, p, dtype=torch.bool), trees[b]], 1)
        ref = _dense_attention(q[s : s + e], k, v, vis, 0.3)
        torch.testing.assert_close(out[s : s + e], ref, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- MLA (DeepSeek-V2/V3, Kimi-K2)
#
# SGLang 0.5.23 keeps one latent head per token for MLA (mem_cache/memory_pool.py MLATokenToKVPool:
# get_key_buffer -> [slots, 1, kv_lora_rank + rope], get_value_buffer -> a view of its first
# kv_lora_rank columns). The absorbed path (forward_mla.py) attends with q [T, H, kv_lora_rank + rope]
# against that one head; the MHA path (forward_mha.py, chosen by attention_backend_handler.py
# handle_attention_triton only when no request has a cached prefix) passes per-head k/v.

LORA, ROPE = 8, 4


def _mla_pool(g, slots=64):
    kbuf = torch.randn(slots, 1, LORA + ROPE, generator=g)
    return kbuf, kbuf[..., :LORA]  # value buffer = a strided view of the latent, as SGLang's pool


def test_extend_attention_over_an_mla_latent_cache_with_prefix_and_tree_mask():
    g = torch.Generator().manual_seed(22)
    h = 4
    kbuf, vbuf = _mla_pool(g)
    rtt = torch.randperm(64, generator=g).to(torch.int32)[:40].view(2, 20).clone()
    prefix, ext = [6, 2], [4, 3]
    seq_lens = torch.tensor([p + e for p, e in zip(prefix, ext, strict=True)])
    starts = torch.tensor([0, ext[0]])
    t = sum(ext)
    q = torch.randn(t, h, LORA + ROPE, generator=g)
    latent = torch.randn(t, 1, LORA + ROPE, generator=g)
    trees = [torch.tril(torch.randint(0, 2, (e, e), generator=g).bool()) | torch.eye(e, dtype=torch.bool) for e in ext]
    custom = torch.cat([tr.flatten() for tr in trees])
    out = torch.empty(t, h, LORA)
    OPS.extend_attention_cpu(
        q, latent, latent[..., :LORA], out, kbuf, vbuf, *SCALES, rtt, torch.tensor([0, 1]), seq_lens,
        torch.tensor(ext), starts, max(ext), 0.2, 0.0, False, 0, None, None, custom, True,
    )
    for b in range(2):
        p, e, s = prefix[b], ext[b], int(starts[b])
        k = torch.cat([kbuf[rtt[b, :p].long()], latent[s : s + e]])
        vis = torch.cat([torch.ones(e, p, dtype=torch.bool), trees[b]], 1)
        ref = _dense_attention(q[s : s + e], k, k[..., :LORA], vis, 0.2)
        torch.testing.assert_close(out[s : s + e], ref, rtol=1e-4, atol=1e-5)


def test_decode_attention_writes_the_latent_once_and_reads_v_from_its_first_columns():
    g = torch.Generator().manual_seed(23)
    h = 4
    kbuf, vbuf = _mla_pool(g)
    rtt = torch.randperm(64, generator=g).to(torch.int32)[:40].view(2, 20).clone()
    rpi, seq_lens = torch.tensor([1, 0]), torch.tensor([9, 4])
    loc = torch.stack([rtt[1, 8], rtt[0, 3]]).long()
    q = torch.randn(2, h, LORA + ROPE, generator=g)
    latent = torch.randn(2, 1, LORA + ROPE, generator=g)
    kref = kbuf.clone()
    kref[loc] = latent
    out = torch.empty(2, h, LORA)
    OPS.decode_attention_cpu(
        q, kbuf, vbuf, *SCALES, out, latent, latent[..., :LORA], loc, torch.empty(2, h, 8, LORA + 1),
        rtt, rpi, seq_lens, 0.2, 0.0, False, 0, None, None,
    )
    assert torch.equal(kbuf, kref) and torch.equal(vbuf, kref[..., :LORA])
    for b in range(2):
        sl = int(seq_lens[b])
        k = kref[rtt[rpi[b], :sl].long()]
        ref = _dense_attention(q[b : b + 1], k, k[..., :LORA], torch.ones(1, sl, dtype=torch.bool), 0.2)
        torch.testing.assert_close(out[b : b + 1], ref, rtol=1e-4, atol=1e-5)


def test_mha_prefill_over_an_mla_cache_ignores_the_latent_pool_when_nothing_is_cached():
    """DeepSeek's MHA prefill passes per-head k [T, H, nope + rope] / v [T, H, v_head_dim] while the
    pool holds one latent head: the first request of a DeepSeek-V3 server died here in torch.cat."""
    g = torch.Generator().manual_seed(24)
    h, dqk, dv = 4, 12, 8
    kbuf, vbuf = _mla_pool(g)
    rtt = torch.arange(40, dtype=torch.int32).view(2, 20)
    ext = [5, 3]
    t = sum(ext)
    q, k, v = (torch.randn(t, h, d, generator=g) for d in (dqk, dqk, dv))
    out = torch.empty(t, h, dv)
    args = (rtt, torch.tensor([0, 1]), torch.tensor(ext), torch.tensor(ext), torch.tensor([0, ext[0]]),
            max(ext), 0.3, 0.0, False, 0, None, None, None, True)
    OPS.extend_attention_cpu(q, k, v, out, kbuf, vbuf, *SCALES, *args)
    for s, e in ((0, ext[0]), (ext[0], ext[1])):
        vis = torch.tril(torch.ones(e, e, dtype=torch.bool))
        ref = _dense_attention(q[s : s + e], k[s : s + e], v[s : s + e], vis, 0.3)
        torch.testing.assert_close(out[s : s + e], ref, rtol=1e-4, atol=1e-5)
    # the same per-head k/v against a cached latent prefix cannot be attended: one clear error
    args = (rtt, torch.tensor([0, 1]), torch.tensor([ext[0] + 2, ext[1]]), *args[3:])
    with pytest.raises(ValueError, match="do not match the cached prefix"):
        OPS.extend_attention_cpu(q, k, v, out, kbuf, vbuf, *SCALES, *args)
