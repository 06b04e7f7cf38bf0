"""A test-owned vLLM general plugin that puts one bug in what a later draft step is fed, or in what the verify
accepts, into a real vLLM 0.32.0 CPU server (the SGLang kinds of these classes: specdiff_feed_bugs.py).

Loaded the way specdiff's own vLLM recorder is (tracer/engines/vllm/plugin.py): vLLM's
``load_general_plugins()`` calls every ``vllm.general_plugins`` entry point in each process it starts
(v1/engine/core.py:129, v1/worker/worker_base.py:276). Nothing is installed: the test writes a ``*.dist-info``
folder naming ``specdiff_vllm_feed_bugs:load`` and puts it and this folder on the server's ``PYTHONPATH``.
``SPECDIFF_TEST_BUG=<kind>`` picks the bug; unset, the plugin does nothing. The module a bug lives in is
patched when it is imported (an import hook, as the recorder does), so only the process that uses it is touched.

What a later draft step is fed (lines of vllm/v1/spec_decode/llm_base_proposer.py, vLLM 0.32.0):

- ``stale_draft_input``: ``SpecDecodeBaseProposer.propose`` (:512) runs the draft's first pass, then one step
  per later depth: it copies the previous step's draft tokens into its ``input_ids`` buffer (:720) and builds
  the step's inputs from a view of it, ``_get_positions`` (:734) the call right after. At depth 2 the buffer
  is put back to what depth 1 was fed (a buffer not refreshed), after the copy and before the forward:
  ``propose``'s draft tokens (what the verify gets) keep the right ids, only the draft's next step is fed
  another.

What the verify accepts (lines of vllm/v1/sample/rejection_sampler.py, vLLM 0.32.0; no tensor of the draft or
target changes, greedy output stays the same):

- ``accept_capped``: ``RejectionSampler.forward`` (:106) takes its output tokens from the module's
  ``rejection_sample`` (:410, called at :188): [requests, max_spec_len + 1] int32, the accepted drafts then the
  target's own pick, ``PLACEHOLDER_TOKEN_ID`` (-1, :38) past them (:444-449). Every column past ``CAP`` + 1 is
  cleared: a verify step keeps at most ``CAP`` accepted drafts and the target's pick after the last one (under
  greedy the target's argmax, the token it would have accepted or corrected anyway). What the runner reads
  from ``SamplerOutput.sampled_token_ids`` downstream (the scheduler's accepted count, the proposer's next
  token, specdiff's recorder at ``GPUModelRunner._sample``) is the capped output.
"""

from __future__ import annotations

import functools

from vllm_on_import import arm_chosen_kind

ENV = "SPECDIFF_TEST_BUG"
_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
_REJECTION = "vllm.v1.sample.rejection_sampler"
#: the most drafts ``accept_capped`` lets one verify step accept
CAP = 1
#: inside one ``propose``: how many step inputs were built (0: the first pass's), what depth 1 was fed
_step = {"n": -1, "fed": None}


def _said(kind: str) -> None:
    from specdiff_bug_plugins import _said as say

    say(kind)


def _patch_stale_input(module) -> None:
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


def _patch_accept_capped(module) -> None:
    sample = module.rejection_sample

    @functools.wraps(sample)
    def capped_sample(*a, **kw):
        out = sample(*a, **kw)  # [requests, max_spec_len + 1], -1 past the accepted drafts and the target's pick
        if bool((out[:, CAP + 1:] >= 0).any()):
            out[:, CAP + 1:] = module.PLACEHOLDER_TOKEN_ID
            _said("accept_capped")
        return out

    module.rejection_sample = capped_sample  # RejectionSampler.forward looks it up in the module at each call


#: each kind: (the module it patches, the patch run right after that module's import)
KINDS = {"stale_draft_input": (_PROPOSER, _patch_stale_input),
         "accept_capped": (_REJECTION, _patch_accept_capped)}


def load() -> None:
    """vLLM plugin entry point: arm ``$SPECDIFF_TEST_BUG`` (module doc)."""
    arm_chosen_kind(KINDS)
