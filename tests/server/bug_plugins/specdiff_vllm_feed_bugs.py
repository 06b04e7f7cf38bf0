"""A test-owned vLLM general plugin that puts one bug in what a later draft step is fed into a real vLLM 0.32.0
CPU server (the SGLang kinds of the class: specdiff_feed_bugs.py).

Loaded the way specdiff's own vLLM recorder is (tracer/engines/vllm/plugin.py): vLLM's
``load_general_plugins()`` calls every ``vllm.general_plugins`` entry point in each process it starts
(v1/engine/core.py:129, v1/worker/worker_base.py:276). Nothing is installed: the test writes a ``*.dist-info``
folder naming ``specdiff_vllm_feed_bugs:load`` and puts it and this folder on the server's ``PYTHONPATH``.
``SPECDIFF_TEST_BUG=<kind>`` picks the bug; unset, the plugin does nothing. The proposer is patched when its
module is imported (an import hook, as the recorder does), so only the process that drafts is touched.

Kinds (lines of vllm/v1/spec_decode/llm_base_proposer.py, vLLM 0.32.0):

- ``stale_draft_input``: ``SpecDecodeBaseProposer.propose`` (:512) runs the draft's first pass, then one step
  per later depth: it copies the previous step's draft tokens into its ``input_ids`` buffer (:720) and builds
  the step's inputs from a view of it, ``_get_positions`` (:734) the call right after. At depth 2 the buffer
  is put back to what depth 1 was fed (a buffer not refreshed), after the copy and before the forward:
  ``propose``'s draft tokens (what the verify gets) keep the right ids, only the draft's next step is fed
  another.
"""

from __future__ import annotations

import functools
import os

from vllm_on_import import arm

ENV = "SPECDIFF_TEST_BUG"
KINDS = ("stale_draft_input",)
_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
#: inside one ``propose``: how many step inputs were built (0: the first pass's), what depth 1 was fed
_step = {"n": -1, "fed": None}


def _said(kind: str) -> None:
    from specdiff_bug_plugins import _said as say

    say(kind)


def _patch(module) -> None:
    cls = module.SpecDecodeBaseProposer
    propose, positions = cls.propose, cls._get_positions

    @functools.wraps(propose)
    def counted_propose(self, *a, **kw):
        _step.update(n=0, fed=None)
        try:
            return propose(self, *a, **kw)
        finally:
            _step["n"] = -1

    @functools.wraps(positions)
    def stale_positions(self, num_tokens, *a, **kw):
        depth = _step["n"]
        if depth >= 0:
            _step["n"] = depth + 1
            if depth == 1:
                _step["fed"] = self.input_ids[:num_tokens].clone()
            elif depth == 2 and _step["fed"] is not None and len(_step["fed"]) == num_tokens:
                if not bool((self.input_ids[:num_tokens] == _step["fed"]).all()):
                    _said("stale_draft_input")
                self.input_ids[:num_tokens] = _step["fed"]
        return positions(self, num_tokens, *a, **kw)

    cls.propose, cls._get_positions = counted_propose, stale_positions


def load() -> None:
    """vLLM plugin entry point: arm ``$SPECDIFF_TEST_BUG`` (module doc)."""
    kind = os.environ.get(ENV)
    if not kind:
        return
    if kind not in KINDS:
        raise ValueError(f"{ENV}={kind!r}: one of {', '.join(KINDS)}")
    arm(_PROPOSER, _patch)
