"""A test-owned vLLM general plugin that puts state no checkpoint holds wrong in a real vLLM 0.32.0 CPU server, or ends
its engine core on its first request (the SGLang kinds of the concern: specdiff_state_bugs.py).

Loaded the way specdiff's own vLLM recorder is (tracer/engines/vllm/plugin.py): vLLM's ``load_general_plugins()``
calls every ``vllm.general_plugins`` entry point in each process it starts (v1/engine/core.py:129,
v1/worker/worker_base.py:276). Nothing is installed: the test writes a ``*.dist-info`` folder naming
``specdiff_vllm_state_bugs:load`` and puts it and this folder on the server's ``PYTHONPATH``.
``SPECDIFF_TEST_BUG=<kind>`` picks the bug; unset, the plugin does nothing. The proposer is patched when its
module is imported (an import hook, as the recorder does), so only the process that drafts is touched.

Kinds:

- ``engine_exit_in_first_propose``: the process that drafts ends with ``os._exit`` (no Python exception, no
  atexit, no signal handler) as ``SpecDecodeBaseProposer.propose`` (v1/spec_decode/llm_base_proposer.py:512)
  is first called: the target's forward of the first request has run, the draft has not.
- ``draft_rope_angles_negated``: as ``propose`` is first called, after the recorder read the live models at the
  end of load, each draft layer gets a rotary of its own whose ``cos_sin_cache`` (registered non-persistent,
  model_executor/layers/rotary_embedding/base.py:59-63; rows = positions, ``cat(cos, sin)``) has its sin half
  negated: the angles' sign flipped. The target's rotary (``get_rope`` may share one object) stays as built;
  sin(0) = 0, so position 0 is untouched. No recorded fact can see it (they were read at load).
"""

from __future__ import annotations

import copy
import functools
import os

from vllm_on_import import arm_chosen_kind

ENV = "SPECDIFF_TEST_BUG"
KINDS = ("engine_exit_in_first_propose", "draft_rope_angles_negated")
_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"


def _said(kind: str) -> None:
    from specdiff_bug_plugins import _said as say

    say(kind)


def _negate_draft_rope(model) -> None:
    """Each draft decoder layer (``model.model.layers``, models/llama_eagle3.py:198) a rotary of its own, sin half
    negated."""
    for layer in model.model.layers:
        own = copy.deepcopy(layer.self_attn.rotary_emb)  # the cache copied too: the target's stays as built
        half = own.cos_sin_cache.shape[-1] // 2
        own.cos_sin_cache[:, half:] *= -1
        layer.self_attn.rotary_emb = own


def _patch(module) -> None:
    cls = module.SpecDecodeBaseProposer
    propose = cls.propose
    kind = os.environ[ENV]
    done = []

    @functools.wraps(propose)
    def bugged_propose(self, *a, **kw):
        if kind == "engine_exit_in_first_propose":
            _said(kind)
            os._exit(3)
        if not done:
            done.append(True)
            _negate_draft_rope(self.model)
            _said(kind)
        return propose(self, *a, **kw)

    cls.propose = bugged_propose


def load() -> None:
    """vLLM plugin entry point: arm ``$SPECDIFF_TEST_BUG`` (module doc) in this process."""
    arm_chosen_kind({kind: (_PROPOSER, _patch) for kind in KINDS})
