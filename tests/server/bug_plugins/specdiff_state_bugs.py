"""Serving bugs of one concern for the test plugin ``specdiff_bug_plugins`` (its module doc says how it is
loaded): state no checkpoint holds (buffers) and servers that die on a request.

``HOOKS`` maps each ``SPECDIFF_TEST_BUG`` kind to the function that registers its hook; a hook says
``specdiff_bug_plugins._said(kind)`` the first time it acts (the tests check the bug really ran).

Kinds (SGLang 0.5.23's own code path; lines of that release):

- ``draft_rope_rows_zeroed``: right after the draft model loads (``ModelRunner.load_model``,
  srt/model_executor/model_runner.py:1270, the draft runner: ``is_draft_worker``, :370), each draft layer is
  given a rotary of its own whose ``cos_sin_cache`` (registered non-persistent, srt/layers/rotary_embedding/
  base.py:154; rows = positions, ``cat(cos, sin)``, base.py:253-266) holds zeros from position
  ``ZEROED_FROM`` on: a cache cut to that length and padded, the class of a buffer rebuilt after load. No
  checkpoint holds it; the target keeps its own rotary (``get_rope`` had shared one object,
  srt/layers/rotary_embedding/factory.py:158-170). Done before the recorder reads the live models
  (``EagleDraftWorker.alloc_memory_pool``, srt/speculative/eagle_worker_v2.py:243), so its facts see it.
- ``rope_angles_negated``: at the first forward of the scheduler (``ModelRunner.forward``,
  model_runner.py:1813), after the recorder read the models, the sin half of every rotary's
  ``cos_sin_cache`` is negated in place (the angles' sign flipped: a cache rebuilt to rotate the other way).
  Target and draft share that object (``get_rope``), so the target computes it first; sin(0) = 0, so
  position 0 is untouched. No recorded fact can see it (they were read at load).
- ``exit_in_first_draft_forward``: the scheduler process ends with ``os._exit`` (no Python exception, no
  atexit, no signal handler) as the first draft forward begins (``EagleDraftWorker._draft_extend_for_prefill``,
  eagle_worker_v2.py:961): the target's prefill of the first request has run, nothing of its iteration is
  written.
- ``stall_first_draft_forward``: the first draft forward (``_draft_extend_for_prefill``, as above) sleeps
  (``STALL_S``) after saying so, for the test to kill the server from outside (SIGKILL to its process group)
  while its first request is in flight.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable

#: the first position whose row ``draft_rope_rows_zeroed`` zeroes (the demo prompts hold 27-46 tokens: every
#: request's prefill reaches past it)
ZEROED_FROM = 20
#: how long ``stall_first_draft_forward`` holds the draft (the test kills the server well before)
STALL_S = 600
_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_EDW = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker"


def _said(kind: str) -> None:
    from specdiff_bug_plugins import _said as say

    say(kind)


def _rotaries(model) -> list:
    """(layer, its ``self_attn.rotary_emb``) of each decoder layer of a live SGLang model (``model.model.layers``)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    return [(layer, layer.self_attn.rotary_emb) for layer in layers
            if getattr(getattr(layer, "self_attn", None), "rotary_emb", None) is not None]


def _zero_draft_rope_rows(result, self, *a, **kw):
    """AFTER ``ModelRunner.load_model`` of the draft runner: a rotary of its own per draft layer, rows from
    ``ZEROED_FROM`` on zero."""
    if not getattr(self, "is_draft_worker", False):
        return result
    for layer, rotary in _rotaries(self.model):
        own = copy.deepcopy(rotary)  # the cache tensor copied too: the target's rotary stays as built
        own.cos_sin_cache[ZEROED_FROM:] = 0
        layer.self_attn.rotary_emb = own
        _said("draft_rope_rows_zeroed")
    return result


_negated = False


def _negate_rope_angles_once(orig, self, *a, **kw):
    """AROUND ``ModelRunner.forward``: before the scheduler's first forward, every rotary's sin half negated
    in place (each object once: the draft's is the target's)."""
    global _negated
    if not _negated:
        _negated = True
        seen: set[int] = set()
        for _, rotary in _rotaries(self.model):
            cache = rotary.cos_sin_cache
            if id(cache) in seen:
                continue
            seen.add(id(cache))
            half = cache.shape[-1] // 2
            cache[:, half:] *= -1
        _said("rope_angles_negated")
    return orig(self, *a, **kw)


def _exit_in_draft_forward(orig, self, *a, **kw):
    _said("exit_in_first_draft_forward")
    os._exit(3)


def _stall_draft_forward(orig, self, *a, **kw):
    _said("stall_first_draft_forward")
    time.sleep(STALL_S)
    return orig(self, *a, **kw)


def _register(target: str, hook, hook_type: str) -> Callable[[], None]:
    def register() -> None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(target, hook, HookType[hook_type])

    return register


HOOKS: dict[str, Callable[[], None]] = {
    "draft_rope_rows_zeroed": _register(f"{_MR}.load_model", _zero_draft_rope_rows, "AFTER"),
    "rope_angles_negated": _register(f"{_MR}.forward", _negate_rope_angles_once, "AROUND"),
    "exit_in_first_draft_forward": _register(f"{_EDW}._draft_extend_for_prefill", _exit_in_draft_forward, "AROUND"),
    "stall_first_draft_forward": _register(f"{_EDW}._draft_extend_for_prefill", _stall_draft_forward, "AROUND"),
}
