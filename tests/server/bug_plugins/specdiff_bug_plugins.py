"""A test-owned SGLang general plugin that puts one serving bug into a real SGLang 0.5.23 server.

Loaded the way specdiff's own recorder is (tracer/engines/sglang/plugin.py): through SGLang's
``sglang.srt.plugins`` entry-point group, which ``load_plugins()`` calls in every process it
starts (srt/plugins/__init__.py). Nothing is installed: the test writes a ``*.dist-info`` folder
naming ``specdiff_bug_plugins:load`` and puts it and this folder on the server's ``PYTHONPATH``
(tests/server/test_injected_serving_bugs.py ``entry_point_dir``). ``SPECDIFF_TEST_BUG=<kind>`` picks the bug; unset, the plugin does nothing.

Kinds (each on SGLang 0.5.23's own code path; lines of that release):

- ``positions``: the draft's rope positions advanced *before* each multi-step draft forward
  instead of after: SGLang's own revert of its fix PR #25015
  (srt/debug_utils/pr_fix_toggle.py:10 ``_PR_REVERT_YAML_25015``, applied to
  srt/speculative/eagle_worker_v2.py:742 ``EagleDraftWorker.draft_forward``): every draft step
  (depth >= 1) runs one position too far.
- ``chunk_token``: the draft's input token at the last row of a non-final prefill chunk is the
  target's sampled token instead of the next chunk's first prompt token: SGLang's revert of PR
  #26329 (pr_fix_toggle.py:55, on srt/speculative/eagle_utils.py:81
  ``_eagle_prefill_tail_tokens``), one wrong draft input token per chunk boundary.
- ``cache_hit_kv``: on a request whose prefix hit the radix cache (``Req.cached_tokens`` > 0,
  srt/managers/schedule_batch.py:2974), the draft's KV of the cached slots is wiped before its
  prefill draft extend (srt/speculative/eagle_worker_v2.py:961 ``_draft_extend_for_prefill``):
  the target's KV was reused, the draft's is missing.
- ``stale_kv``: the KV the decode draft extend writes after verify
  (srt/speculative/eagle_worker_v2.py:1110 ``_draft_extend_for_decode``, the draft forward in
  ``DRAFT_EXTEND_V2`` mode) is discarded: its slots keep what they held before (what the draft's
  own steps wrote from its predicted hidden states), so every later round attends to stale KV.
"""

from __future__ import annotations

import os
import sys

ENV = "SPECDIFF_TEST_BUG"
KINDS = ("positions", "chunk_token", "cache_hit_kv", "stale_kv")
#: SGLang's own registered reverts of the PRs that fixed these bugs (srt/debug_utils/pr_fix_toggle.py)
REVERT_PR = {"positions": 25015, "chunk_token": 26329}
_EW2 = "sglang.srt.speculative.eagle_worker_v2"
#: modules beside this one that add kinds, one concern each: their ``HOOKS`` maps a kind to the function
#: that registers its hook (called in every process SGLang starts, like ``load``)
KIND_MODULES = ("specdiff_feed_bugs", "specdiff_state_bugs")
_applied = False
_acted: set[str] = set()


def _said(kind: str) -> None:
    """One line in the server's log the first time the bug acts (the test checks the bug really ran)."""
    if kind not in _acted:
        _acted.add(kind)
        print(f"specdiff_bug_plugins: {kind} injected", file=sys.stderr, flush=True)


def _draft_kv_buffers(draft_worker) -> list:
    """The draft's per-layer K and V buffers ([slots, heads, head_dim] each; MHATokenToKVPool,
    srt/mem_cache/memory_pool.py:2184)."""
    pool = draft_worker.draft_runner.token_to_kv_pool
    return [*pool.k_buffer, *pool.v_buffer]


def _wipe_cached_prefix(orig, self, batch, *a, **kw):
    """``cache_hit_kv``: zero the draft KV of each cache-hit request's cached prefix, then extend."""
    # ScheduleBatch.req_pool_indices: each request's req_to_token row (srt/managers/schedule_batch.py:2545)
    for req, pre, row in zip(batch.reqs, batch.prefix_lens or (), batch.req_pool_indices.tolist(), strict=False):
        hit = int(getattr(req, "cached_tokens", 0) or 0)
        if hit > 0 and pre == hit:  # the request's first chunk, right after its radix-cache match
            slots = self.req_to_token_pool.req_to_token[row, :hit].to(torch_long())
            for buf in _draft_kv_buffers(self):
                buf[slots] = 0
            _said("cache_hit_kv")
    return orig(self, batch, *a, **kw)


def torch_long():
    import torch

    return torch.int64


def _discard_decode_extend_kv(orig, self, forward_batch, *a, **kw):
    """``stale_kv``: a draft forward in DRAFT_EXTEND_V2 mode keeps its outputs, but its KV writes
    are undone."""
    mode = getattr(forward_batch, "forward_mode", None)
    if not getattr(self, "is_draft_worker", False) or mode is None or mode.name != "DRAFT_EXTEND_V2":
        return orig(self, forward_batch, *a, **kw)
    pool = self.token_to_kv_pool
    bufs = [*pool.k_buffer, *pool.v_buffer]
    loc = forward_batch.out_cache_loc.to(torch_long())
    saved = [b[loc].clone() for b in bufs]
    out = orig(self, forward_batch, *a, **kw)
    for b, s in zip(bufs, saved, strict=True):
        b[loc] = s
    _said("stale_kv")
    return out


def _revert_once(orig, self, *a, **kw):
    """Apply SGLang's revert of the fixing PR at the first speculative iteration (scheduler
    process only, where the functions run)."""
    global _applied
    if not _applied:
        from sglang.srt.debug_utils.pr_fix_toggle import _revert_pr_fix

        _revert_pr_fix(REVERT_PR[os.environ[ENV]])
        _applied = True
        _said(os.environ[ENV])
    return orig(self, *a, **kw)


def more_kinds() -> dict:
    """Every kind of ``KIND_MODULES``: {kind: register()}."""
    import importlib

    hooks: dict = {}
    for name in KIND_MODULES:
        hooks.update(importlib.import_module(name).HOOKS)
    return hooks


def load() -> None:
    """SGLang plugin entry point: register the hook of ``$SPECDIFF_TEST_BUG`` (module doc)."""
    kind = os.environ.get(ENV)
    if not kind:
        return
    more = more_kinds()
    if kind not in KINDS and kind not in more:
        raise ValueError(f"{ENV}={kind!r}: one of {', '.join((*KINDS, *more))}")
    if kind in more:
        more[kind]()
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if kind in REVERT_PR:
        HookRegistry.register(f"{_EW2}.EAGLEWorkerV2.forward_batch_generation", _revert_once, HookType.AROUND)
    elif kind == "cache_hit_kv":
        HookRegistry.register(f"{_EW2}.EagleDraftWorker._draft_extend_for_prefill", _wipe_cached_prefix,
                              HookType.AROUND)
    else:
        HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.forward",
                              _discard_decode_extend_kv, HookType.AROUND)
