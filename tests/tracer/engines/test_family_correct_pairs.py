"""Correct pairs of each served family (tests/support/family_servers.py's servers):
``specdiff record train --replay <serve trace>`` with the same draft, then ``specdiff diff train.trace
serve.trace`` exits 0 with no divergence; the report's margin is below every limit and any explained
difference is an MoE routing near-tie on an MoE target, or the draft attention carrying such a row to
the later rows of its sequence (replay/diff/judge/context.py), or a random draft's top-k *set* swapping
at its k-th rank on bf16 near ties (replay/diff/judge/topk_ties.py).

GPT-OSS's aux slots differ from transformers in runs of positions: router near ties, each carried by
the target's own attention to the next rows of its sequence (measured: one layer-0 flip at float32
logit margin 0.0007 moved ``target.aux.1`` by rel 0.39 and the next 9 rows by 0.050-0.064; forcing
that expert choice in a float32 transformers replay reproduces the whole run), which the diff names
``moe_routing_near_tie`` (``test_gpt_oss_aux_runs_are_named_routing_near_ties``). One gap is pinned
rather than hidden: those flips come so early (seq 0 pos 1) that under 7 % of the draft's rows
precede every differing cached row, too few for replay/diff/judge/context.py to show the draft
attention itself agrees from them; a re-run of the training draft on each side's inputs shows it
instead (replay/diff/judge/context_proof.py), and the draft's later rows are named draft attention
context.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sglang")

from support.acceptance_interval import interval_words, outside_its_interval, paired_acceptance  # noqa: E402
from support.family_servers import CASES, FAMILIES, MOE_FAMILIES, SPEC_MODES  # noqa: E402

from specdiff.replay.diff.judge.shift import FLOOR_RATIO  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(3600)]


#: the draft stages before its attention output: the re-ranked-node KV bug cannot reach them
_BEFORE_DRAFT_OUTPUT = ("draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.positions", "draft.attn_in")


def _sglang_tree_rerank_bug(report: dict, mode: str) -> bool:
    """True when a tree pair's only divergence is SGLang 0.5.23's own re-ranked-node KV bug (a
    depth-2 node re-ranked into another branch's column attends over that column's
    depth-1 KV), which the diff names ``tree_rerank_kv``: at the draft's output, depth >= 2 only.
    A correct pair served as a tree legitimately shows it; anything else is still a failure."""
    first = report.get("first_divergence")
    causes = [e["cause"] for e in report.get("explanations") or []]
    return (mode == "tree" and first is not None and first["tensor"] == "draft.hidden_out"
            and first["depth"] >= 2 and causes[:1] == ["tree_rerank_kv"])


@pytest.mark.parametrize("mode", SPEC_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_correct_pair_has_no_divergence(family_servers, family_correct_pair, family, mode):
    """The same draft on both sides, the family-correct ids: ``diff`` finds no divergence, no
    tensor up to the draft's logits diverged, every aux slot and the draft's stages were compared
    on rows of every served prompt, the closest call (``margin``) is under its limit, and serving's
    per-depth acceptance sits inside its interval around training's (support/acceptance_interval.py). What the
    report explains instead of failing is a named MoE routing near-tie, and only on an MoE target,
    the draft attention carrying such a row to later rows (replay/diff/judge/context.py), or the random
    draft's top-k boundary near ties (replay/diff/judge/topk_ties.py)."""
    diff, report, train = family_correct_pair(family, mode)
    where = f"{family} {mode}: {report.get('verdict')}"
    rerank = _sglang_tree_rerank_bug(report, mode)
    if rerank:
        print(f"{family} {mode}: SGLang 0.5.23's re-ranked tree node KV bug named: {report['verdict']}")
    else:
        assert diff.returncode == 0, f"{where}\n{json.dumps(report.get('first_divergence'), indent=1)[:3000]}"
        assert report["diverged"] is False and report["first_divergence"] is None, where
    errors = [m for m in report["contract_mismatches"] if m["severity"] == "error"]
    assert errors == [], (where, errors)
    # acceptance as evidence: serving's accept decisions sit inside their interval around training's at the
    # same verify steps (read here too where a named engine bug leads the verdict and hides the gap)
    assert "outcome_differs" not in report, (where, report["outcome_differs"])
    gap = paired_acceptance(*report["traces"])
    assert gap is not None and gap.steps > 0, where
    print(f"{family} {mode}: acceptance {interval_words(gap)}")
    assert outside_its_interval(gap) == [], (where, interval_words(gap))
    assert len(report["sequences"]) == len(family_servers(family, mode).prompt_ids), report["sequences"]
    tensors = report["tensors"]
    slots = len(CASES[family].hf)
    selection = ()
    if rerank:  # the bug's rows and what they feed: the draft's output at depth >= 2 and after it
        selection += tuple(n for n in tensors if n.startswith("draft.") and n not in _BEFORE_DRAFT_OUTPUT)
    for name in [f"target.aux.{j}" for j in range(slots)] + ["draft.fc_out", "draft.hidden_out", "draft.topk_target"]:
        assert name in tensors and tensors[name]["rows"] > 0, (where, name)
        assert name in selection or tensors[name]["diverged"] is False, (where, name, tensors[name])
    assert not any(t["diverged"] for n, t in tensors.items() if n not in selection), where
    margin = report["margin"]
    assert margin is not None and 0 < margin["use"] < 1.0, (where, margin)
    print(f"{family} {mode}: margin {margin['tensor']} {margin['limit']} use {margin['use']:.2f}; "
          f"explained {[(e['cause'], e['tensor'], len(e['rows'])) for e in report['explained_differences']]}; "
          f"inherited { {n: v['rows'] for n, v in report['inherited'].items()} }")
    # the median row over the pair's noise floor (judge/shift.py), per tensor: measured 0.6-1.3 on these pairs
    ratios = {n: round(t["shift"]["ratio"], 2) for n, t in tensors.items() if "shift" in t}
    print(f"{family} {mode}: median row / noise floor {ratios}")
    assert ratios and all(r < FLOOR_RATIO for r in ratios.values()), (where, ratios)
    causes = [e["cause"] for e in report["explained_differences"]]
    for e in report["explained_differences"]:
        if e["cause"] == "moe_routing_near_tie":  # only on an MoE target, only at aux slots j >= 1
            assert family in MOE_FAMILIES, (where, e["tensor"])
            assert e["tensor"].startswith("target.aux.") and e["tensor"] != "target.aux.0", (where, e["tensor"])
            assert 0 < e["fraction"] <= e["bound"], (where, e)
        elif e["cause"] == "topk_boundary_near_tie":  # ids the draft chose from its logits, at rank k only
            assert e["tensor"] in ("draft.logits_topk.ids", "draft.topk"), (where, e)
            assert len({r["rank"] for r in e["rows"]}) == 1 and e["rows"], (where, e)
        elif e["cause"] == "target_greedy_near_tie":  # the target's own flat logits, never the draft's
            assert e["tensor"] == "target.argmax" and e["rows"], (where, e)
        else:  # a later row that read an earlier differing cached row: after the attention, with its source
            assert e["cause"] == "draft_attention_context", (where, e["cause"])
            assert e["tensor"] not in ("draft.fc_out", "draft.attn_in") and e["sources"], (where, e)
            assert e["clean_rows"] > 0 and e["max_rel"] < 1.0, (where, e)
            if e["proof"] is not None:  # too few clean rows: a re-run reproduced each side on its inputs
                limit = tensors[e["tensor"]]["tolerance"]["rel"]
                assert max(e["proof"]["serving_rel"], e["proof"]["training_rel"]) <= limit, (where, e["proof"])
                assert e["proof"]["ids_rows"] > 0, (where, e["proof"])
    if family not in MOE_FAMILIES:  # a dense target has no router to flip
        assert "moe_routing_near_tie" not in causes, (where, causes)
    # inherited rows come from an earlier stage of the same rows, never from the tensor itself
    for name, inh in report["inherited"].items():
        assert inh["rows"] > 0 and name not in inh["from"], (where, name, inh)


