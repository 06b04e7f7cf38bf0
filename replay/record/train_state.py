"""The training side's state facts (tracer/state_facts.py): the rope table each decoder layer of the HF
target and the reference draft applies, in the canonical layout (what every buffer these models register
computes, ``train_state_facts``), and the config overrides the training side applied (none: ``record train`` builds both configs from their
config.json as written).

The tables are computed the way each forward computes them:

- the HF target (transformers 5.19): the model's one rotary module (``LlamaRotaryEmbedding`` and its
  kin, ``model.rotary_emb``) called on positions 0..P-1 with a float32 input, as every decoder layer's
  attention receives its ``position_embeddings`` from it (modeling_llama.py:389). Its cos and sin come
  in one of two widths, told apart by the rotary's ``inv_freq`` (one entry per frequency, rotary_dim/2):
  ``cat(freqs, freqs)`` times ``attention_scaling`` [P, rotary_dim] (Llama and most kin: the first
  rotary_dim/2 columns are the table's), or one column per frequency [P, rotary_dim/2] (GPT-OSS,
  modeling_gpt_oss.py:186-192, whose ``_apply_rotary_emb`` rotates the two halves with the same
  columns: the whole is the table). Taking the first half of GPT-OSS's kept a quarter of its frequencies
  and fingerprinted another table than SGLang's (measured: a correct tiny GPT-OSS pair, target_rope
  '15353d4c7cd370be' vs serving's '3059fd69aca0d650'; whole: equal, and equal for GPT-OSS's YaRN,
  factor 32, ``truncate`` false, against SGLang 0.5.23's ``YaRNScalingRotaryEmbedding`` cache). Any
  other width, or a doubled table whose halves differ, is ``"unknown"``, not a table;
- the reference draft: each decoder layer's ``self_attn.rotary_emb`` (``replay/model/draft_model._Rope``:
  cos, sin [1, 1, P, rotary_dim/2], float32 math).

P = min(``ROPE_POSITIONS``, the config's ``max_position_embeddings``): at most the rows SGLang's cache holds
for the same config (``get_rope(max_position=max_position_embeddings)``; DeepSeek's YaRN caches the original
positions x factor), so both sides fingerprint the same rows (tracer/state_facts.py ``ROPE_POSITIONS``).
"""

from __future__ import annotations

import torch

from specdiff.tracer.state_facts import ROPE_POSITIONS, UNKNOWN, rope_table_fingerprint

__all__ = ["hf_rope_tables", "per_frequency", "reference_rope_tables", "train_state_facts"]


#: how far apart (relative and absolute, float32) the two halves of a doubled table may be: rounding of
#: one value (cos and sin are at most ``attention_scaling`` ~ 1), far below a frequency's difference
_SAME = 1e-6


def _positions(config) -> int:
    return min(ROPE_POSITIONS, int(getattr(config, "max_position_embeddings", None) or ROPE_POSITIONS))


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def hf_rope_tables(target) -> dict[str, str]:
    """``layers.{i}`` -> canonical rope table fingerprint for every decoder layer of an HF target, from
    its one rotary module; every layer ``"unknown"`` when the model holds none or several (per-layer-type
    rotaries, e.g. local and global: which layer uses which is the model's code, not read here)."""
    cfg = _text_config(target.config)
    n = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    rotaries = {id(m): m for _, m in target.named_modules() if type(m).__name__.endswith("RotaryEmbedding")}
    if len(rotaries) != 1:
        return {f"layers.{i}": UNKNOWN for i in range(n)}
    rot = next(iter(rotaries.values()))
    try:
        dev = next(iter(rot.buffers()), torch.zeros(())).device
        pos = torch.arange(_positions(cfg), device=dev)[None]
        with torch.no_grad():
            cos, sin = rot(torch.zeros(1, dtype=torch.float32, device=dev), pos)
        table = per_frequency(cos[0], sin[0], getattr(rot, "inv_freq", None))
        fp = UNKNOWN if table is None else rope_table_fingerprint(*table)
    except Exception:  # noqa: BLE001 - a rotary with another signature: unknown, not guessed
        fp = UNKNOWN
    return {f"layers.{i}": fp for i in range(n)}


