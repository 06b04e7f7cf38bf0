"""The draft's rope facts, read from its live rotary embedding (SGLang 0.5.23, worker v2):
``rope_theta``, ``rope_scaling``, ``rope_style`` and ``partial_rotary_factor``.
"""

from __future__ import annotations

from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.reading import read_chain

__all__ = ["rope_facts"]


#: SGLang rotary-embedding class -> (rope_scaling type, adapter keys of its parameters -> fact keys)
_ROPE_CLASSES = {
    "RotaryEmbedding": (None, {}),
    "LinearScalingRotaryEmbedding": ("linear", {"LinearScalingRotaryEmbedding.scaling_factors": "factor"}),
    "Llama3RotaryEmbedding": ("llama3", {"Llama3RotaryEmbedding.scaling_factor": "factor",
                                         "Llama3RotaryEmbedding.low_freq_factor": "low_freq_factor",
                                         "Llama3RotaryEmbedding.high_freq_factor": "high_freq_factor",
                                         "Llama3RotaryEmbedding.orig_max_position":
                                             "original_max_position_embeddings"}),
}


def rope_facts(A: SGLangAdapter, dinner) -> dict:
    """rope_theta / rope_scaling / rope_style / partial_rotary_factor (rotary_dim / head_size, SGLang
    llama.py:199-200) as the draft's attention applies them (its
    ``rotary_emb``, built by get_rope from the draft config). Another rope class is recorded by
    its class name, so it is compared, never guessed."""
    from specdiff.tracer.contract import rope_scaling_fact

    layers = read_chain(A, dinner, "Eagle3LlamaModel.layers")
    rot = MISSING if layers is MISSING or len(layers) == 0 else read_chain(
        A, layers[0], "LlamaDecoderLayer.self_attn", "LlamaAttention.rotary_emb")
    base = read_chain(A, rot, "RotaryEmbedding.base")
    neox = read_chain(A, rot, "RotaryEmbedding.is_neox_style")
    rdim, hsize = read_chain(A, rot, "RotaryEmbedding.rotary_dim"), read_chain(A, rot, "RotaryEmbedding.head_size")
    out = {"rope_theta": UNKNOWN if base is MISSING else float(base),
           "rope_style": UNKNOWN if neox is MISSING else ("neox" if neox else "gptj"),
           "partial_rotary_factor": UNKNOWN if MISSING in (rdim, hsize) or not hsize else int(rdim) / int(hsize)}
    if rot is MISSING:
        out["rope_scaling"] = UNKNOWN
        return out
    cls = type(rot).__name__
    if cls not in _ROPE_CLASSES:
        out["rope_scaling"] = {"type": f"sglang {cls}"}
        return out
    kind, params = _ROPE_CLASSES[cls]
    values = {fact: A.get(rot, key) for key, fact in params.items()}
    if MISSING in values.values():
        out["rope_scaling"] = UNKNOWN
        return out
    values = {k: (v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v) for k, v in values.items()}
    out["rope_scaling"] = rope_scaling_fact(kind, **values)
    return out
