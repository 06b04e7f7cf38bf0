"""The order of replay/diff/judge/__init__.py ``JUDGES``: which judge a tensor gets."""

from __future__ import annotations

from types import SimpleNamespace

from specdiff.replay.diff.judge import JUDGES
from specdiff.replay.diff.judge.routing import TargetFamily
from specdiff.replay.diff.judge.topk_ties import JUDGED


def _applying(name: str, *, moe: bool, sources: dict, names=("target.logits_topk.values",)) -> list[str]:
    side = SimpleNamespace(names=list(names))
    scene = SimpleNamespace(family=TargetFamily(None, moe, None, None, "serving"), first_sources=sources,
                            traces=SimpleNamespace(x=side, y=side))
    return [type(j).__name__ for j in JUDGES if j.applies(name, scene)]


def test_the_ties_judge_comes_before_the_context_judge_that_applies_to_the_topk_ids_too():
    for name in JUDGED:
        # the target's greedy token and top-k ids do not read the draft's attention context
        after = ["ContextJudge"] if name.startswith("draft.") else []
        assert _applying(name, moe=True, sources={0: 3}) == ["TiesJudge", *after]
        assert _applying(name, moe=True, sources={}) == ["TiesJudge"]


def test_the_target_greedy_token_is_judged_for_ties_only_where_both_sides_recorded_its_logits():
    assert _applying("target.argmax", moe=True, sources={}, names=()) == []
    assert _applying("target.argmax", moe=True, sources={}) == ["TiesJudge"]


def test_each_other_tensor_gets_at_most_one_judge():
    assert _applying("draft.hidden_out", moe=True, sources={0: 3}) == ["ContextJudge"]
    assert _applying("draft.hidden_out", moe=True, sources={}) == []
    assert _applying("target.aux.1", moe=True, sources={0: 3}) == ["RoutingJudge"]
    assert _applying("target.aux.0", moe=True, sources={0: 3}) == []
    assert _applying("target.aux.1", moe=False, sources={}) == []
