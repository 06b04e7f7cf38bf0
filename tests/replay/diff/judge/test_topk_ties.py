"""Top-k boundary near-ties (replay/diff/judge/topk_ties.py) on real pairs of zarr stores.

A random draft's logits are nearly flat, so its k-th and (k+1)-th logits tie in bf16 and each
engine keeps another id at rank k. Those rows are named a legitimate difference; a swap whose
logits are further apart than a tie — at any rank — stays a divergence.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.tracer.store import TraceWriter

N_SEQ, T, V, K, TOPK = 4, 40, 64, 8, 2


def _write(root, *, swap_rows=(), swap_gap: float = 0.0, swap_rank: int = K, topk_swaps=(),
           noise: float = 0.0, siblings: bool = False) -> tuple[str, str]:
    """Training and serving traces of the draft's top-k (K logits, TOPK speculative ids, the mapped
    ids). ``swap_rows``: (seq, pos) where serving holds the (K+1)-th id instead of the id at
    ``swap_rank`` (its logit ``swap_gap`` below serving's K-th logit); ``topk_swaps``: the same
    for ``draft.topk`` at rank TOPK (its ids tie); ``noise``: on swapped rows serving's logits of
    the ids both sides hold move by +-noise (inputs that differ within tolerance); ``siblings``:
    serving then records a second row at every key, ids and logits of another branch, as SGLang's
    tree records the branches of one depth (the first row recorded is the one compared)."""
    rng = np.random.default_rng(0)
    paths = (str(root / "train.trace"), str(root / "serve.trace"))
    base = {"hidden_size": 8, "dtype": "bfloat16"}
    ws = [TraceWriter(p, side=s, contract=base, overwrite=True) for p, s in zip(paths, ("train", "serve"))]
    swaps, tswaps = set(swap_rows), set(topk_swaps)
    d2t = np.arange(V, dtype=np.int64) * 3  # target id = 4 i
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, T + 2)
        logits = np.sort(rng.standard_normal((T, V)).astype(np.float32) * 4, axis=1)[:, ::-1]
        order = np.stack([rng.permutation(V) for _ in range(T)])
        for side, w in enumerate(ws):
            sid = w.add_sequence(toks, prompt_len=10, rid=f"{w.side}-{s}")
            ids, vals = order[:, :K].copy(), logits[:, :K].copy()
            tk = order[:, :TOPK].copy()
            for t in range(T):
                if side and (s, t) in swaps:
                    keep = np.delete(np.arange(K), swap_rank - 1)
                    ids[t] = np.r_[order[t, keep], order[t, K]]
                    vals[t] = np.r_[logits[t, keep] + noise * (-1.0) ** np.arange(K - 1), logits[t, K - 1] - swap_gap]
                if (s, t) in tswaps:  # ranks TOPK and TOPK + 1 tie on both sides; serving keeps the latter
                    vals[t, TOPK] = vals[t, TOPK - 1]
                    if side:
                        tk[t, TOPK - 1] = order[t, TOPK]
                        ids[t, [TOPK - 1, TOPK]] = order[t, [TOPK, TOPK - 1]]
            p = np.arange(T, dtype=np.int64)
            kw = dict(seq=sid, pos=p, depth=np.zeros(T, np.int64), iter=np.full(T, -1, np.int64))
            w.append("tokens", toks[1:T + 1].astype(np.int64), **kw)
            w.append("draft.logits_topk.values", vals, **kw)
            w.append("draft.logits_topk.ids", ids.astype(np.int64), **kw)
            w.append("draft.topk", tk.astype(np.int64), **kw)
            w.append("draft.topk_target", (tk + d2t[tk]).astype(np.int64), **kw)
            if side and siblings:
                other = np.stack([rng.permutation(V)[:K] for _ in range(T)])
                w.append("draft.logits_topk.values", logits[:, :K] - 0.5, **kw)
                w.append("draft.logits_topk.ids", other.astype(np.int64), **kw)
    for w in ws:
        w.close()
    return paths


def _rows(n: int) -> list[tuple[int, int]]:
    return [(s, t) for s in range(N_SEQ) for t in range(3, T, 4)][:n]


def test_swaps_at_rank_k_on_a_bf16_tie_are_named_not_a_divergence(tmp_path):
    a, b = _write(tmp_path, swap_rows=_rows(12), swap_gap=0.0)
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["draft.logits_topk.ids"]
    assert comp.stats["fail_rows"] == 12 and not comp.diverged
    assert r.first is None
    named = [e for e in r.legitimate if e.cause == "topk_boundary_near_tie"]
    assert [e.tensor for e in named] == ["draft.logits_topk.ids"] and len(named[0].rows) == 12
    assert {row["rank"] for row in named[0].rows} == {K}
    assert "top-k boundary near-ties: 12 draft.logits_topk.ids row(s)" in render_text(r)


def test_tree_siblings_at_one_key_do_not_hide_the_compared_rows_logits(tmp_path):
    """Seed 1's DeepSeek-V3 top-2 tree pair: the judge read a later sibling's logits at a key the
    diff compares at its first row, found a swapped id "not among its side's top-k logits" and named
    no row, so 32 near-tie rows made draft.logits_topk.ids the first divergence."""
    a, b = _write(tmp_path, swap_rows=_rows(12), swap_gap=0.0, siblings=True)
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["draft.logits_topk.ids"]
    assert comp.stats["fail_rows"] == 12 and "ties_not_named" not in comp.stats
    assert r.first is None


def test_swaps_further_apart_than_a_tie_stay_a_divergence(tmp_path):
    a, b = _write(tmp_path, swap_rows=_rows(12), swap_gap=1.5)
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["draft.logits_topk.ids"]
    assert comp.diverged and r.first.name == "draft.logits_topk.ids"
    assert "more than a bfloat16 near tie" in comp.stats["ties_not_named"]


def test_a_swap_above_the_last_rank_is_no_tie_at_the_boundary(tmp_path):
    # the id swapped out sat at rank 3: its logit is far above the other side's k-th
    a, b = _write(tmp_path, swap_rows=_rows(12), swap_gap=0.0, swap_rank=3)
    r = diff_traces(a, b, narrow=False)
    assert r.comparisons["draft.logits_topk.ids"].diverged
    assert "ties_not_named" in r.comparisons["draft.logits_topk.ids"].stats


def test_speculative_topk_ties_are_named_and_the_mapped_ids_inherit_them(tmp_path):
    a, b = _write(tmp_path, topk_swaps=_rows(10))
    r = diff_traces(a, b, narrow=False)
    assert r.first is None, render_text(r)
    named = {e.tensor: e for e in r.legitimate if e.cause == "topk_boundary_near_tie"}
    assert len(named["draft.topk"].rows) == 10 and {row["rank"] for row in named["draft.topk"].rows} == {TOPK}
    # the mapped ids differ on the same rows, carried over from draft.topk, not named twice
    assert r.comparisons["draft.topk_target"].stats["inherited_from"] == {"draft.topk": 10}


def test_swaps_within_the_rows_measured_logit_disagreement_are_named(tmp_path):
    # the correct DeepSeek-V3 pair (recorded by the family test): the draft's inputs differ within tolerance (routing
    # near-ties carried by attention), the logits of ids both sides hold differ by up to ~0.07 and
    # an id 0.0625 from the k-th logit swaps in: more than a bf16 tie, within the row's own noise
    a, b = _write(tmp_path, swap_rows=_rows(12), swap_gap=0.06, noise=0.08)
    r = diff_traces(a, b, narrow=False)
    assert r.first is None, render_text(r)
    named = [e for e in r.legitimate if e.cause == "topk_boundary_near_tie"]
    assert len(named[0].rows) == 12 and all(row["noise"] >= 0.08 - 1e-6 for row in named[0].rows)


def test_swaps_beyond_the_rows_measured_logit_disagreement_stay_a_divergence(tmp_path):
    a, b = _write(tmp_path, swap_rows=_rows(12), swap_gap=0.4, noise=0.08)
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["draft.logits_topk.ids"]
    assert comp.diverged and "measured logit disagreement" in comp.stats["ties_not_named"]


def _write_target(root, *, flip_rows=(), flip_gap: float = 0.0, logits: bool = True,
                  far_rows=(), disjoint: bool = False, serve_k: int = K) -> tuple[str, str]:
    """Training and serving traces of the target's greedy token and top-K logits. ``flip_rows``:
    (seq, pos) where serving's greedy token is training's runner-up, whose logit sits ``flip_gap``
    below training's top logit on training's side; serving's own logits there rank it first (the
    two swapped by one bf16 step). ``logits``: False records no ``target.logits_topk`` (traces
    recorded before it): the greedy tokens are then judged by their rows alone; ``far_rows``: more
    flips, 0.8 apart on training's side (no tie); ``disjoint``: on flipped rows serving's top-K ids
    are all other ids than training's (its logits the same numbers); ``serve_k``: serving keeps only
    its ``serve_k`` best logits (a server's own SPECDIFF_LOGITS_TOPK)."""
    rng = np.random.default_rng(1)
    paths = (str(root / "t-train.trace"), str(root / "t-serve.trace"))
    base = {"hidden_size": 8, "dtype": "bfloat16"}
    ws = [TraceWriter(p, side=s, contract=base, overwrite=True) for p, s in zip(paths, ("train", "serve"))]
    gaps = {**{r: flip_gap for r in flip_rows}, **{r: 0.8 for r in far_rows}}
    flips = set(gaps)
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, T + 2)
        # descending logits about 1.0-3.0, ids a permutation of a 1000-token vocab
        vals = np.sort(rng.uniform(1.0, 3.0, (T, K)).astype(np.float32), axis=1)[:, ::-1].copy()
        ids = np.stack([rng.permutation(1000)[:K] for _ in range(T)])
        for t in range(T):
            if (s, t) in flips:
                vals[t, 1] = vals[t, 0] - gaps[(s, t)]
        for side, w in enumerate(ws):
            sid = w.add_sequence(toks, prompt_len=10, rid=f"{w.side}-{s}")
            v, i = vals.copy(), ids.copy()
            for t in range(T):
                if side and (s, t) in flips and disjoint:  # another target: none of training's ids
                    i[t] = (ids[t] + 1000) % 2000 + 1000
                elif side and (s, t) in flips:  # serving ranks the runner-up first, one bf16 step above
                    v[t, :2] = [vals[t, 0], vals[t, 0] - 2.0 ** -7]
                    i[t, :2] = ids[t, [1, 0]]
            kw = dict(seq=sid, pos=np.arange(T, dtype=np.int64), depth=np.zeros(T, np.int64),
                      iter=np.full(T, -1, np.int64))
            w.append("tokens", toks[1:T + 1].astype(np.int64), **kw)
            w.append("target.argmax", i[:, 0].astype(np.int64), **kw)
            if logits:
                keep = serve_k if side else K
                w.append("target.logits_topk.values", v[:, :keep].copy(), **kw)
                w.append("target.logits_topk.ids", i[:, :keep].astype(np.int64), **kw)
    for w in ws:
        w.close()
    return paths