def per_frequency(cos, sin, inv_freq) -> tuple | None:
    """An HF rotary's ``cos``, ``sin`` [P, w] as the canonical table's halves [P, rotary_dim/2] (one
    column per frequency, module doc), or None when the width is not one of the two layouts.

    ``inv_freq``: the rotary's inverse frequencies [rotary_dim/2] (None: not held; then only a doubled
    table is recognised, by its equal halves). w == len(inv_freq): the table as it is (GPT-OSS);
    w == 2 * len(inv_freq) and the halves equal: the first half (``cat(freqs, freqs)``)."""
    w = int(cos.shape[-1])
    freqs = int(inv_freq.numel()) if isinstance(inv_freq, torch.Tensor) else None
    if freqs is not None and w == freqs:
        return cos, sin
    if (freqs is None and w % 2 == 0) or w == 2 * (freqs or 0):
        h = w // 2
        # the halves are one computation on the same angles; a vectorised cos may still round a lane apart
        if all(torch.allclose(t[:, :h], t[:, h:], rtol=_SAME, atol=_SAME) for t in (cos, sin)):
            return cos[:, :h], sin[:, :h]
    return None


def reference_rope_tables(draft, config) -> dict[str, str]:
    """``layers.{i}`` -> canonical rope table fingerprint of each decoder layer of the reference draft
    (``Eagle3Draft.decoder_layers()``), from the layer's own ``self_attn.rotary_emb``."""
    out = {}
    for i, layer in enumerate(draft.decoder_layers()):
        rot = getattr(getattr(layer, "self_attn", None), "rotary_emb", None)
        try:
            pos = torch.arange(_positions(config))[None]
            with torch.no_grad():
                cos, sin = rot(pos, torch.float32)
            out[f"layers.{i}"] = rope_table_fingerprint(cos[0, 0], sin[0, 0])
        except Exception:  # noqa: BLE001
            out[f"layers.{i}"] = UNKNOWN
    return out


def train_state_facts(target, loaded) -> dict:
    """The state facts of the training side (module doc): ``target_rope`` / ``draft_rope``,
    ``target_config_overrides`` / ``draft_config_overrides`` ({}: no override applied),
    ``draft_input_ids_vocab`` (``"target"``: the forward embeds the sequence's target ids at every depth).

    No ``target_buffers`` / ``draft_buffers`` / ``draft_rope_shared`` here: those are by engine module
    name (``buffer_fingerprints``), so they compare between traces of one engine only, and every buffer
    these models register is covered by a fact that compares across sides: the HF target's
    ``rotary_emb.inv_freq`` / ``original_inv_freq`` by ``target_rope``, the reference draft's ``d2t`` /
    ``t2d`` by ``d2t_sha256`` / ``t2d_sha256`` (its rotaries hold no buffer, ``draft_model._Rope``).
    ``buffer_fingerprints`` of these models gives them where a caller wants them.

    Args:
        target: the HF target as loaded (``replay.model.target_capture.load_target``); another object
            (a target known only from stored features) leaves the target's buffers and rope ``"unknown"``.
        loaded: the ``LoadedDraft`` (its ``model`` the reference ``Eagle3Draft``, ``config`` its config).
    """
    m = loaded.model
    live = isinstance(target, torch.nn.Module)  # else a target known from stored files only: not read
    return {
        "target_rope": hf_rope_tables(target) if live else UNKNOWN,
        "draft_rope": reference_rope_tables(m, loaded.config),
        "target_config_overrides": {}, "draft_config_overrides": {},
        "draft_input_ids_vocab": "target",  # the reference embeds x_{t+1+k} of the sequence (target ids)
    }
