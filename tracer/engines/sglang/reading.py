"""Reading SGLang's live objects through the adapter: a chain of names, and the target's language model.

Shared by the contract facts read at start-up (``contract``, ``weight_facts``) and the recorder's later
reads (``live_facts``, ``state_facts``, ``hooks``): SGLang 0.5.23, worker v2.
"""

from __future__ import annotations

from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.layouts import ASSUMED_LAYOUT, TARGET_LAYOUTS, TARGET_WRAPPERS

__all__ = ["read_chain", "target_language_model"]


def read_chain(adapter: SGLangAdapter, obj, *keys: str):
    """Follow ``keys`` from ``obj`` through the adapter; MISSING as soon as one step is absent."""
    for key in keys:
        if obj is MISSING:
            return MISSING
        obj = adapter.get(obj, key)
    return obj


def target_language_model(A: SGLangAdapter, tmodel):
    """``(lm, layout, via, declared)`` of the live target model ``tmodel`` (its ``ModelRunner.model``).

    ``lm`` is the model whose ``set_eagle3_layers_to_capture`` sets ``layers_to_capture``: ``tmodel``
    itself, or the inner language model a wrapper delegates to (``TARGET_WRAPPERS``, followed
    through the adapter; ``via`` names the hops, e.g. ``["KimiK25ForConditionalGeneration.language_model"]``).
    ``layout`` is its ``TargetLayout``; a class that table does not declare is read through
    ``ASSUMED_LAYOUT`` (Llama's names: most SGLang models use them) with one warning, and
    ``declared`` is False. ``lm`` is MISSING when ``tmodel`` or a hop is.
    """
    via: list[str] = []
    lm = tmodel
    while lm is not MISSING and lm is not None and type(lm).__name__ in TARGET_WRAPPERS and len(via) < 4:
        name = type(lm).__name__
        key = f"{name}.{TARGET_WRAPPERS[name][1]}"
        via.append(key)
        lm = A.get(lm, key)
    if lm is MISSING or lm is None:
        return MISSING, ASSUMED_LAYOUT, via, False
    name = type(lm).__name__
    layout = TARGET_LAYOUTS.get(name)
    if layout is None:
        A.warn_once(f"layout:{name}", f"specdiff: SGLang {A.version} serves the target as {name} "
                    f"({type(lm).__module__}), whose layout specdiff does not declare (tracer/engines/sglang/"
                    f"layouts.py TARGET_LAYOUTS): its aux capture, embedding and lm_head are read through "
                    f"{ASSUMED_LAYOUT.outer_name}'s names, a capture index is taken as the layer's input")
        return lm, ASSUMED_LAYOUT, via, False
    return lm, layout, via, True