@pytest.mark.parametrize("mode", SPEC_MODES)
@pytest.mark.parametrize("family", ["gpt_oss"])  # a family parameter: run where GPT-OSS's servers are (SPLIT_BY_PARAM)
def test_gpt_oss_aux_runs_are_named_routing_near_ties(family_correct_pair, family, mode):
    """GPT-OSS's aux slots: every failing row whose inputs agree is a router near-tie or the
    decaying run of later rows the target's attention carries it to (replay/diff/judge/routing.py), so
    no aux slot diverges; the flips come at the first positions of every prompt, so the draft's
    later rows are named draft attention context on the strength of a draft re-run
    (replay/diff/judge/context_proof.py), not of the few rows before every flip."""
    diff, report, _ = family_correct_pair(family, mode)
    tensors = report["tensors"]
    named = {e["tensor"]: e for e in report["explained_differences"] if e["cause"] == "moe_routing_near_tie"}
    for j in range(len(CASES[family].hf)):
        t = tensors[f"target.aux.{j}"]
        assert t["diverged"] is False, (mode, j, t.get("routing_not_named"))
        if t["fail_rows"] > t["inherited_rows"] and j > 0:
            e = named[f"target.aux.{j}"]
            assert e["rows"] and e["events"] <= len(e["rows"]), e
            assert 0 < e["fraction"] <= e["bound"] and e["max_rel"] < 1.0, e
    assert "target.aux.0" not in named
    first = report["first_divergence"]
    assert first is None, first
    context = [e for e in report["explained_differences"] if e["cause"] == "draft_attention_context"]
    assert context and context[0]["tensor"] == "draft.hidden_out", report["explained_differences"]
    assert context[0]["proof"] is not None and "reproduces each side" in context[0]["message"], context[0]
    print(f"gpt_oss {mode}: " + "; ".join(f"{n}: {len(e['rows'])} rows, {e.get('events')} events, longest run "
                                          f"{e['longest_run']}, max_rel {e['max_rel']:.3f}" for n, e in named.items())
          + f"; draft.hidden_out: {context[0]['message']}")


@pytest.mark.parametrize("family", FAMILIES)
def test_training_replay_captures_the_same_layers_as_serving(family_servers, family_correct_pair, family):
    """``record train --replay`` read the served draft's ids by the target's own rule: its contract
    names the layers SGLang captured (GPT-OSS's pre-norm slot included)."""
    from specdiff.tracer.store import open_trace

    _, _, train = family_correct_pair(family, "chain")
    t, s = open_trace(str(train)).contract, family_servers(family, "chain").contract
    for fact in ("aux_hf_indices", "aux_concat_order", "aux_prenorm_indices", "target_architecture"):
        assert t.get(fact) == s[fact], (family, fact, t.get(fact), s[fact])
