"""Inherited rows and MoE routing near-ties: no false divergence from numerics the
target family makes legitimate, and no real bug hidden by them.

Each test writes a real pair of zarr stores (``TraceWriter``) carrying the EAGLE-3 dataflow of
one position at every stage: ``tokens`` and the draft's by-depth tensors at depths 0..2, the three
aux slots, their concat and the draft's fc output. Serving equals training up to bf16-sized noise,
then a chosen kind of difference is written in:

- ``flips``: positions whose ``target.aux.1`` row flipped (an MoE router near-tie), as the
  target really propagates it: ``target.aux.2`` and ``aux_cat`` of the same row differ, and so
  does every draft row of that position (all depths); ``target.aux.0`` agrees;
- ``bug_fc``: positions whose ``draft.fc_out`` is wrong while every input agrees;
- ``bug_tokens``: positions whose depth-0 draft input token is wrong (a chunk-boundary bug).

Every diff here also runs the autouse early == full check (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from builders import TracePair
from builders import moved as _off

from specdiff.replay.diff.compare import blocks
from specdiff.replay.diff.judge.routing import ROUTING_MAX_FRAC
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.tracer.schema import aux_name

H, N_SEQ, T, DEPTHS = 32, 8, 64, 3
ROWS = N_SEQ * T  # depth-0 rows of a depthless tensor
MOE = {"target_architecture": "Qwen3MoeForCausalLM", "target_num_experts": 4, "target_experts_per_token": 2}
DENSE = {"target_architecture": "Qwen3ForCausalLM"}


def spread(n: int, *, first: int = 3) -> list[tuple[int, int]]:
    """``n`` isolated (seq, pos) rows spread over the sequences (no two at neighbouring positions)."""
    return [(i % N_SEQ, first + 7 * (i // N_SEQ) + (i % 3)) for i in range(n)]


def write_pair(root, *, family: dict | None, flips=(), bug_fc=(), bug_tokens=(), draft_until: int = T,
               flip_rel: float = 0.2, flip_slot: int = 1, carried=(), argmax=None,
               cached: tuple[int, int, int] | None = None) -> tuple[str, str]:
    """Training and serving traces (module doc); ``family``: target facts in serving's contract
    (None: none recorded); draft rows only at positions < ``draft_until`` (serving's coverage);
    ``flip_slot``: the aux slot where flips start (the slots after it follow); ``carried``: (seq, pos)
    rows whose ``target.aux.2`` alone is moved by rel 0.06 (an earlier flip carried by the target's
    attention, just over the tolerance); ``argmax``: None (no ``target.argmax`` rows), else the
    (seq, pos) rows where serving's greedy token differs from training's; ``cached``: (seq, source seq,
    c): that sequence's first c tokens are the source's and serving records its rows from position c
    on (its prefix served from the radix cache, as the recorder writes it)."""
    flips, bug_fc, bug_tokens, carried = set(flips), set(bug_fc), set(bug_tokens), set(carried)
    base = {"hidden_size": H, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16"}
    pair = TracePair(root, contract=base, serve=family)
    rng = pair.rng
    seen: dict[int, np.ndarray] = {}
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, T + 1 + DEPTHS)
        if cached is not None and s == cached[0]:
            toks[:cached[2]] = seen[cached[1]][:cached[2]]
        seen[s] = toks
        aux = rng.standard_normal((3, T, H)).astype(np.float32)
        fc = rng.standard_normal((T, H)).astype(np.float32)
        hid = rng.standard_normal((DEPTHS, T, H)).astype(np.float32)  # hidden_in at depth k
        out = rng.standard_normal((DEPTHS, T, H)).astype(np.float32)  # hidden_out at depth k
        for w in pair.sides(s, toks, prompt_len=4):
            noise = w.noise
            a, f, hi, ho = w.jitter(aux), w.jitter(fc), w.jitter(hid), w.jitter(out)  # bf16-sized on serving
            toks_in = [toks[1 + k:1 + k + T].astype(np.int64).copy() for k in range(DEPTHS)]
            if w.serving:
                for t in range(T):
                    if (s, t) in flips:
                        for j in range(flip_slot, 3):
                            a[j, t] = _off(a[j, t], noise, flip_rel / (1 + j - flip_slot))
                    if (s, t) in carried:
                        a[2, t] = _off(a[2, t], noise, 0.06)
                    if (s, t) in flips or (s, t) in bug_fc:
                        f[t] = _off(f[t], noise, flip_rel)
                    if (s, t) in flips or (s, t) in bug_fc:
                        for k in range(DEPTHS):
                            hi[k, t] = _off(hi[k, t], noise, flip_rel)
                    if (s, t) in flips or (s, t) in bug_fc or (s, t) in bug_tokens:  # the token feeds attention
                        for k in range(DEPTHS):
                            ho[k, t] = _off(ho[k, t], noise, flip_rel)
                    if (s, t) in bug_tokens:
                        toks_in[0][t] += 1
            lo = cached[2] if cached is not None and w.serving and s == cached[0] else 0
            pos = np.arange(lo, T)
            w.append("tokens", toks_in[0][lo:], pos=pos)
            for j in range(3):
                w.append(aux_name(j), a[j][lo:], pos=pos)
            w.append("target.aux_cat", np.concatenate(list(a), axis=1)[lo:], pos=pos)
            if argmax is not None:
                greedy = toks[1:1 + T].astype(np.int64).copy()
                if w.serving:
                    greedy[[t for t in range(T) if (s, t) in set(argmax)]] += 1
                w.append("target.argmax", greedy[lo:], pos=pos)
            w.append("draft.fc_out", f[lo:], pos=pos)
            for k in range(DEPTHS):
                p = np.arange(lo, min(draft_until, T - 1 - k))  # row t at depth k needs x_{t+1+k}
                if k:
                    w.append("tokens", toks_in[k][p], pos=p, depth=k)
                w.append("draft.hidden_in", hi[k, p], pos=p, depth=k)
                w.append("draft.hidden_out", ho[k, p], pos=p, depth=k)
    return pair.close()


@pytest.fixture
def small_blocks(monkeypatch):
    """64-row blocks: the early watch sees many blocks of each tensor."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 64 * 4 * H)


def test_moe_routing_flips_are_named_and_their_downstream_rows_inherited(tmp_path, small_blocks):
    rows = spread(16)  # 16 / 512 = 3.1 % of target.aux.1: above the 2 % bf16 fail fraction
    a, b = write_pair(tmp_path, family=MOE, flips=rows)
    report = diff_traces(a, b, narrow=False)
    assert report.first is None, report.verdict()
    aux1 = report.comparisons["target.aux.1"]
    assert aux1.stats["fail_rows"] == 16 and aux1.stats["fail_frac"] > aux1.tolerance.max_fail_frac
    (flip,) = report.legitimate
    assert flip.cause == "moe_routing_near_tie" and flip.tensor == "target.aux.1" and flip.previous == "target.aux.0"
    assert sorted((r["seq"], r["pos"]) for r in flip.rows) == sorted(rows)
    assert 0.1 < flip.max_rel < 0.4 and flip.longest_run == 1
    assert "Qwen3MoeForCausalLM, 4 experts, top-2" in flip.family
    # downstream: the rows fail, more than the fail fraction, but every one is inherited
    out = report.comparisons["draft.hidden_out"]
    assert out.stats["fail_frac"] > out.tolerance.max_fail_frac and not out.diverged
    assert out.stats["inherited_rows"] == out.stats["fail_rows"] == 16 * DEPTHS
    assert out.stats["inherited_from"] == {"target.aux.1": 16 * DEPTHS}
    assert report.inherited()["target.aux.2"] == {"rows": 16, "from": {"target.aux.1": 16}}
    assert "explained: MoE routing near-tie at target.aux.1 (16 rows)" in report.verdict()
    text = render_text(report)
    assert "explained differences (legitimate for this target family" in text
    assert "draft.hidden_out" in text.split("inherited rows")[1] and "margin: closest to a limit" in text
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    js = json.loads(proc.stdout)
    assert js["explained_differences"][0]["cause"] == "moe_routing_near_tie"
    assert js["inherited"]["draft.hidden_out"]["from"] == {"target.aux.1": 16 * DEPTHS}
    assert js["tensors"]["target.aux.1"]["explained_rows"] == 16


def test_the_same_flips_on_a_dense_target_are_judged_as_before_at_the_aux_slot(tmp_path, small_blocks):
    a, b = write_pair(tmp_path, family=DENSE, flips=spread(16))
    report = diff_traces(a, b, narrow=False)
    # no named cause on a dense target: 3.1 % of target.aux.1 is a divergence there, as before,
    # and the first divergence is the aux slot, not a draft tensor downstream
    assert report.first.name == "target.aux.1" and not report.legitimate
    assert report.first.stats["own_fail_rows"] == 16
    unknown = diff_traces(*write_pair(tmp_path / "unknown", family=None, flips=spread(16)), narrow=False)
    assert unknown.first.name == "target.aux.1" and not unknown.legitimate


def test_flips_within_the_fail_fraction_do_not_make_a_draft_tensor_diverge(tmp_path, small_blocks):
    # The measured Qwen3-MoE case, on a dense or unknown target too: 8 aux rows (1.6 %, within the
    # fraction) whose positions hold 3.1 % of serving's draft rows (drafted at the first 32).
    rows = [(s, 5 + 3 * (s % 4)) for s in range(N_SEQ)]
    a, b = write_pair(tmp_path, family=None, flips=rows, draft_until=32)
    report = diff_traces(a, b, narrow=False)
    assert report.first is None, report.verdict()
    out = report.comparisons["draft.hidden_out"]
    assert out.stats["fail_frac"] > out.tolerance.max_fail_frac  # what made it diverge before
    assert out.stats["inherited_rows"] == out.stats["fail_rows"] and out.stats["own_fail_rows"] == 0
    assert not report.legitimate  # unknown family: nothing named, the aux rows are within tolerance


def test_a_few_row_bug_whose_inputs_agree_is_still_the_first_divergence(tmp_path, small_blocks):
    # On the MoE pair with routing flips, draft.fc_out is also wrong at 12 other positions whose
    # inputs agree (2.3 % of its rows): that counts in full, routing explains nothing there.
    a, b = write_pair(tmp_path, family=MOE, flips=spread(16), bug_fc=spread(12, first=4))
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.fc_out"
    assert report.first.stats["own_fail_rows"] == 12 and report.first.stats["inherited_rows"] == 16
    assert [e.tensor for e in report.legitimate] == ["target.aux.1"]


def test_one_wrong_chunk_boundary_token_is_a_divergence_at_tokens(tmp_path, small_blocks):
    # 5 of 512 depth-0 draft input tokens wrong (1 %, under the 5 % ids fail fraction): the wrong
    # tokens are the first divergence. A diverged stage's rows are the divergence, not noise, so
    # the draft rows they feed keep their own verdict (counted, not inherited).
    bad = [(1, 16), (3, 32), (4, 48), (6, 16), (7, 32)]
    a, b = write_pair(tmp_path, family=MOE, bug_tokens=bad)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "tokens" and report.first.stats["own_fail_rows"] == 5
    w = report.first.first_where
    assert (w["pair"], w["pos"], w["depth"]) == (1, 16, 0)
    out = report.comparisons["draft.hidden_out"].stats
    assert out["own_fail_rows"] == 5 and out["inherited_rows"] == 0


def test_a_run_of_failing_rows_is_not_a_routing_near_tie(tmp_path, small_blocks):
    # 12 consecutive positions of one sequence (2.3 %): a real bug over a position range
    run = [(2, t) for t in range(20, 32)]
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=run), narrow=False)
    assert report.first.name == "target.aux.1" and not report.legitimate
    w = report.first.first_where
    assert (w["pair"], w["pos"]) == (2, 20)
    assert "run of 12 consecutive positions" in report.first.stats["routing_not_named"]
    text = " ".join(render_text(report).split())  # unwrapped
    assert "not MoE routing near-ties: they form a run of 12" in text
    fam = report.first.stats["routing_family"]
    assert "experts" in fam and f"MoE target ({fam}): not MoE routing near-ties" in text


