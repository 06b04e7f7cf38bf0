"""Draft attention context (replay/diff/judge/context.py): an earlier cached row that differed moves the
later rows of its sequence after the draft attention; that is named, not a divergence, and a bug in
the attention itself is still one.

Each test writes a real pair of zarr stores (``TraceWriter``) with the dataflow of one position at
depth 0: ``tokens``, three aux slots, ``draft.fc_out``, ``draft.attn_in`` and ``draft.hidden_out``.
Serving equals training up to bf16-sized noise, then:

- ``flips``: positions whose ``target.aux.1`` row flipped (an MoE router near-tie): aux.1/aux.2,
  fc_out, attn_in and hidden_out of that position differ (same-position inheritance);
- ``context``: in the sequences of those flips, every later ``draft.hidden_out`` row moves by
  ``context_rel`` (the flipped position's cached K/V, read by the attention) — the pattern measured
  on the tiny DeepSeek-V3 target;
- ``attn_bug``: ``draft.hidden_out`` moved at every position of some sequences (a wrong rope or
  mask in the serving draft).
"""

from __future__ import annotations

import numpy as np
from builders import TracePair
from builders import moved as _off

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.tracer.schema import aux_name

H, N_SEQ, T = 32, 6, 48
MOE = {"target_architecture": "DeepseekV3ForCausalLM", "target_num_experts": 4, "target_experts_per_token": 2}


def write_pair(root, *, flips=(), context_rel=0.0, attn_bug=(), bug_rel=0.08, moe=True) -> tuple[str, str]:
    base = {"hidden_size": H, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16"}
    pair = TracePair(root, contract=base, serve=MOE if moe else None)
    rng = pair.rng
    flip_at = dict(flips)  # seq -> flipped position
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, T + 1)
        aux = rng.standard_normal((3, T, H)).astype(np.float32)
        fc, attn, out = (rng.standard_normal((T, H)).astype(np.float32) for _ in range(3))
        for w in pair.sides(s, toks, prompt_len=4):
            noise = w.noise
            a, f, at, ho = w.jitter(aux), w.jitter(fc), w.jitter(attn), w.jitter(out)
            if w.serving:
                for t in range(T):
                    if flip_at.get(s) == t:
                        for j in (1, 2):
                            a[j, t] = _off(a[j, t], noise, 0.2)
                        f[t], at[t], ho[t] = (_off(x, noise, 0.3) for x in (f[t], at[t], ho[t]))
                    elif s in flip_at and t > flip_at[s] and context_rel:
                        ho[t] = _off(ho[t], noise, context_rel)
                    if s in attn_bug:
                        ho[t] = _off(ho[t], noise, bug_rel)
            pos = np.arange(T)
            w.append("tokens", toks[1:T + 1].astype(np.int64), pos=pos)
            for j in range(3):
                w.append(aux_name(j), a[j], pos=pos)
            w.append("draft.fc_out", f, pos=pos)
            w.append("draft.attn_in", at, pos=pos, depth=0)
            w.append("draft.hidden_out", ho, pos=pos, depth=0)
    return pair.close()


FLIPS = [(0, 30), (2, 40)]  # late in 2 of 6 sequences: most rows see only agreeing context


def test_rows_moved_by_an_earlier_flipped_cached_row_are_named_not_a_divergence(tmp_path):
    report = diff_traces(*write_pair(tmp_path, flips=FLIPS, context_rel=0.08), narrow=False)
    assert report.first is None, report.verdict()
    out = report.comparisons["draft.hidden_out"]
    assert out.stats["inherited_rows"] == 2  # the flipped positions themselves (same position)
    ctx = out.explanation
    assert ctx is not None and ctx.cause == "draft_attention_context"
    assert sorted((r["seq"], r["pos"]) for r in ctx.rows) == [(0, t) for t in range(31, T)] + [(2, t) for t in range(41, T)]
    assert ctx.sources == [{"seq": 0, "pos": 30}, {"seq": 2, "pos": 40}]
    assert [e.cause for e in report.legitimate] == ["moe_routing_near_tie", "draft_attention_context"]
    js = report.to_json()
    assert [e["cause"] for e in js["explained_differences"]] == ["moe_routing_near_tie", "draft_attention_context"]
    assert js["explained_differences"][1]["message"] == ctx.message


def test_the_same_rows_without_an_earlier_source_are_a_divergence(tmp_path):
    # the same later rows moved, but nothing upstream differed before them: the attention itself
    report = diff_traces(*write_pair(tmp_path, attn_bug=(0, 2)), narrow=False)
    assert report.first is not None and report.first.name == "draft.hidden_out"
    assert report.comparisons["draft.hidden_out"].explanation is None


def test_an_attention_bug_after_flips_is_still_the_first_divergence(tmp_path):
    # flips and their context, plus a serving attention bug in two sequences without a flip: those
    # rows lie before any source of their sequence, so nothing is named and the bug counts in full
    report = diff_traces(*write_pair(tmp_path, flips=FLIPS, context_rel=0.08, attn_bug=(3, 4)), narrow=False)
    assert report.first is not None and report.first.name == "draft.hidden_out"
    out = report.comparisons["draft.hidden_out"]
    assert out.explanation is None
    assert "before any differing cached row" in out.stats["context_not_named"]


def test_too_few_clean_rows_name_nothing(tmp_path):
    # a flip at position 1 of every sequence: the rows before it cannot show that the attention agrees
    report = diff_traces(*write_pair(tmp_path, flips=[(s, 1) for s in range(N_SEQ)], context_rel=0.08),
                         narrow=False)
    assert report.first is not None and report.first.name == "draft.hidden_out"
    assert "too few to show" in report.comparisons["draft.hidden_out"].stats["context_not_named"]


