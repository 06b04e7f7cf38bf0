"""How the pre-flight findings word aux slots and SGLang's aux-id rules: the slots an engine feeds,
the SGLang rule of the target's architecture, and the eagle_config ids that make SGLang feed given
HF indices (the fix text). Shared by the aux, training and vLLM rules.
"""

from __future__ import annotations

from specdiff.eagle3.aux_layers import ConventionError, native_aux_ids
from specdiff.eagle3.families import FamilyRule, sglang_family_rule
from specdiff.replay.preflight.engines import EngineCapture, fmt_hf

__all__ = ["slots_text", "rule_text", "sglang_rule_words", "sglang_ids_fix"]


def slots_text(cap: EngineCapture, L: int) -> str:
    """The slots an engine feeds in plain words: HF indices with names, then a pre-norm one."""
    text = fmt_hf(cap.hf_indices, L)
    return text + (f" + pre-norm out L{L - 1}" if cap.prenorm_ids else "")


def rule_text(fam: FamilyRule) -> str:
    """'the deepseek rule of DeepseekV3ForCausalLM (srt/models/deepseek_v2.py:3458-3473: ...)'."""
    return (f"the SGLang {fam.name} rule of {fam.architecture} ({fam.sources[0].split(' ')[0]}: "
            f"{fam.id_meaning()})")


def sglang_rule_words(architecture: str | None) -> str:
    """How SGLang reads aux ids on this target: the Llama wording for the plus-one files (and no
    architecture), else the family's rule (``rule_text``)."""
    fam = sglang_family_rule(architecture)
    if architecture is None or fam.name == "plus-one":
        return "SGLang id k captures HF k+1, -1 = embeddings"
    return rule_text(fam)


def sglang_ids_fix(hf_indices, L: int, architecture: str | None) -> str:
    """The eagle_config ids that make SGLang feed ``hf_indices`` on this target, as a fix text
    (the Llama wording without an architecture); a list the rule cannot express says so."""
    try:
        ids = native_aux_ids(list(hf_indices), "sglang", num_layers=L, architecture=architecture)
    except ConventionError as e:
        return f"no SGLang ids give HF {list(hf_indices)}: {e}; retrain on other layers"
    if architecture is None:
        return f"set eagle_config.eagle_aux_hidden_state_layer_ids = {ids}"
    return (f"set eagle_config.eagle_aux_hidden_state_layer_ids = {ids} (SGLang reads them by "
            f"{rule_text(sglang_family_rule(architecture))})")