def test_a_flat_run_carried_from_a_flip_at_the_earlier_slot_is_that_flips_tail(tmp_path, small_blocks):
    # a correct DeepSeek-V3 pair (make test-seeds): a router flip at target.aux.1 seq 3 pos 17, then
    # target.aux.2 at rel 0.062 ... 0.055 over the next 6 rows (decaying below 0.05 after them)
    tail = [(3, t) for t in range(18, 24)]
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=[(3, 17)], carried=tail), narrow=False)
    assert report.first is None, report.verdict()
    named = {e.tensor: e for e in report.legitimate}
    rows = {(r["seq"], r["pos"]) for r in named["target.aux.2"].rows}
    assert rows == set(tail), rows  # pos 17 is the flip's own row, inherited from target.aux.1
    assert "a flip (at this slot or an earlier one) and the rows after it" in named["target.aux.2"].message


@pytest.mark.parametrize("shared", [True, False], ids=["prefix shared", "prefix not shared"])
def test_a_run_at_the_start_of_a_cached_sequence_is_the_flip_its_prefix_carries(tmp_path, small_blocks, shared):
    # a correct DeepSeek-V3 pair (make test-seeds seed 2): seq 1 extends seq 0's prompt, its first 10
    # positions served from seq 0's cached KV, which holds seq 0's router flip at pos 3; seq 1's
    # target.aux.2 rows 10-13 then sat at 0.064-0.056 with no row of its own before them
    tail = [(1, t) for t in range(10, 14)]
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=[(0, 3)], carried=tail,
                                     cached=(1, 0, 10) if shared else None), narrow=False)
    if shared:
        assert report.first is None, report.verdict()
        rows = {(r["seq"], r["pos"]) for e in report.legitimate if e.tensor == "target.aux.2" for r in e.rows}
        assert set(tail) <= rows, rows
    else:  # seq 1 recomputed its own prefix: nothing before the run differs, a real run
        assert report.first is not None and report.first.name == "target.aux.2", report.verdict()
        assert "does not fade out" in report.first.stats["routing_not_named"]