# ---- too few clean rows: a draft re-run may stand in for them (replay/diff/judge/context_proof.py) -------
EARLY = [(s, 1) for s in range(N_SEQ)]  # a flip at position 1 of every sequence


def _compare(paths, prove):
    """``compare_all`` of a written pair with ``prove`` as the context prover (the real one re-runs
    a draft checkpoint: tests/replay/diff/judge/test_context_proof.py; here its answer is given)."""
    from specdiff.replay.diff.align.align import align_sequences
    from specdiff.replay.diff.compare.compare import compare_all
    from specdiff.replay.diff.types import Pair
    from specdiff.tracer.store import open_trace

    traces = Pair(*(open_trace(p) for p in paths))
    return compare_all(traces, align_sequences(traces), prove_context=prove)


class _Prover:
    """Records what it was asked; answers ``answer`` (a ReplayProof, or why not)."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def __call__(self, comp, idx):
        self.asked.append((comp.name, np.asarray(idx)))
        return self.answer


def test_a_re_run_proof_names_the_rows_and_later_stages_inherit_the_proven_ones(tmp_path):
    from specdiff.replay.diff.judge.context_proof import ReplayProof
    from specdiff.replay.diff.judge.inherited import source_rows

    prover = _Prover(ReplayProof(rows=0, sequences=N_SEQ, ids_rows=0, training_rel=0.0, serving_rel=0.004,
                                 sides_rel=0.3))
    comps = _compare(write_pair(tmp_path, flips=EARLY, context_rel=0.08), prover)
    out = comps["draft.hidden_out"]
    assert not out.diverged and out.explanation is not None and out.explanation.proof is not None
    assert "re-running the training draft reproduces each side" in out.explanation.message
    # asked once, for every counted row after a flip (passing rows too), and those are carried
    (name, idx), = prover.asked
    after = (out.match.pos > 1) & out.counted
    assert name == "draft.hidden_out" and set(idx.tolist()) == set(np.nonzero(after)[0].tolist())
    assert (out.carried == after).all()
    assert source_rows(out)[after].all()  # later stages inherit them, failing or not


def test_a_refused_re_run_leaves_the_rows_counted(tmp_path):
    why = "re-run on serving's inputs, the training draft does not reproduce serving's draft.hidden_out rows (3 of 282)"
    comps = _compare(write_pair(tmp_path, flips=EARLY, context_rel=0.08), _Prover(why))
    out = comps["draft.hidden_out"]
    assert out.diverged and out.explanation is None and out.carried is None
    assert "too few to show" in out.stats["context_not_named"] and why in out.stats["context_not_named"]


def test_sources_only_within_a_fail_fraction_are_never_re_run(tmp_path):
    # a dense target: the early aux differences are not named routing near ties, only within the
    # aux stages' fail fraction (5 of 288 rows); a real bug at a few early positions looks the same,
    # and serving's draft consumed it too, so a re-run would reproduce it: it is not asked
    prover = _Prover("must not be asked")
    comps = _compare(write_pair(tmp_path, flips=EARLY[:5], context_rel=0.08, moe=False), prover)
    out = comps["draft.hidden_out"]
    assert not comps["target.aux.1"].diverged and comps["target.aux.1"].explanation is None
    assert prover.asked == [] and out.diverged
    assert "not one a named cause explains" in out.stats["context_not_named"]


# ---- the margin: rows an earlier flip moved do not set it (context.attributed_rows) ----------------
def _hidden_out_use(report) -> float:
    return report.comparisons["draft.hidden_out"].stats["limit_use"]["rel"]


def test_passing_rows_moved_by_an_earlier_flip_do_not_set_the_margin(tmp_path):
    # the later rows of the flipped sequences moved by rel 0.045, under the 0.05 limit (measured on
    # the tiny DeepSeek-V3 chain pair: 0.049 twenty positions after a flip, 0.026 at most before it):
    # the margin is the draft's own noise, the moved rows are reported beside it
    report = diff_traces(*write_pair(tmp_path, flips=FLIPS, context_rel=0.045), narrow=False)
    assert report.first is None, report.verdict()
    stats = report.comparisons["draft.hidden_out"].stats
    assert stats["context_rows"] == (T - 31) + (T - 41)
    assert 0.04 < stats["context_max_rel"] < 0.05  # passing rows, close to the limit
    assert _hidden_out_use(report) < 0.2, stats["limit_use"]
    margin = report.margin()
    assert margin["tensor"] != "draft.hidden_out" or margin["use"] < 0.2, margin
    assert "close to a limit" not in report.verdict()


def test_the_same_move_without_an_earlier_flip_still_sets_the_margin(tmp_path):
    # rel 0.045 in two sequences with no flip before it: the attention's own difference, at 90 % of
    # the limit, and the verdict says how close it came
    report = diff_traces(*write_pair(tmp_path, flips=FLIPS, context_rel=0.045, attn_bug=(3, 4), bug_rel=0.045),
                         narrow=False)
    assert report.first is None, report.verdict()
    assert _hidden_out_use(report) > 0.8
    assert report.margin()["tensor"] == "draft.hidden_out"
    assert "close to a limit: draft.hidden_out" in report.verdict()


def test_with_too_few_rows_before_the_flips_the_moved_rows_set_the_margin(tmp_path):
    # a flip at position 1 of every sequence: nothing shows the attention over agreeing context is
    # any closer than the moved rows, so they count
    report = diff_traces(*write_pair(tmp_path, flips=[(s, 1) for s in range(N_SEQ)], context_rel=0.045),
                         narrow=False)
    assert report.first is None, report.verdict()
    assert _hidden_out_use(report) > 0.8
    assert "context_rows" not in report.comparisons["draft.hidden_out"].stats
