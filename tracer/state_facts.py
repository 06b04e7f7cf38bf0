"""The state a model holds besides its parameters, read off the live modules after loading: every
registered buffer (persistent or not: no checkpoint holds a non-persistent one) and the rope table each
decoder layer's attention rotates with.

Two kinds of fact, for draft and target alike (contract ``<side>_buffers`` / ``<side>_rope``):

- ``buffer_fingerprints``: engine buffer name -> ``tensor_fingerprint`` of every registered buffer, each
  name a module path the buffer is reachable under (a buffer several modules share is listed under
  each). The names are the engine's own (SGLang's ``model.layers.0.self_attn.rotary_emb.cos_sin_cache``,
  transformers' ``model.rotary_emb.inv_freq``), so two sides of one engine compare them name by name;
  across engines the rope tables below are what compares.
- ``rope_tables``: ``layers.{i}`` -> fingerprint of the table that layer's rope applies, in one layout on
  every side: ``cat(cos, sin)`` over the rotated half-dims, [P, rotary_dim] for positions 0..P-1,
  P = min(``ROPE_POSITIONS``, the rows the side holds at load). SGLang 0.5.23 holds exactly
  this as its rotary's ``cos_sin_cache`` buffer (srt/layers/rotary_embedding/base.py:253-266, registered
  non-persistent at :154); transformers and the reference draft compute it from their inverse frequencies
  at every forward, and the table is computed here the way their forward does (float32 math).

A buffer on the meta device (no storage: freed, e.g. a model teardown) is the fingerprint ``"meta"``;
a buffer or table that cannot be read is ``"unknown"``, never a value filled in from a config.
SGLang 0.5.23 caches one rotary object per rope setting process-wide (``get_rope``,
srt/layers/rotary_embedding/factory.py:158-170 looks the key up, :439 stores it), so a draft and a
target with the same head size, rotary dim, max position, base, style, scaling and dtype share one
``cos_sin_cache``: ``shared_rotaries`` names the draft layers whose rotary is a target layer's.
"""

from __future__ import annotations

from specdiff.tracer.weight_facts import tensor_fingerprint

#: positions of the canonical rope table (the fingerprint reads a strided sample of it). Small enough that
#: every side holds them: SGLang 0.5.23's DeepSeek YaRN rotary is built with the original 512 positions
#: (rope_variant.py DeepseekScalingRotaryEmbedding, factory.py deepseek_yarn) and caches 512 x factor rows,
#: while transformers computes the config's max_position_embeddings; with 4096 the two sides of a correct
#: DeepSeek-V3 pair fingerprinted 512 and 2048 rows of one table and differed. A rope difference (theta,
#: scaling, partial rotary) changes every position past 0, so 512 rows show it.
ROPE_POSITIONS = 512
UNKNOWN = "unknown"
META = "meta"

__all__ = ["META", "ROPE_POSITIONS", "buffer_fingerprints", "cos_sin_cache_fingerprint", "engine_state",
           "rope_table_fingerprint", "rotary_of", "shared_rotaries"]


def _fingerprint(t) -> str:
    if getattr(t, "is_meta", False):
        return META
    try:
        return tensor_fingerprint(t)
    except Exception:  # noqa: BLE001 - an exotic tensor: unknown, the others are still read
        return UNKNOWN


def buffer_fingerprints(model) -> dict[str, str]:
    """Every registered buffer of ``model`` (``named_buffers(remove_duplicate=False)``: a shared buffer
    under each module path) -> ``tensor_fingerprint`` (``"meta"``: no storage; ``"unknown"``: unreadable),
    sorted by name. {} for a model without buffers."""
    return {n: _fingerprint(b) for n, b in sorted(model.named_buffers(remove_duplicate=False), key=lambda x: x[0])}