@pytest.mark.parametrize("shared", [True, False], ids=["prefix shared", "prefix not shared"])
def test_greedy_tokens_of_a_cached_sequence_inherit_the_flip_its_prefix_carries(tmp_path, small_blocks, shared):
    flipped = [(1, t) for t in range(11, T, 2)]  # 27 of 502 rows: 5.4 %, over the 5 % an id tensor may fail
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=[(0, 3)], argmax=flipped,
                                     cached=(1, 0, 10) if shared else None), narrow=False)
    argmax = report.comparisons["target.argmax"]
    assert argmax.diverged is not shared, report.verdict()
    if shared:
        assert argmax.stats["own_fail_rows"] == 0 and argmax.stats["inherited_from"]["target.aux.1"] > len(flipped)


@pytest.mark.parametrize("how", ["no flip before it", "to the end of its sequence"])
def test_a_flat_run_is_not_a_carried_tail_without_the_flip_or_an_end(tmp_path, small_blocks, how):
    flips, tail = ([], [(3, t) for t in range(18, 24)]) if how == "no flip before it" else (
        [(3, 53)], [(3, t) for t in range(54, T)])
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=flips, carried=tail), narrow=False)
    assert report.first is not None and report.first.name == "target.aux.2", report.verdict()
    why = report.first.stats["routing_not_named"]
    assert ("does not fade out" in why) if how == "no flip before it" else ("no agreeing row" in why), why


