"""Serving bugs of one concern for the test plugin ``specdiff_bug_plugins`` (its module doc says how it is
loaded): what the draft is fed at depth >= 1 and what the verify accepts.

``HOOKS`` maps each ``SPECDIFF_TEST_BUG`` kind to the function that registers its hook; a hook says
``specdiff_bug_plugins._said(kind)`` the first time it acts (the tests check the bug really ran).

Kinds (SGLang 0.5.23's own code path; lines of that release). What a later draft step is fed: the
multi-step draft (``EagleDraftWorker.draft_forward``, srt/speculative/eagle_worker_v2.py:742) sets
``forward_batch.input_ids`` (:821) to the previous step's selection mapped by ``hot_token_id`` (:757-758,
:897-898; ``select_top_k_tokens`` :812) and runs ``draft_runner.forward`` (:847) once per depth >= 1. The bugs below
replace what that forward embeds, a fresh tensor, after the selection: the tree the verify gets
(``token_list``) keeps the right ids, only the draft's own next step is fed another.

- ``stale_draft_input``: an input-ids buffer not refreshed: depth 2 is fed the id depth 1 was fed.
- ``draft_input_mapped_twice``: ``hot_token_id`` applied to the already-mapped id again wherever that id
  lies inside the draft vocabulary (a target id >= the draft vocab is left as it is).

What the verify accepts (no tensor of the draft or target changes; greedy output stays the same):

- ``accept_capped``: the greedy tree verify (``verify_tree_greedy_func``, srt/speculative/eagle_utils.py:650,
  from sglang/kernels/ops/speculative/spec_tree.py) keeps at most ``CAP`` accepted drafts per request: its
  accepted indices past them are cleared and its count capped, so the committed tokens are the target's own
  (``predict`` at the kept indices) and the bonus token is the target's pick after the last kept draft.
- ``last_draft_mangled``: the draft tokens handed to the verify input (``build_eagle_verify_input``,
  srt/speculative/eagle_worker_common.py:377, called at eagle_worker_v2.py:717) hold, at the last depth, the
  token of the depth before it (the tree built with a wrong index): the verify never accepts the last draft
  except where two drafted tokens repeat.
"""

from __future__ import annotations

from collections.abc import Callable

#: the most drafts ``accept_capped`` lets one verify step accept
CAP = 1
_EW2 = "sglang.srt.speculative.eagle_worker_v2"
_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
#: per multi-step draft: the draft worker's hot_token_id, the depth of the next draft step, what depth 1 was fed
_draft = {"hot": None, "depth": 0, "fed": None}


def _said(kind: str) -> None:
    from specdiff_bug_plugins import _said as say

    say(kind)


def _track_draft(orig, self, forward_batch, *a, **kw):
    """AROUND ``EagleDraftWorker.draft_forward``: the draft steps that follow are depth 1, 2, ..."""
    _draft.update(hot=getattr(self, "hot_token_id", None), depth=1, fed=None)
    try:
        return orig(self, forward_batch, *a, **kw)
    finally:
        _draft["depth"] = 0


def _feeding(kind: str, feed: Callable) -> Callable:
    """AROUND ``ModelRunner.forward``: a draft step inside ``draft_forward`` (DECODE mode) is fed
    ``feed(ids, depth)`` (int64 [rows] -> the ids it embeds, or None to leave them) instead of its ids."""

    def around(orig, self, forward_batch, *a, **kw):
        depth = _draft["depth"]
        mode = getattr(getattr(forward_batch, "forward_mode", None), "name", None)
        if not depth or not getattr(self, "is_draft_worker", False) or mode != "DECODE":
            return orig(self, forward_batch, *a, **kw)
        _draft["depth"] = depth + 1
        ids = forward_batch.input_ids
        wrong = feed(ids, depth)
        if wrong is not None and not bool((wrong == ids).all()):
            forward_batch.input_ids = wrong  # a new tensor: the tree's token_list keeps the selection
            _said(kind)
        return orig(self, forward_batch, *a, **kw)

    return around


def _stale(ids, depth: int):
    if depth == 1:
        _draft["fed"] = ids.clone()
        return None
    return _draft["fed"].clone() if _draft["fed"] is not None and _draft["fed"].shape == ids.shape else None


def _mapped_twice(ids, depth: int):
    import torch

    hot = _draft["hot"]
    if hot is None:
        return None
    inside = ids < len(hot)
    return torch.where(inside, hot[ids.clamp(max=len(hot) - 1)].to(ids.dtype), ids)


def _register_feed(kind: str, feed: Callable) -> Callable[[], None]:
    def register() -> None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(f"{_EW2}.EagleDraftWorker.draft_forward", _track_draft, HookType.AROUND)
        HookRegistry.register(f"{_MR}.forward", _feeding(kind, feed), HookType.AROUND)

    return register


def _capped_verify(orig, *a, **kw):
    """AROUND ``verify_tree_greedy_func``: (predict, accept_index [bs, depth+1], accepted drafts [bs]) with at
    most ``CAP`` drafts accepted (the root at column 0 and the first ``CAP`` accepted drafts kept)."""
    predict, accept_index, accepted = orig(*a, **kw)
    if bool((accepted > CAP).any()):
        accept_index[:, CAP + 1:] = -1
        accepted.clamp_(max=CAP)
        _said("accept_capped")
    return predict, accept_index, accepted


def _mangled_last_draft(orig, batch, draft_input, parent_list, top_scores_index, draft_tokens, *a, **kw):
    """AROUND ``build_eagle_verify_input``: the last depth's draft token replaced by the one before it
    (``draft_tokens`` [bs, steps] on a chain)."""
    if draft_tokens is not None and draft_tokens.dim() == 2 and draft_tokens.shape[1] >= 2:
        draft_tokens = draft_tokens.clone()
        draft_tokens[:, -1] = draft_tokens[:, -2]
        _said("last_draft_mangled")
    return orig(batch, draft_input, parent_list, top_scores_index, draft_tokens, *a, **kw)


def _register(target: str, hook: Callable) -> Callable[[], None]:
    def register() -> None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(target, hook, HookType.AROUND)

    return register


HOOKS: dict[str, Callable[[], None]] = {
    "stale_draft_input": _register_feed("stale_draft_input", _stale),
    "draft_input_mapped_twice": _register_feed("draft_input_mapped_twice", _mapped_twice),
    "accept_capped": _register("sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_func", _capped_verify),
    "last_draft_mangled": _register("sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input",
                                    _mangled_last_draft),
}
