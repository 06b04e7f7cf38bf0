"""Failures judged where they concentrate, and named causes for positions and the draft's KV history
on real pairs of zarr stores written with ``TraceWriter``.

Each pair carries one EAGLE-3 draft as serving records it: depth-0 rows at every position, deeper
rows (depths 1-2) only at the positions a round drafted from (every ``DRAFT_EVERY``-th), the prompt's
rows in the prefill (iter -1), the rest in decode iterations of ``ROUND`` positions (iter >= 0).
Serving equals training up to bf16-sized noise (rel ~2e-3), then one kind of bug is written in.
Every diff here also runs the autouse early == full check (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import TracePair
from builders import moved as _off

from specdiff.replay.diff.compare import blocks
from specdiff.replay.diff.judge.groups import GROUP_ALPHA, hypergeom_tail
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text

H, N_SEQ, T, PROMPT, ROUND, DRAFT_EVERY, DEPTHS = 16, 8, 100, 60, 4, 6, 3


def _iter(t: int) -> int:
    return -1 if t < PROMPT else (t - PROMPT) // ROUND


def write_pair(root, *, bad_out=(), pos_shift: int = 0, bad_rel=(0.11, 0.19), serve_contract=None,
               skip_serve_prefix: dict | None = None, depth2_noise: float = 2e-3,
               pos_drift: int = 0) -> tuple[str, str]:
    """Training and serving traces (module doc). ``bad_out``: (seq, pos, depth) rows whose serving
    ``draft.hidden_out`` is off by a rel in ``bad_rel`` (attention input unchanged); ``pos_shift``:
    serving's ``draft.positions`` at depth >= 1 are training's + this; ``skip_serve_prefix``: seq ->
    cached prefix length p (serving records no row of that sequence before p, as a radix-cache hit);
    ``depth2_noise``: serving's relative noise on depth-2 ``draft.hidden_out`` rows; ``pos_drift``:
    serving's ``draft.positions`` at depth k are training's + k x this."""
    pair = TracePair(root, contract={"hidden_size": H, "dtype": "bfloat16"}, serve=serve_contract)
    rng = pair.rng
    bad = {tuple(b) for b in bad_out}
    skip = skip_serve_prefix or {}
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, T + 1 + DEPTHS)
        attn = rng.standard_normal((DEPTHS, T, 2 * H)).astype(np.float32)
        out = rng.standard_normal((DEPTHS, T, H)).astype(np.float32)
        for w in pair.sides(s, toks, prompt_len=PROMPT):
            noise, side = w.noise, w.index
            first = skip.get(s, 0) if side else 0
            for k in range(DEPTHS):
                ts = [t for t in range(first, T) if (k == 0 or t % DRAFT_EVERY == 0) and t + 1 + k < T + DEPTHS]
                p = np.array(ts, np.int64)
                it = np.array([_iter(t) for t in ts], np.int64)
                a = attn[k, p] * (1 + 2e-3 * side * noise.standard_normal((len(p), 2 * H)))
                o = out[k, p] * (1 + (depth2_noise if k == 2 else 2e-3) * side * noise.standard_normal((len(p), H)))
                for r, t in enumerate(ts):
                    if side and (s, t, k) in bad:
                        o[r] = _off(o[r], noise, noise.uniform(*bad_rel))
                positions = p + k + (pos_shift if side and k >= 1 else 0) + (pos_drift * k if side else 0)
                w.append("tokens", toks[1 + k + p].astype(np.int64), pos=p, depth=k, iter=it)
                w.append("draft.positions", positions, pos=p, depth=k, iter=it)
                w.append("draft.attn_in", a.astype(np.float32), pos=p, depth=k, iter=it)
                w.append("draft.hidden_out", o.astype(np.float32), pos=p, depth=k, iter=it)
    return pair.close()


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """64-row blocks: the early watch sees many blocks of each tensor."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 64 * 4 * 2 * H)


def _depth2_rows() -> list[tuple[int, int, int]]:
    return [(s, t, 2) for s in range(N_SEQ) for t in range(0, T, DRAFT_EVERY) if t + 3 < T + DEPTHS]


def test_draft_positions_one_ahead_at_every_deeper_depth_are_named_per_depth(tmp_path):
    a, b = write_pair(tmp_path, pos_shift=1)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.positions" and report.first.first_where["depth"] == 1
    causes = [e.cause for e in report.explanations]
    assert causes[0] == "position_offset_depth", causes
    e = report.explanations[0]
    assert "depth >= 1" in e.message and "+1" in e.message and "advanced before each draft step" in e.message
    assert any(line.startswith("depth 0: 100.0%") and line.endswith("+0") for line in e.evidence)
    assert any(line.startswith("depth 1: 100.0%") and line.endswith("+1") for line in e.evidence)


def test_draft_positions_that_drift_with_the_depth_are_named_as_a_drift(tmp_path):
    report = diff_traces(*write_pair(tmp_path, pos_drift=1), narrow=False)
    assert report.first.name == "draft.positions" and report.first.first_where["depth"] == 1
    assert report.explanations[0].cause == "position_offset_depth"
    assert "drift by +1 per draft depth" in report.explanations[0].message