#: greedy tokens flipped at every other position after (3, 17) and (5, 10): 50 of 512 rows, 9.8 % (an id
#: tensor may fail 5 %)
_AFTER_FLIPS = [(3, t) for t in range(19, T, 2)] + [(5, t) for t in range(11, T, 2)]


def test_greedy_tokens_after_an_explained_router_flip_are_inherited_through_the_targets_attention(
        tmp_path, small_blocks):
    # a correct DeepSeek-V3 pair (make test-seeds): 5 greedy tokens flipped after a target.aux.1 flip
    # of their sequence made target.argmax the first divergence
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=[(3, 17), (5, 10)], argmax=_AFTER_FLIPS + [(0, 30)]),
                         narrow=False)
    assert report.first is None, report.verdict()
    argmax = report.comparisons["target.argmax"]
    # every row after each flip, passing or not, and the flips' own rows (inherited at the same position)
    assert argmax.stats["inherited_from"] == {"target.aux.1": (T - 1 - 17) + (T - 1 - 10) + 2}
    assert argmax.stats["own_fail_rows"] == 1  # (0, 30): no flip in its sequence, counted


@pytest.mark.parametrize("flips", [[], [(s, 1) for s in range(N_SEQ)]], ids=["no flip", "flips too early"])
def test_greedy_tokens_are_counted_without_an_explained_flip_or_rows_before_it(tmp_path, small_blocks, flips):
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=flips, argmax=_AFTER_FLIPS), narrow=False)
    assert report.first is not None and report.first.name == "target.argmax", report.verdict()


