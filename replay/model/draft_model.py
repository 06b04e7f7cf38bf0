"""The EAGLE-3 reference draft forward: N >= 1 decoder layers over (embed, hidden), TTT-unrolled.

This is specdiff's own, compact implementation of the EAGLE-3 draft as SGLang serves it and as
SpecForge / speculators train it. Every convention below names its source:

- **fc input** (SGLang 0.5.23 ``srt/models/llama_eagle3.py:237-247``): the aux concat
  [N, K*H] goes through the norms the flags turn on, in the order and with the meanings of
  ``specdiff.eagle3.norms`` (``norm_before_fc``: ONE RMSNorm ``input_norm`` over the whole K*H
  concat; ``fc_norm``: one RMSNorm per H-wide slot, ``fc_norm.{j}``), then ``fc`` [Hd, K*H]
  without bias.
- **decoder layer** (llama_eagle3.py:97-119; SpecForge ``llama3_eagle.py`` LlamaDecoderLayer):
  ``residual = h``; ``attn_in = cat(input_layernorm(embed(x)), hidden_norm(h))`` [N, 2*Hd]
  (embedding FIRST); q/k/v project from 2*Hd, o_proj to Hd; ``h1 = residual + attn``;
  ``hidden_out = h1 + mlp(post_attention_layernorm(h1))``. speculators' ``norm_before_residual``
  (residual = hidden_norm(h)) is supported as a flag; SGLang does not implement it.
- **later layers** (``num_hidden_layers`` N > 1; SGLang 0.5.23 llama_eagle3.py:198-204 builds N,
  :253-261 chains them; speculators 0.9.0 ``eagle3/core.py:81-94`` + ``:87-101`` of its forward):
  only layer 0 sees the embedding. Layer i >= 1 takes the previous layer's full output ``x``
  (SGLang carries it as ``mlp_out + residual``, fused into ``hidden_norm(h, residual)``,
  :103-105), ``h1 = x + attn_i(hidden_norm_i(x))`` with q/k/v projecting from Hd,
  ``out_i = h1 + mlp_i(post_attention_layernorm_i(h1))``; ``hidden_out`` is the LAST layer's
  output, the final ``norm`` is applied once after all layers (:263-265) and the fed-back hidden
  is that last output (:268). Each layer attends over its own keys (its own KV cache in SGLang,
  its own ``layer_idx`` in speculators' DynamicCache). speculators' later layers are plain
  transformers LlamaDecoderLayers whose input norm is ``input_layernorm``: SGLang 0.5.23 reads
  ``hidden_norm`` there, so ``checkpoint`` requires ``layers.{i}.hidden_norm.weight``.
- **output**: ``logits = lm_head(norm(hidden_out))`` [N, Vd]; the hidden fed back to the next
  depth is the pre-norm ``hidden_out`` (llama_eagle3.py:263-269); ``norm_output`` feeds back
  the normed one instead (``specdiff.eagle3.norms.fed_back_hidden``).
- **vocab map**: ``d2t`` int64 [Vd] offsets, target id = draft id + d2t[draft id]
  (llama_eagle3.py:350-352 ``hot_token_id = d2t + arange``); ``t2d`` bool [V] is carried but
  unused by serving.
- **rope** (SGLang 0.5.23 ``srt/models/llama.py:199-231, :324-336``, applied by
  ``srt/layers/rotary_embedding/base.py:343-355`` and ``utils.py:36-62``): ``rope_theta``,
  ``rope_scaling`` None / linear / llama3, over the first ``rotary_dim = int(partial_rotary_factor
  * head_dim)`` dims of each head (inverse frequencies over ``rotary_dim``; the rest pass
  unrotated); neox style (rotate halves of those dims) or, with ``rope_is_neox_style: false``,
  gptj style (rotate interleaved pairs).
- **lm_head**: with ``tie_word_embeddings`` the draft scores with the first Vd rows of its
  embedding (SGLang: lm_head IS embed_tokens, llama_eagle3.py:303-304, whose weight set_embed
  makes the target's, llama.py:917-918; the logits processor keeps Vd columns).
- **TTT** (SpecForge ``specforge/modeling/draft/llama3_eagle.py`` LlamaAttention with
  ``cache_hidden``; speculators ``eagle3/core.py`` + ``eagle3/attention.py``
  ``extend_mask_for_draft_tokens``): row t at depth k has rope position t + k; its query
  attends to the depth-0 keys of rows s <= t (causal) and to the keys of its OWN row t at
  depths 1..k (the "diagonal" entries, its own key included). Keys of depth i are rotated at
  t + i. This is exactly what SGLang's KV cache holds when drafting: prefix positions written
  by draft-extend (depth 0) plus the chain of draft tokens at positions t+1..t+k.
- **windowed attention** (``config.attention_windows``): a layer with window W sees only the depth-0
  keys within W of the query, counted by speculators' rule or SGLang's (eagle3/attention_window.py).

Position pairing (SGLang 0.5.23 srt/speculative/eagle_worker_v2.py:995 shifts the draft's ids): row
t at depth 0 consumes (h_t, x_{t+1}); at depth k the input token is x_{t+1+k} (teacher forcing) and
the label is the target's argmax at position t+1+k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specdiff.eagle3.attention_window import prefix_visible
from specdiff.eagle3.norms import apply_fc_norms, fed_back_hidden
from specdiff.eagle3.vocab_map import hot_token_ids
from specdiff.replay.model.draft_config import Eagle3DraftConfig
from specdiff.tracer.rows import draft_top_ids

__all__ = [
    "Eagle3DraftConfig", "Eagle3Draft", "TTTOutput", "RMSNorm",
    "rope_inv_freq", "apply_rope", "ttt_labels",
]


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm: ``weight * (x_fp32 * rsqrt(mean(x^2) + eps)).to(x.dtype)``."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Rope inverse frequencies [head_dim/2] fp32 for rope_scaling None/default, linear, llama3.

    llama3 follows transformers ``_compute_llama3_parameters`` (the same formula as SGLang's
    Llama3RotaryEmbedding). Raises ValueError for other scaling types.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = None if not scaling else scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        pass
    elif kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = old / low, old / high
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        mid = (wavelen >= high_wl) & (wavelen <= low_wl)
        inv = torch.where(mid, smoothed, scaled)
    else:
        raise ValueError(f"rope_scaling type {kind!r} is not supported by the reference draft")
    return inv.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, neox: bool) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` dims of ``x`` [..., head_dim]; the rest pass unchanged.

    ``cos`` / ``sin`` [..., rotary_dim / 2] broadcast against ``x``'s leading dims. neox: pairs
    (i, i + rotary_dim/2); gptj (``neox=False``): pairs (2i, 2i+1) — SGLang 0.5.23
    srt/layers/rotary_embedding/utils.py:36-62 (``o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin``).
    """
    r = 2 * cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    if neox:
        x1, x2 = rot.chunk(2, dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = torch.cat((o1, o2), dim=-1) if neox else torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((out, rest), dim=-1)


class _Rope(nn.Module):
    """Rope tables for positions: ``forward(positions [B,T] int64, dtype)`` -> cos, sin
    [B,1,T,rotary_dim/2] (fp32 math, cast to ``dtype``; ``apply_rope`` uses them). A module so that hooks see the positions
    the attention rotates at (``tracer.training_hooks`` role ``rope`` -> ``draft.positions``).

    The inverse frequencies are a plain attribute, not a buffer: ``model.to(bf16)`` must not
    round them.
    """

    def __init__(self, cfg: Eagle3DraftConfig):
        super().__init__()
        self.inv_freq = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling)
        self.neox = cfg.rope_is_neox_style

    def forward(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = (positions.float()[..., None] * self.inv_freq.to(positions.device))[:, None]
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


class _Attention(nn.Module):
    """q/k/v from ``width`` (2*Hd in layer 0, Hd in later layers, llama_eagle3.py:63-75), o_proj to Hd."""

    def __init__(self, cfg: Eagle3DraftConfig, width: int):
        super().__init__()
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.nh, self.nkv = hd, nh, nkv
        self.rotary_emb = _Rope(cfg)
        self.q_proj = nn.Linear(width, nh * hd, bias=False)
        self.k_proj = nn.Linear(width, nkv * hd, bias=False)
        self.v_proj = nn.Linear(width, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, cfg: Eagle3DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    """EAGLE-3 decoder layer 0 (SpecForge ``midlayer``, speculators / SGLang ``layers.0``): attends
    over ``cat(input_layernorm(embed), hidden_norm(h))``."""

    def __init__(self, cfg: Eagle3DraftConfig):
        super().__init__()
        self.self_attn = _Attention(cfg, 2 * cfg.hidden_size)
        self.mlp = _MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _LaterLayer(nn.Module):
    """Decoder layer i >= 1 (``layers.{i}``): attends over ``hidden_norm(x)`` [Hd], no embedding
    (SGLang 0.5.23 llama_eagle3.py:63-64, :103-105; its unused ``input_layernorm`` is not built)."""

    def __init__(self, cfg: Eagle3DraftConfig):
        super().__init__()
        self.self_attn = _Attention(cfg, cfg.hidden_size)
        self.mlp = _MLP(cfg)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class TTTOutput:
    """Everything ``Eagle3Draft.ttt_forward`` computed, per depth k = 0..steps-1.

    Shapes (B batch, T positions): ``fc_in`` [B,T,K*H], ``fc_out`` [B,T,Hd]; per depth lists of
    ``tokens`` int64 [B,T] (x_{t+1+k}, pad id where absent), ``hidden_in`` [B,T,Hd],
    ``positions`` int64 [B,T] (rope position t+k+offset), ``attn_in`` [B,T,2Hd],
    ``hidden_out`` [B,T,Hd] (pre-norm), ``logits`` [B,T,Vd];
    ``valid`` bool [B,T] per depth (t+1+k < length); ``lengths`` int64 [B]; ``d2t`` int64 [Vd].
    Its trace rows are built by ``specdiff.tracer.rows.ttt_rows`` (what ``record train`` writes).
    """

    fc_in: torch.Tensor
    fc_out: torch.Tensor
    tokens: list[torch.Tensor]
    hidden_in: list[torch.Tensor]
    positions: list[torch.Tensor]
    attn_in: list[torch.Tensor]
    hidden_out: list[torch.Tensor]
    logits: list[torch.Tensor]
    valid: list[torch.Tensor]
    lengths: torch.Tensor
    d2t: torch.Tensor
    #: per depth, the outputs [B,T,Hd] of decoder layers 0..N-2 of an N-layer draft (empty lists for
    #: one layer; the last layer's output is ``hidden_out``): ``draft.layer_out.{i}``
    layer_out: list[list[torch.Tensor]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.logits)

    def topk(self, k: int = 1) -> list[torch.Tensor]:
        """Draft-vocab top-k ids per depth, int64 [B,T,k], descending (SGLang ``fast_topk``)."""
        return [draft_top_ids(lg, k) for lg in self.logits]

    def topk_target(self, k: int = 1) -> list[torch.Tensor]:
        """Top-k mapped to target ids, ``i + d2t[i]`` (SGLang hot_token_id), int64 [B,T,k]."""
        return [ids + self.d2t[ids] for ids in self.topk(k)]


def ttt_labels(target_argmax: torch.Tensor, steps: int, lengths: torch.Tensor | None = None,
               ignore_index: int = -100) -> list[torch.Tensor]:
    """Per-depth labels [B,T] int64: label(t, k) = target argmax at position t+1+k,
    ``ignore_index`` where t+1+k >= length. ``target_argmax`` [B,T] int64 is in target ids."""
    B, T = target_argmax.shape
    lengths = torch.full((B,), T) if lengths is None else lengths
    out = []
    for k in range(steps):
        lab = torch.full_like(target_argmax, ignore_index)
        if k + 1 < T:
            lab[:, : T - 1 - k] = target_argmax[:, 1 + k:]
        valid = torch.arange(T)[None, :] + 1 + k < lengths[:, None]
        out.append(lab.masked_fill(~valid, ignore_index))
    return out


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft: fc over aux hiddens, ``num_hidden_layers`` decoder layers, final norm, lm_head over Vd.

    Parameter names follow SpecForge (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, for N > 1
    ``layers.{i}.*`` i = 1..N-1 as SGLang loads them,
    ``embed_tokens``, optional ``input_norm`` / ``fc_norm.{j}``); buffers ``d2t`` int64 [Vd]
    (zeros = identity offsets) and ``t2d`` bool [V]. ``embed_source`` / ``lm_head_source``
    record where those weights came from ('draft', 'target' or 'random').
    """

    def __init__(self, config: Eagle3DraftConfig):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.input_norm = RMSNorm(c.aux_width, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps)
                                      for _ in range(c.num_aux)) if c.fc_norm else None)
        self.fc = nn.Linear(c.aux_width, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        if c.num_hidden_layers > 1:  # a ModuleDict keyed "1".."N-1": parameter names layers.{i}.*
            self.layers = nn.ModuleDict({str(i): _LaterLayer(c) for i in range(1, c.num_hidden_layers)})
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.embed_source = "random"
        self.lm_head_source = "random"

    # ---- pieces -------------------------------------------------------------------------
    def _copy_target_weight(self, param: torch.nn.Parameter, weight: torch.Tensor, what: str) -> None:
        if tuple(weight.shape) != tuple(param.shape):
            raise ValueError(f"target {what} is {list(weight.shape)} but the draft expects {list(param.shape)}")
        with torch.no_grad():
            param.copy_(weight)

    def set_target_embedding(self, weight: torch.Tensor) -> None:
        """Share the target's input embedding [V, H] (SGLang does this when the draft has none).

        Raises:
            ValueError: the shape is not the draft's embedding shape [vocab_size, hidden_size].
        """
        self._copy_target_weight(self.embed_tokens.weight, weight, "embedding")
        self.embed_source = "target"

    def set_target_lm_head(self, weight: torch.Tensor) -> None:
        """Use the target's lm_head rows [Vd, H] (already selected for the draft vocab).

        Raises:
            ValueError: the shape is not the draft's lm_head shape.
        """
        self._copy_target_weight(self.lm_head.weight, weight, "lm_head")
        self.lm_head_source = "target"

    def hot_token_id(self) -> torch.Tensor:
        """int64 [Vd]: draft id -> target id, ``d2t + arange(Vd)`` (SGLang llama_eagle3.py:352)."""
        return hot_token_ids(self.d2t)

    def fc_input(self, aux_cat: torch.Tensor) -> torch.Tensor:
        """[..., K*H] -> the fc input after optional input_norm, then per-slot fc_norm
        (llama_eagle3.py:239-246, in that order)."""
        return apply_fc_norms(aux_cat.to(self.fc.weight.dtype), input_norm=self.input_norm, fc_norm=self.fc_norm)

    def decoder_layers(self) -> list[nn.Module]:
        """The decoder layers in forward order: ``midlayer``, then ``layers.1`` .. ``layers.{N-1}``."""
        later = self.layers.values() if self.config.num_hidden_layers > 1 else ()
        return [self.midlayer, *later]

    def _qkv(self, attn_in, positions, a=None):
        a = self.midlayer.self_attn if a is None else a
        B, T, _ = attn_in.shape
        q = a.q_proj(attn_in).view(B, T, a.nh, a.head_dim).transpose(1, 2)
        k = a.k_proj(attn_in).view(B, T, a.nkv, a.head_dim).transpose(1, 2)
        v = a.v_proj(attn_in).view(B, T, a.nkv, a.head_dim).transpose(1, 2)
        cos, sin = a.rotary_emb(positions, q.dtype)
        q = apply_rope(q, cos, sin, neox=a.rotary_emb.neox)
        k = apply_rope(k, cos, sin, neox=a.rotary_emb.neox)
        rep = a.nh // a.nkv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return q, k, v

    def _attend(self, q, k0, v0, diag_k, diag_v, window: int | None = None):
        """TTT attention (SpecForge llama3_eagle.py LlamaAttention, cache_hidden branch).

        q, k0, v0 [B,h,T,d]; diag_k/diag_v: lists of [B,h,T,d] keys/values of depths 1..k at the
        same row. Scores over [causal depth-0 keys | diagonal keys], softmax in fp32. ``window``: the
        layer's window W, the depth-0 keys counted by ``config.window_distance``
        (attention_window.prefix_visible; the diagonal keys are always seen).
        """
        T = q.shape[2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        s0 = (q @ k0.transpose(-1, -2)) * scale
        visible = prefix_visible(T, len(diag_k), window, self.config.window_distance, q.device)
        hidden = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1) if visible is None else ~visible
        s0 = s0.masked_fill(hidden, float("-inf"))
        extra = [((q * kd).sum(-1, keepdim=True) * scale) for kd in diag_k]
        p = torch.cat([s0, *extra], dim=-1).float().softmax(-1).to(q.dtype)
        out = p[..., :T] @ v0
        for i, vd in enumerate(diag_v):
            out = out + p[..., T + i: T + i + 1] * vd
        return out

    # ---- the forward ---------------------------------------------------------------------
    def ttt_forward(self, aux_cat: torch.Tensor, input_ids: torch.Tensor, steps: int = 1, *,
                    lengths: torch.Tensor | None = None, position_offset: int = 0,
                    pad_id: int = 0) -> TTTOutput:
        """Teacher-forced TTT forward over token sequences (differentiable).

        Args:
            aux_cat: [B,T,K*H] target aux concat, row t = h_t (any float dtype; cast to the
                model's dtype).
            input_ids: [B,T] int64, the token sequence x_0..x_{T-1} (target ids); right-padded
                when ``lengths`` is given.
            steps: number of TTT depths to run, k = 0..steps-1 (SpecForge ``ttt_length``,
                speculators ``ttt_steps``).
            lengths: [B] valid lengths (default T). Right padding needs no attention mask: a
                valid row only sees rows s <= t and its own diagonal.
            position_offset: rope position of row 0 at depth 0 (SGLang draft-extend: 0; rope is
                relative so scores do not depend on it).
            pad_id: token fed where x_{t+1+k} does not exist (those rows are marked invalid).

        Returns:
            TTTOutput; row t at depth k used token x_{t+1+k}, rope position t+k+offset, hidden
            = fc_out (k=0) or depth k-1's hidden_out (pre-norm; normed if ``norm_output``).
        """
        B, T = input_ids.shape
        dev = input_ids.device
        lengths = (torch.full((B,), T, dtype=torch.int64) if lengths is None
                   else lengths.to(torch.int64).cpu())
        fc_in = self.fc_input(aux_cat)
        fc_out = self.fc(fc_in)
        m = self.midlayer
        base_pos = torch.arange(T, device=dev)[None, :].expand(B, T) + position_offset
        ar = torch.arange(T)[None, :]
        res = {n: [] for n in ("tokens", "hidden_in", "positions", "attn_in", "hidden_out", "logits", "valid",
                               "layer_out")}
        h = fc_out
        layers = self.decoder_layers()
        windows = self.config.attention_windows or (None,) * len(layers)
        caches = [([], []) for _ in layers]  # per layer: its keys, values of depths 0..d
        for d in range(steps):
            tok = torch.full_like(input_ids, pad_id)
            if d + 1 < T:
                tok[:, : T - 1 - d] = input_ids[:, 1 + d:]
            emb = self.embed_tokens(tok)
            residual = m.hidden_norm(h) if self.config.norm_before_residual else h
            attn_in = torch.cat([m.input_layernorm(emb), m.hidden_norm(h)], dim=-1)
            pos = base_pos + d
            out = self._layer(m, attn_in, residual, pos, caches[0], windows[0])
            earlier = []
            for layer, cache, w in zip(layers[1:], caches[1:], windows[1:]):  # llama_eagle3.py:103-105
                earlier.append(out)
                out = self._layer(layer, layer.hidden_norm(out), out, pos, cache, w)  # x -> hidden_norm(x), x
            res["layer_out"].append(earlier)
            normed = self.norm(out)
            res["tokens"].append(tok)
            res["hidden_in"].append(h)
            res["positions"].append(pos)
            res["attn_in"].append(attn_in)
            res["hidden_out"].append(out)
            res["logits"].append(self.logits(normed))
            res["valid"].append((ar + 1 + d < lengths[:, None]).to(dev))
            h = fed_back_hidden(out, normed, norm_output=self.config.norm_output)
        return TTTOutput(fc_in=fc_in, fc_out=fc_out, lengths=lengths, d2t=self.d2t, **res)

    def _layer(self, layer, attn_in, residual, pos, cache, window: int | None = None) -> torch.Tensor:
        """One decoder layer after its input norms: attention over ``cache`` (this layer's keys and
        values of the earlier depths; this depth's are appended; ``window``: see ``_attend``), residual
        add, MLP block.
        ``attn_in`` [B,T,width], ``residual`` [B,T,Hd] -> the layer's output [B,T,Hd]."""
        B, T = residual.shape[:2]
        q, k, v = self._qkv(attn_in, pos, layer.self_attn)
        keys, values = cache
        keys.append(k)
        values.append(v)
        a = self._attend(q, keys[0], values[0], keys[1:], values[1:], window)
        a = layer.self_attn.o_proj(a.transpose(1, 2).reshape(B, T, -1))
        h1 = residual + a
        return h1 + layer.mlp(layer.post_attention_layernorm(h1))

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[..., Hd] normed hidden -> [..., Vd] logits: ``lm_head``, or with ``tie_word_embeddings``
        the first Vd rows of the embedding (module doc, SGLang llama_eagle3.py:303-304)."""
        if self.config.tie_word_embeddings:
            return F.linear(normed, self.embed_tokens.weight[: self.config.draft_vocab_size])
        return self.lm_head(normed)

    def forward(self, aux_cat, input_ids, steps: int = 1, **kw) -> TTTOutput:
        """Alias of ``ttt_forward``."""
        return self.ttt_forward(aux_cat, input_ids, steps, **kw)