def test_target_greedy_flips_at_a_near_tie_of_its_own_logits_are_named(tmp_path):
    """Seed 2's DeepSeek-V3 and GPT-OSS pairs: a random target's greedy token flips where its own two
    best logits tie (14-19 of ~180 rows); with both sides' top-k logits each flip is a near tie."""
    a, b = _write_target(tmp_path, flip_rows=_rows(12), flip_gap=2.0 ** -7)
    r = diff_traces(a, b, narrow=False)
    assert r.comparisons["target.argmax"].stats["fail_rows"] == 12
    assert r.first is None, render_text(r)
    named = {e.tensor: e for e in r.legitimate if e.cause == "target_greedy_near_tie"}
    assert set(named) == {"target.argmax"} and len(named["target.argmax"].rows) == 12
    assert "target greedy near-ties: 12 target.argmax row(s)" in render_text(r)


def test_target_greedy_flips_far_from_a_tie_stay_a_divergence(tmp_path):
    a, b = _write_target(tmp_path, flip_rows=_rows(12), flip_gap=0.8)
    r = diff_traces(a, b, narrow=False)
    assert r.first is not None and r.first.name == "target.argmax"
    assert r.comparisons["target.argmax"].diverged
    assert not any(e.cause == "target_greedy_near_tie" for e in r.legitimate)