def test_more_flips_than_routing_explains_are_a_divergence(tmp_path, small_blocks):
    n = int(ROWS * ROUTING_MAX_FRAC) + 8  # isolated, but above the routing bound
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=spread(n)), narrow=False)
    assert report.first.name == "target.aux.1" and not report.legitimate
    assert "more than the 10% routing near-ties may explain" in report.first.stats["routing_not_named"]


def test_a_wrong_layer_on_an_moe_target_is_a_divergence_at_the_aux_slot(tmp_path, small_blocks):
    every = [(s, t) for s in range(N_SEQ) for t in range(T)]
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=every, flip_rel=1.5), narrow=False)
    assert report.first.name == "target.aux.1" and report.first.first_where == {"pair": 0, "pos": 0, "depth": 0}
    assert not report.legitimate


def test_the_margin_names_the_tensor_closest_to_its_limit(tmp_path):
    a, b = write_pair(tmp_path, family=DENSE)
    report = diff_traces(a, b, narrow=False)
    m = report.margin()
    assert report.first is None and m is not None
    worst = max((c.stats["max_rel_passing"], n) for n, c in report.comparisons.items() if "max_rel_passing" in c.stats)
    assert 0 < m["use"] < 1
    if m["limit"] == "rel":
        assert (m["max_rel_passing"], m["tensor"]) == worst
        assert m["use"] == pytest.approx(worst[0] / 0.05, rel=1e-3)
    assert json.loads(json.dumps(report.to_json()["margin"]))["tensor"] == m["tensor"]
    assert "close to a limit" not in report.verdict()
    # one position moved by 0.048 at every stage, against the 0.05 limit: the verdict names it
    close = diff_traces(*write_pair(tmp_path / "close", family=DENSE, flips=[(3, 9)], flip_rel=0.048),
                        narrow=False)
    m = close.margin()
    assert close.first is None and m["limit"] == "rel" and 0.045 < m["max_rel_passing"] < 0.05
    assert f"close to a limit: {m['tensor']} at 9" in close.verdict()


