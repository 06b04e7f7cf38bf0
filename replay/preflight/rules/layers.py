"""A multi-layer draft's later layers against the engines' own input norms: SGLang 0.5.23 normalises a
later layer's input with ``layers.{i}.hidden_norm`` (srt/models/llama_eagle3.py:103-105), vLLM 0.32.0 with
``layers.{i}.input_layernorm`` (model_executor/models/llama_eagle3.py:136-138). An SGLang-format draft (the
trained weight in ``hidden_norm``, ``input_layernorm`` the ones SGLang never reads) served on vLLM computes
another later layer; every tensor of the file is still "the checkpoint that was trained".
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.model.weight_files import read_weight_headers
from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_later_input_norms"]


def check_later_input_norms(draft: DraftInfo) -> list[Finding]:
    """One vLLM warning per later layer whose ``input_layernorm`` (what vLLM reads) is absent or is not its
    ``hidden_norm`` (what SGLang and the reference read). A speculators-format draft names only
    ``input_layernorm`` (its trainer's plain decoder layer) and is left alone here.

    Raises:
        CheckpointError: the weight files cannot be read (named).
    """
    n = getattr(draft.config, "num_hidden_layers", 1) or 1
    pairs = {i: (f"layers.{i}.hidden_norm.weight", f"layers.{i}.input_layernorm.weight") for i in range(1, n)}
    if not any(h in draft.tensors for h, _ in pairs.values()):
        return []
    _, values = read_weight_headers(draft.path, load=tuple(name for pair in pairs.values() for name in pair))
    out = []
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