def test_traces_without_the_target_logits_judge_greedy_flips_by_rows_as_before(tmp_path):
    a, b = _write_target(tmp_path, flip_rows=_rows(12), flip_gap=2.0 ** -7, logits=False)
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["target.argmax"]
    assert comp.diverged and "ties_not_named" not in comp.stats


def test_only_the_greedy_flips_at_a_tie_are_named_the_others_still_count(tmp_path):
    """The target's greedy token is judged row by row: after an MoE router flip its context differs
    and a few flips are further than a tie (seed 2's DeepSeek-V3 pair, seq 1 pos 69: 0.094 against a
    0.057 band). Those count against the tolerance (4 of 160 rows: 2.5 % < 5 %); the ties are named."""
    a, b = _write_target(tmp_path, flip_rows=_rows(12), flip_gap=2.0 ** -7, far_rows=_rows(16)[12:])
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["target.argmax"]
    named = [e for e in r.legitimate if e.cause == "target_greedy_near_tie"]
    assert len(named) == 1 and len(named[0].rows) == 12 and named[0].partial
    assert int(comp.explained.sum()) == 12 and comp.stats["own_fail_rows"] == 4 and not comp.diverged
    assert r.first is None


def test_greedy_tokens_each_side_ranks_far_below_its_own_are_no_tie(tmp_path):
    """Review of the tie rule: equal maxima are not a tie. Serving's greedy token is not among
    training's 8 best logits (nor training's among serving's): each side ranks the other's token
    below 7 others, so the flip is a different target, whatever the two maxima."""
    a, b = _write_target(tmp_path, flip_rows=_rows(12), flip_gap=2.0 ** -7, disjoint=True)
    r = diff_traces(a, b, narrow=False)
    comp = r.comparisons["target.argmax"]
    assert comp.diverged and not any(e.cause == "target_greedy_near_tie" for e in r.legitimate)
    assert "not among its 8 top logits" in comp.stats["ties_not_named"]


def test_another_k_of_target_logits_on_serving_is_no_structure_difference(tmp_path):
    """The target's top-k logits are evidence: a server recording 4 of them (SPECDIFF_LOGITS_TOPK=4)
    against record train's 8 is no layout divergence, and its greedy ties are still judged."""
    a, b = _write_target(tmp_path, flip_rows=_rows(12), flip_gap=2.0 ** -7, serve_k=4)
    r = diff_traces(a, b, narrow=False)
    assert r.first is None, render_text(r)
    assert len([e for e in r.legitimate if e.cause == "target_greedy_near_tie"][0].rows) == 12