def rope_table_fingerprint(cos, sin) -> str:
    """Fingerprint of a rope table given as ``cos`` and ``sin`` [P, rotary_dim/2] (any float dtype):
    ``tensor_fingerprint(cat(cos, sin, -1))`` (SGLang's ``cos_sin_cache`` layout)."""
    import torch

    return tensor_fingerprint(torch.cat([cos.reshape(cos.shape[-2], -1), sin.reshape(sin.shape[-2], -1)], dim=-1))


def cos_sin_cache_fingerprint(rotary) -> str:
    """The canonical rope table of an SGLang rotary (``cos_sin_cache`` [max_position, rotary_dim], row r =
    position ``position_start`` + r, base.py:253-266): its first P rows, P = min(``ROPE_POSITIONS``, the
    rows it holds). Read at load, before the engine may grow the cache (``_ensure_cos_sin_cache_length``,
    base.py:270-298); growing appends rows, so the first P stay.
    ``"unknown"`` when the rotary has no such cache or it does not start at position 0 (another layout),
    ``"meta"`` when the cache has no storage."""
    cache = getattr(rotary, "cos_sin_cache", None)
    if cache is None or not hasattr(cache, "shape") or cache.dim() != 2 or int(getattr(rotary, "position_start", 0)):
        return UNKNOWN
    if cache.is_meta:
        return META
    try:
        return tensor_fingerprint(cache[:min(ROPE_POSITIONS, int(cache.shape[0]))])
    except Exception:  # noqa: BLE001
        return UNKNOWN


def rotary_of(layer):
    """The rotary module of a decoder layer's attention (``self_attn.rotary_emb``), or None."""
    return getattr(getattr(layer, "self_attn", None), "rotary_emb", None)


def shared_rotaries(draft_layers, target_layers, *, target_prefix: str = "model.layers") -> dict[str, str]:
    """``layers.{i}`` of each draft layer whose rotary module is the very object of a target layer ->
    that target layer (``f"{target_prefix}.{j}"``, the first one); {} when none is shared."""
    owner: dict[int, str] = {}
    for j, layer in enumerate(target_layers):
        rot = rotary_of(layer)
        if rot is not None:
            owner.setdefault(id(rot), f"{target_prefix}.{j}")
    out = {}
    for i, layer in enumerate(draft_layers):
        rot = rotary_of(layer)
        if rot is not None and id(rot) in owner:
            out[f"layers.{i}"] = owner[id(rot)]
    return out


def _layers(model):
    layers = getattr(getattr(model, "model", None), "layers", None)
    return None if layers is None else list(layers)


def _cache_tables(layers) -> dict | str:
    if layers is None:
        return UNKNOWN
    return {f"layers.{i}": UNKNOWN if rotary_of(layer) is None else cos_sin_cache_fingerprint(rotary_of(layer))
            for i, layer in enumerate(layers)}


def engine_state(tmodel, dmodel) -> dict:
    """``target_buffers`` / ``draft_buffers``, ``target_rope`` / ``draft_rope`` and ``draft_rope_shared`` of
    a serving engine's live target and draft (None: not readable, its facts ``"unknown"``), whose decoder
    layers are ``<model>.model.layers`` and rotate with ``self_attn.rotary_emb.cos_sin_cache`` (SGLang
    0.5.23 srt/models/llama.py:199-231, llama_eagle3.py; vLLM 0.32.0 models/llama.py, llama_eagle3.py:
    both build it with their ``get_rope``)."""
    facts: dict = {}
    for side, model in (("target", tmodel), ("draft", dmodel)):
        facts[f"{side}_buffers"] = UNKNOWN if model is None else buffer_fingerprints(model)
        facts[f"{side}_rope"] = UNKNOWN if model is None else _cache_tables(_layers(model))
    tl, dl = (None if m is None else _layers(m) for m in (tmodel, dmodel))
    facts["draft_rope_shared"] = UNKNOWN if tl is None or dl is None else shared_rotaries(dl, tl)
    return facts
