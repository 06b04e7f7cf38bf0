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

from specdiff.eagle3.engines import ENGINES, REGISTRY, EngineSpec
from specdiff.replay.model.weight_files import later_input_norm_aliases, read_weight_headers
from specdiff.replay.preflight.engines import checked_specs
from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_later_input_norms"]

#: the two names of a later layer's input norm, ``layers.{i}.<name>.weight`` (``EngineSpec.later_input_norm``)
HIDDEN_NORM, INPUT_NORM = "hidden_norm", "input_layernorm"


def _readers(name: str) -> list[EngineSpec]:
    """Every registered engine whose later layers read ``layers.{i}.<name>.weight``, checked or not: the
    engines a finding names as the ones a checkpoint's other norm was written for."""
    return [s for s in REGISTRY.values() if s.later_input_norm == name]


def _titles(specs: list[EngineSpec]) -> str:
    """'SGLang', 'SGLang and vLLM', ...: the engines' titles."""
    return " and ".join(s.title for s in specs)


def _sites(specs: list[EngineSpec]) -> str:
    """Each engine's ``later_input_norm_site`` with its title ('llama_eagle3.py:103-105 in SGLang,
    :136-138 in vLLM'): a file already named is not repeated."""
    out, last = [], None
    for s in specs:
        path, _, lines = s.later_input_norm_site.rpartition(":")
        out.append(f"{':' if path == last else path + ':'}{lines} in {s.title}")
        last = path
    return ", ".join(out)


def check_later_input_norms(draft: DraftInfo, *, engines=ENGINES) -> list[Finding]:
    """Each later layer's input norm against the norm each engine reads there (``EngineSpec.later_input_norm``;
    module doc):

    - an engine reading ``input_layernorm`` (a warning): ``input_layernorm`` absent or not the layer's
      ``hidden_norm``, where the file has a ``hidden_norm`` (written for the engines reading ``hidden_norm``);
    - an engine reading ``hidden_norm`` (an error): no ``hidden_norm``, the norm in ``input_layernorm`` only
      (a speculators-format draft, ``weight_files.later_input_norm_aliases``): the engine serves the norm
      as it built it (ones) and never reads the trained one.

    Each finding names the engine from its ``EngineSpec`` and the engines reading the other norm from the
    registry, with each one's ``later_input_norm_site``.

    Args:
        engines: the engines checked ('sglang', 'vllm').

    Raises:
        CheckpointError: the weight files cannot be read (named).
    """
    n = getattr(draft.config, "num_hidden_layers", 1) or 1
    pairs = {i: (f"layers.{i}.{HIDDEN_NORM}.weight", f"layers.{i}.{INPUT_NORM}.weight") for i in range(1, n)}
    specs = checked_specs(engines)
    out = []
    hidden_readers, input_readers = _readers(HIDDEN_NORM), _readers(INPUT_NORM)
    for spec in (s for s in specs if s.later_input_norm == HIDDEN_NORM):
        name, others = spec.title, _titles(input_readers)
        for given, canon in sorted(later_input_norm_aliases(draft.tensors).items()):
            i = canon.split(".")[1]  # layers.{i}.hidden_norm.weight
            out.append(Finding(
                "weights.later_input_norm", "error", spec.name,
                f"layer {i}: {name} normalises its input with layers.{i}.hidden_norm ({spec.later_input_norm_site}), "
                f"absent ({name} keeps the ones it built); the trained norm is in {given} (speculators' and {others}'s "
                f"name for it, {_sites(input_readers)}), which {name} never reads",
                f"write {given}'s values into layers.{i}.hidden_norm.weight as well ({others} never reads it; one file "
                "then serves both)"))
    readers = [s for s in specs if s.later_input_norm == INPUT_NORM]
    if not readers or not any(h in draft.tensors for h, _ in pairs.values()):
        return out
    _, values = read_weight_headers(draft.path, load=tuple(name for pair in pairs.values() for name in pair))
    for spec in readers:
        name, others = spec.title, _titles(hidden_readers)
        for i, (hidden, given) in pairs.items():
            if hidden not in values or (given in values and np.array_equal(values[hidden], values[given])):
                continue
            said = f"absent ({name} keeps the ones it built)" if given not in values else "not the layer's hidden_norm"
            out.append(Finding(
                "weights.later_input_norm", "warn", spec.name,
                f"layer {i}: {name} normalises its input with {given} ({said}); {others} and the reference read {hidden} "
                f"({_sites([*hidden_readers, spec])}): {name} computes another layer {i}",
                f"write {hidden}'s values into {given} as well ({others} never reads it; one file then serves both)"))
    return out
