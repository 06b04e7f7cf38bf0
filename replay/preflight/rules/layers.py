"""A multi-layer draft's later layers against the engines' own input norms: SGLang 0.5.23 normalises a
later layer's input with ``layers.{i}.hidden_norm`` (srt/models/llama_eagle3.py:103-105), vLLM 0.32.0 with
``layers.{i}.input_layernorm`` (model_executor/models/llama_eagle3.py:136-138). An SGLang-format draft (the
trained weight in ``hidden_norm``, ``input_layernorm`` the ones SGLang never reads) served on vLLM computes
another later layer; every tensor of the file is still "the checkpoint that was trained". A speculators-format
draft (the trained norm in ``input_layernorm``, no ``hidden_norm``: speculators 0.9.0's later layers are plain
decoder layers, models/eagle3/core.py:81-94) served on SGLang does the same the other way round.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.model.weight_files import later_input_norm_aliases, read_weight_headers
from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_later_input_norms"]


def check_later_input_norms(draft: DraftInfo, *, engines=("sglang", "vllm")) -> list[Finding]:
    """Each later layer's input norm against the engines' rules (module doc):

    - vLLM (a warning): ``input_layernorm`` absent or not the layer's ``hidden_norm``, where the file has a
      ``hidden_norm`` (an SGLang-format draft);
    - SGLang (an error): no ``hidden_norm``, the norm in ``input_layernorm`` only (a speculators-format draft,
      ``weight_files.later_input_norm_aliases``): SGLang serves the norm as it built it (ones) and never reads
      the trained one.

    Args:
        engines: the engines checked ('sglang', 'vllm').

    Raises:
        CheckpointError: the weight files cannot be read (named).
    """
    n = getattr(draft.config, "num_hidden_layers", 1) or 1
    pairs = {i: (f"layers.{i}.hidden_norm.weight", f"layers.{i}.input_layernorm.weight") for i in range(1, n)}
    out = []
    if "sglang" in engines:
        for given, canon in sorted(later_input_norm_aliases(draft.tensors).items()):
            i = canon.split(".")[1]  # layers.{i}.hidden_norm.weight
            out.append(Finding(
                "weights.later_input_norm", "error", "sglang",
                f"layer {i}: SGLang normalises its input with layers.{i}.hidden_norm (llama_eagle3.py:103-105), "
                f"absent (SGLang keeps the ones it built); the trained norm is in {given} (speculators' and vLLM's "
                "name for it, llama_eagle3.py:136-138 in vLLM), which SGLang never reads",
                f"write {given}'s values into layers.{i}.hidden_norm.weight as well (vLLM never reads it; one file "
                "then serves both)"))
    if "vllm" not in engines or not any(h in draft.tensors for h, _ in pairs.values()):
        return out
    _, values = read_weight_headers(draft.path, load=tuple(name for pair in pairs.values() for name in pair))
    for i, (hidden, given) in pairs.items():
        if hidden not in values or (given in values and np.array_equal(values[hidden], values[given])):
            continue
        said = "absent (vLLM keeps the ones it built)" if given not in values else "not the layer's hidden_norm"
        out.append(Finding(
            "weights.later_input_norm", "warn", "vllm",
            f"layer {i}: vLLM normalises its input with {given} ({said}); SGLang and the reference read {hidden} "
            f"(llama_eagle3.py:103-105 in SGLang, :136-138 in vLLM): vLLM computes another layer {i}",
            f"write {hidden}'s values into {given} as well (SGLang never reads it; one file then serves both)"))
    return out