def test_four_depth2_rows_far_above_the_noise_are_a_divergence_and_the_group_named(tmp_path):
    rows = _depth2_rows()
    bad = [rows[i] for i in (9, 31, 57, 88)]  # 4 of ~130 depth-2 rows, spread over sequences
    a, b = write_pair(tmp_path, bad_out=bad)
    report = diff_traces(a, b, narrow=False)
    out = report.comparisons["draft.hidden_out"]
    frac = out.stats["own_fail_rows"] / out.stats["counted_rows"]
    assert out.stats["own_fail_rows"] == 4 and frac < 0.005 < out.tolerance.max_fail_frac  # 0.4 %: under 2 %
    assert report.first is not None and report.first.name == "draft.hidden_out", report.verdict()
    c = report.first.concentration
    assert c.fired and c.group == "depth 2" and c.fail_rows == 4 and c.p <= GROUP_ALPHA
    assert report.first.first_where["depth"] == 2
    assert min(bad, key=lambda r: (r[1], r[0]))[:2] == (report.first.first_where["pair"], report.first.first_where["pos"])
    assert [e.cause for e in report.explanations] == ["concentrated_rows"]
    assert "only on depth 2" in report.explanations[0].message
    assert "concentrated_rows" in render_text(report)


def test_the_same_failures_in_a_tree_name_the_re_ranked_nodes_kv(tmp_path):
    rows = _depth2_rows()
    a, b = write_pair(tmp_path, bad_out=[rows[i] for i in (9, 31, 57, 88)], serve_contract={"spec_topk": 2})
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.hidden_out"
    assert [e.cause for e in report.explanations] == ["tree_rerank_kv"]
    assert "another branch's column" in report.explanations[0].message


def test_the_same_number_of_failures_spread_evenly_is_no_divergence(tmp_path):
    # the same 4 rows' worth of failures at the same rel, one per depth-0 decode row of 4 sequences
    # and depth 1: no structural group holds them
    bad = [(0, 62, 0), (3, 77, 0), (5, 12, 1), (6, 95, 0)]
    a, b = write_pair(tmp_path, bad_out=bad)
    report = diff_traces(a, b, narrow=False)
    assert report.first is None, report.verdict()
    c = report.comparisons["draft.hidden_out"].concentration
    assert c is None or (not c.fired and c.p > GROUP_ALPHA)  # the margin: chance, not a pattern


def test_a_noisier_depth_with_a_few_rows_just_over_the_tolerance_is_no_divergence(tmp_path):
    # depth 2 compounds rounding: its rows sit at rel ~0.03, and 5 of them just over 0.05 (3.7 % of
    # depth 2, 0.5 % of all rows): concentrated, but not far beyond that depth's own noise
    rows = _depth2_rows()
    a, b = write_pair(tmp_path, bad_out=[rows[i] for i in (3, 20, 41, 66, 90)], bad_rel=(0.055, 0.07),
                      depth2_noise=0.03)
    report = diff_traces(a, b, narrow=False)
    assert report.first is None, report.verdict()
    c = report.comparisons["draft.hidden_out"].concentration
    assert c.group == "depth 2" and c.p <= GROUP_ALPHA and not c.fired
    assert c.margin()["far"] < 2


def test_failures_only_after_a_round_boundary_with_attn_in_equal_are_stale_draft_kv(tmp_path):
    bad = [(s, t, 0) for s in range(N_SEQ) for t in range(PROMPT + ROUND, T)]  # every decode row after round 0
    a, b = write_pair(tmp_path, bad_out=bad, bad_rel=(0.1, 0.3))
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.hidden_out"
    assert not report.comparisons["draft.attn_in"].diverged
    assert report.first.first_where == {"pair": 0, "pos": PROMPT + ROUND, "depth": 0}
    causes = [e.cause for e in report.explanations]
    assert causes == ["stale_draft_kv"], causes
    e = report.explanations[0]
    assert "only after a round boundary" in e.message and "draft.attn_in agrees" in e.message
    assert any("counted rows before iteration 1" in line for line in e.evidence)


def test_failures_only_on_cache_hit_requests_name_the_missing_prefix_kv(tmp_path):
    cached = {2: 40, 5: 40}  # requests 2 and 5 hit the radix cache for their first 40 positions
    bad = [(s, t, 0) for s in cached for t in range(40, T)]
    a, b = write_pair(tmp_path, bad_out=bad, skip_serve_prefix=cached)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.hidden_out"
    assert report.first.first_where == {"pair": 2, "pos": 40, "depth": 0}
    assert [e.cause for e in report.explanations] == ["cached_prefix_draft_kv"]
    e = report.explanations[0]
    assert "seq 2 (cached prefix 40, first failing pos 40)" in e.evidence[0]


def test_the_group_rule_is_a_chance_bound_not_a_fraction():
    # 4 of 4 failures in a group of 128 of 1064 rows: unlikely by chance; 3 of 4 in a group of 500: likely
    assert hypergeom_tail(4, 1064, 4, 128) < 3e-4
    assert hypergeom_tail(3, 1064, 4, 500) > 0.1
    assert hypergeom_tail(5, 100, 4, 50) == 0.0


def test_a_control_reports_how_close_its_most_concentrated_group_came(tmp_path):
    rows = _depth2_rows()
    a, b = write_pair(tmp_path, bad_out=[rows[i] for i in (3, 20, 41, 66, 90)], bad_rel=(0.055, 0.07),
                      depth2_noise=0.03)
    report = diff_traces(a, b, narrow=False)
    g = report.group_margin()
    assert report.first is None and g.tensor == "draft.hidden_out" and g.group == "depth 2"
    assert g.fail_rows >= 5 and not g.fired
    assert f"margin: most concentrated failures: draft.hidden_out on depth 2: {g.fail_rows} of {g.rows} rows" \
        in render_text(report)