@pytest.mark.parametrize("case", ["moe flips", "dense flips", "fc bug after flips", "token bug", "run"])
def test_the_early_first_divergence_is_the_full_one(tmp_path, small_blocks, case):
    # (also checked on every diff above by tests/conftest.py; said here once per kind of pair)
    kw = {"moe flips": dict(family=MOE, flips=spread(16)), "dense flips": dict(family=DENSE, flips=spread(16)),
          "fc bug after flips": dict(family=MOE, flips=spread(16), bug_fc=spread(12, first=4)),
          "token bug": dict(family=MOE, bug_tokens=[(1, 16), (3, 32)]),
          "run": dict(family=MOE, flips=[(2, t) for t in range(20, 32)])}[case]
    said = []
    report = diff_traces(*write_pair(tmp_path, **kw), narrow=False, on_first=said.append)
    if report.first is None:
        assert said == [] and case == "moe flips"
    else:
        assert [(e.name, e.where) for e in said] == [(report.first.name, report.first.first_where)]


def test_flips_at_slot_0_are_not_named_routing_near_ties(tmp_path, small_blocks):
    # no earlier slot shows that the layer before agreed: judged by the stage's tolerance, as before
    report = diff_traces(*write_pair(tmp_path, family=MOE, flips=spread(16), flip_slot=0), narrow=False)
    assert report.first.name == "target.aux.0" and not report.legitimate
    assert report.first.stats["routing_not_named"].startswith("slot 0 has no earlier aux slot")


@pytest.mark.parametrize(("source", "target", "expected"), [
    # captures of the target's forward read no other capture: their link is forward_feeds (inherited only
    # along the dataflow: test_inherited_dataflow.py)
    ("tokens", "target.aux.0", True), ("target.aux.0", "target.aux.1", False), ("target.aux.1", "target.aux.0", False),
    ("target.aux.2", "target.aux_cat", True), ("target.aux.1", "target.argmax", False),
    ("draft.hidden_out", "target.argmax", False),  # the target never reads the draft
    ("target.argmax", "draft.topk", False), ("target.aux_cat", "draft.fc_in", True),
    ("draft.fc_out", "draft.hidden_in", True), ("draft.hidden_in", "draft.fc_out", False),
    ("draft.attn_in", "draft.hidden_out", True), ("draft.hidden_out", "draft.attn_in", False),
    ("draft.logits_topk.values", "draft.logits_topk.ids", False),  # two views of one output
    ("draft.logsumexp", "draft.topk", True), ("draft.topk", "draft.topk_target", True),
    ("draft.hidden_out", "tokens", False),
])
def test_which_tensor_feeds_which(source, target, expected):
    from specdiff.replay.diff.judge.inherited import feeds

    assert feeds(source, target) is expected


@pytest.mark.parametrize(("facts", "moe"), [
    ({"target_architecture": "Qwen3MoeForCausalLM", "target_num_experts": 4, "target_experts_per_token": 2}, True),
    ({"target_architecture": "SomeNewForCausalLM", "target_num_experts": None, "target_experts_per_token": None},
     False),  # a recorder's explicit null: a dense config
    ({"target_architecture": "GptOssForCausalLM", "target_num_experts": "unknown"}, True),  # known MoE class
    ({"target_architecture": "SomeNewForCausalLM", "target_num_experts": "unknown"}, None),
    ({"target_architecture": "LlamaForCausalLM"}, False),
    ({}, None),
])
def test_the_target_family_is_read_from_the_contract(tmp_path, facts, moe):
    from specdiff.replay.diff.judge.routing import target_family
    from specdiff.replay.diff.types import Pair
    from specdiff.tracer.store import open_trace

    a, b = write_pair(tmp_path, family=facts)
    fam = target_family(Pair(open_trace(a), open_trace(b)), Pair("training", "serving"))
    assert fam.moe is moe
    assert fam.source == ("serving" if facts else "unknown")
