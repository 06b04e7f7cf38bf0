"""Pure-torch decode / extend attention over SGLang's paged KV pool (CPU stand-ins).

Argument layouts are those of SGLang 0.5.23's ``srt/layers/attention/intel_amx_backend.py``
call sites; the math follows the Triton references ``kernels/ops/attention/
extend_attention.py`` and the decode kernel (softmax(q.k * sm_scale [soft-capped]) . v,
optional sliding window and attention sinks). Computation is in float32, the result is cast
to the output dtype. One request at a time: simple and exact, not fast.

MLA (DeepSeek-V2/V3, Kimi-K2) needs no op of its own: SGLang's ``MLATokenToKVPool`` holds one
latent head per token (``[slots, 1, kv_lora_rank + qk_rope_head_dim]``, the value buffer a view of
its first ``kv_lora_rank`` columns), so the absorbed path (``forward_mla.py``) is grouped-query
attention with one KV head here. The MHA prefill (``forward_mha.py``) passes per-head k/v and is
chosen only when no request has a cached prefix, so the pool is not read then.
"""

from __future__ import annotations

import torch


def _kv(buf: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    x = buf.index_select(0, idx).float()
    if scale != 1.0:
        x = x * scale
    return x  # [n, Hkv, D]


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """q [m, H, D], k [n, Hkv, D], v [n, Hkv, Dv], visible [m, n] bool or None -> [m, H, Dv] fp32."""
    h, hkv = q.shape[1], k.shape[1]
    if h != hkv:
        rep = h // hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible[None], float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(h, 1, 1).expand(h, scores.shape[1], 1)
        scores = torch.cat([scores, sink], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def _check_prefix_layout(k_buffer, v_buffer, ke, ve) -> None:
    """One clear error when the new tokens' K/V and the cached prefix disagree in heads or dims
    (e.g. per-head MHA keys against an MLA latent cache that has a prefix)."""
    if k_buffer.shape[1:] != ke.shape[1:] or v_buffer.shape[1:] != ve.shape[1:]:
        raise ValueError(
            f"extend_attention_cpu: new keys/values {tuple(ke.shape[1:])}/{tuple(ve.shape[1:])} "
            f"do not match the cached prefix {tuple(k_buffer.shape[1:])}/{tuple(v_buffer.shape[1:])} "
            "[heads, dim]; an MLA latent cache with a prefix needs the absorbed path"
        )


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query token per sequence against its cached tokens.

    query [bs, H, D]; k_cache / v_cache [num_slots, Hkv, D|Dv] (written at ``loc`` when
    key/value [bs, Hkv, D] are given, before attending, as the CPU kernel does); output
    [bs, H, Dv] (written); req_to_token [max_reqs, pool_len] int32; req_pool_indices,
    seq_lens [bs] (seq_len counts the current token); attn_logits is scratch (unused).
    sliding_window_size here is SGLang's ``layer.sliding_window_size + 1``: a key at
    distance d >= window from the query is hidden; <= 0 means no window.
    """
    if is_cross_attention:
        raise NotImplementedError("decode_attention_cpu stand-in: cross attention is not supported")
    if key is not None and value is not None:
        idx = loc.to(torch.int64)
        k_cache.index_copy_(0, idx, key.to(k_cache.dtype).view(idx.numel(), *k_cache.shape[1:]))
        v_cache.index_copy_(0, idx, value.to(v_cache.dtype).view(idx.numel(), *v_cache.shape[1:]))
    rpi = [int(x) for x in req_pool_indices.tolist()]
    sls = [int(x) for x in seq_lens.tolist()]
    for b, (r, sl) in enumerate(zip(rpi, sls, strict=True)):
        idx = req_to_token[r, :sl].to(torch.int64)
        visible = None
        if sliding_window_size > 0:
            dist = (sl - 1) - torch.arange(sl)
            visible = (dist < sliding_window_size).view(1, sl)
        o = _attend(
            query[b : b + 1], _kv(k_cache, idx, k_scale), _kv(v_cache, idx, v_scale),
            visible, sm_scale, logit_cap, sinks,
        )
        output[b : b + 1] = o.to(output.dtype)


def extend_attention(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Prefill / verify attention: each sequence's new tokens against its cached prefix plus
    the new tokens themselves.

    q_extend [T, H, D], k_extend / v_extend [T, Hkv, D] (None: read the new tokens' K/V from
    the buffers through req_to_token), o_extend [T, H, Dv] (written); seq_lens [bs] total
    lengths (prefix + extend); extend_seq_lens / extend_start_loc [bs]. custom_mask (bool,
    tree verify) in either SGLang layout: QLEN_ONLY [sum(ext^2)] (prefix fully visible) or
    FULL_MASK [sum(ext*(prefix+ext))]; with a mask, causality comes from the mask (as in the
    Triton extend kernel). Without one, new tokens are causal if ``is_causal``.
    """
    if is_cross_attention:
        raise NotImplementedError("extend_attention_cpu stand-in: cross attention is not supported")
    rpi = [int(x) for x in req_pool_indices.tolist()]
    sls = [int(x) for x in seq_lens.tolist()]
    exts = [int(x) for x in extend_seq_lens.tolist()]
    starts = [int(x) for x in extend_start_loc.tolist()]
    mask_layout = None
    if custom_mask is not None and custom_mask.numel() > 0:
        cm = custom_mask.reshape(-1)
        qlen_total = sum(e * e for e in exts)
        full_total = sum(e * s for e, s in zip(exts, sls, strict=True))
        if cm.numel() >= full_total and cm.numel() != qlen_total:
            mask_layout = "full"
        elif cm.numel() >= qlen_total:
            mask_layout = "qlen"
        else:
            raise ValueError(f"extend_attention_cpu: custom_mask of {cm.numel()} elements fits no layout")
    moff = 0
    for r, sl, ext, st in zip(rpi, sls, exts, starts, strict=True):
        if ext == 0:
            continue
        pre = sl - ext
        row = req_to_token[r]
        if k_extend is not None and v_extend is not None:
            ke, ve = k_extend[st : st + ext].float(), v_extend[st : st + ext].float()
        else:
            ke = _kv(k_buffer, row[pre:sl].to(torch.int64), k_scale)
            ve = _kv(v_buffer, row[pre:sl].to(torch.int64), v_scale)
        if pre == 0:
            # No cached prefix: the buffers are not read. DeepSeek's MHA prefill
            # (forward_mha.py, chosen only when no request has a prefix) passes per-head
            # k/v [T, H, 192|128] while its pool holds one latent head [slots, 1, 576].
            k, v = ke, ve
        else:
            _check_prefix_layout(k_buffer, v_buffer, ke, ve)
            kp = _kv(k_buffer, row[:pre].to(torch.int64), k_scale)
            vp = _kv(v_buffer, row[:pre].to(torch.int64), v_scale)
            k = torch.cat([kp, ke], dim=0)
            v = torch.cat([vp, ve], dim=0)
        qpos = pre + torch.arange(ext).view(ext, 1)
        kpos = torch.arange(sl).view(1, sl)
        if mask_layout == "qlen":
            tree = cm[moff : moff + ext * ext].view(ext, ext).bool()
            moff += ext * ext
            visible = torch.cat([torch.ones((ext, pre), dtype=torch.bool), tree], dim=1)
        elif mask_layout == "full":
            visible = cm[moff : moff + ext * sl].view(ext, sl).bool()
            moff += ext * sl
        elif is_causal:
            visible = kpos <= qpos
        else:
            visible = torch.ones((ext, sl), dtype=torch.bool)
        if sliding_window_size > 0:
            visible = visible & ((qpos - kpos) < sliding_window_size)
        o = _attend(q_extend[st : st + ext], k, v, visible, sm_scale, logit_cap, sinks)
        o_extend[st : st + ext] = o.to(o_extend.dtype)
