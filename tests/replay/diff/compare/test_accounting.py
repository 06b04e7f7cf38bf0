"""Every serving row compared or accounted for (compare/accounting.py): per tensor and draft depth, serving's
rows are compared (agree / fail / inherited / explained) or left out with the reason the data give, the
counts add up to the rows serving recorded, the report says so, and rows left out never count as agreement.

Each reason has a pair built to produce it: hand-written stores (real ``TraceWriter`` zarr traces) of two
sequences with ``tokens``, ``target.aux.0`` and ``draft.hidden_out`` at three depths, equal up to noise
unless a knob of ``write_pair`` says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specdiff.replay.diff.compare import compare
from specdiff.replay.diff.compare.accounting import COMPARED, REASONS, account, share
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_json, render_text
from specdiff.replay.diff.types import UNREADABLE, serve_side
from specdiff.tracer.store import TraceWriter

H, T, DEPTHS = 8, 12, 3  # hidden width, positions per sequence, draft depths
CONTRACT = {"hidden_size": H, "num_layers": 8, "aux_hf_indices": [1], "dtype": "bfloat16"}
OFF = (2, 5)  # positions of sequence 0 whose depth-1 draft serving fed its own (other) pick
HEAD, OTHER = 7, 6  # a token-format head token; where a continuing sequence leaves training's
EXAMPLE = Path(__file__).resolve().parents[4] / "traces" / "examples" / "seed"


def write_pair(root: Path, *, off_path: bool = False, hide_bug: bool = False, unmatched: bool = False,
               sibling: bool = False, train_gap: bool = False, no_tokens: bool = False, wider: bool = False,
               head: bool = False, continues: bool = False, moved_aux: bool = False,
               serve_tokens_only: bool = False) -> tuple[str, str]:
    """(training path, serving path) under ``root``. Serving's knobs: ``off_path``: its depth-1 token at
    positions ``OFF`` of sequence 0 is its own pick (one more than the true token), so those positions'
    depth 1 and 2 rows are off training's path; ``hide_bug``: its ``draft.hidden_out`` rows there are moved by
    0.3 of their norm (a bug in exactly the rows left out); ``unmatched``: a third sequence, with rows, that
    training lacks; ``sibling``: a second row at (seq 0, pos 2, depth 1) of every draft tensor (a tree
    sibling); ``wider``: ``draft.hidden_out`` one element wider; ``head``: sequence 0 starts with one more
    token (another token format); ``continues``: sequence 0 goes on with other tokens from position
    ``OTHER``; ``moved_aux``: ``target.aux.0`` and ``draft.hidden_out`` moved at every row. Training's:
    ``train_gap``: no ``draft.hidden_out`` row at (seq 0, pos 3, depth 0). Both: ``no_tokens``: no
    ``tokens`` tensor; ``serve_tokens_only``: training records none."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(10, 1000, T + 1 + DEPTHS) for _ in range(2 + unmatched)]
    hidden = [rng.standard_normal((DEPTHS, T, H)).astype(np.float32) for _ in seqs]
    aux = [rng.standard_normal((T, H)).astype(np.float32) for _ in seqs]
    paths = (str(root / "train.trace"), str(root / "serve.trace"))
    for serving, path in enumerate(paths):
        noise = np.random.default_rng(1 + serving)
        with TraceWriter(path, side=("train", "serve")[serving], contract=CONTRACT, overwrite=True) as w:
            for s in range(len(seqs) if serving else 2):
                toks, shift = seqs[s].copy(), 0
                if serving and s == 0 and head:
                    toks, shift = np.r_[HEAD, toks], 1
                if serving and s == 0 and continues:
                    toks[OTHER:] = rng.integers(2000, 3000, len(toks) - OTHER)
                sid = w.add_sequence(toks, prompt_len=2, rid=f"{path}-{s}")
                pos = np.arange(T + shift)
                src = np.maximum(pos - shift, 0)  # the training position each row stands for
                a = aux[s][src] * (1 + 1e-3 * serving * noise.standard_normal((len(pos), H)))
                if serving and moved_aux:
                    a = a + 0.3 * np.abs(a).mean() * noise.standard_normal(a.shape)
                w.append("target.aux.0", a.astype(np.float32), seq=sid, pos=pos)
                for k in range(DEPTHS):
                    p = np.arange(T - k + shift)
                    keep = ~((p == 3) & (k == 0) & train_gap & (not serving) & (s == 0))
                    fed = toks[p + 1 + k].astype(np.int64)
                    h = hidden[s][k, np.maximum(p - shift, 0)] * (1 + 1e-3 * serving * noise.standard_normal((len(p), H)))
                    if serving and s == 0 and off_path and k:
                        off = np.isin(p, OFF)
                        fed[off & (k == 1)] += 1
                        if hide_bug:
                            h[off] += 0.3 * np.linalg.norm(h[off], axis=1, keepdims=True) * noise.standard_normal(
                                h[off].shape) / np.sqrt(H)
                    if serving and moved_aux:
                        h = h + 0.3 * np.abs(h).mean() * noise.standard_normal(h.shape)
                    if serving and wider:
                        h = np.concatenate([h, np.zeros((len(p), 1))], axis=1)
                    rows = {"draft.hidden_out": h.astype(np.float32), **({} if no_tokens or (serve_tokens_only and not serving)
                                                                  else {"tokens": fed})}
                    for name, v in rows.items():
                        at = keep if name == "draft.hidden_out" else slice(None)
                        w.append(name, v[at], seq=sid, pos=p[at], depth=np.full(len(p[at]), k))
                        if serving and sibling and s == 0 and k == 1:
                            w.append(name, v[2:3], seq=sid, pos=p[2:3], depth=np.full(1, k))
    return paths


def accounted(paths: tuple[str, str], **diff_options):
    """(report, its serving accounting) of the pair, diffed with no draft re-run."""
    report = diff_traces(*paths, narrow=False, **diff_options)
    return report, report.serving_rows


def rows_left(acc, reason: str) -> int:
    return sum(d.left_out.get(reason, 0) for ds in acc.tensors.values() for d in ds)


def assert_adds_up(report, acc) -> None:
    """Serving's rows of each tensor and depth are compared or left out, once each; the compared ones are
    the comparison's rows (less the unreadable and never judged), its inherited and explained rows."""
    trace = getattr(report.traces, serve_side(report.traces))
    for name, depths in acc.tensors.items():
        keys = trace.keys(name, columns=("depth",))["depth"]
        assert [d.depth for d in depths] == sorted(set(keys.tolist())), name
        for d in depths:
            assert d.rows == int((keys == d.depth).sum()) == d.compared + d.left, (name, d)
        comp = report.comparisons[name]
        compared = sum(d.compared for d in depths)
        aside = sum(d.left_out.get(r, 0) for d in depths for r in ("unreadable", "not_judged"))
        assert compared + aside == comp.stats["rows"], name
        assert sum(d.explained for d in depths) == comp.stats.get("explained_rows", 0), name
        if comp.kind == "values" and not comp.stats.get("reproduced_by_reexecution"):
            fail = comp.own_fail & (comp.status != UNREADABLE)
            inherited = fail[:0] if comp.inherited is None else comp.inherited & ~fail & (comp.status != UNREADABLE)
            assert (sum(d.fail for d in depths), sum(d.inherited for d in depths)) == (fail.sum(), inherited.sum())
    assert acc.rows == acc.compared + acc.left


def test_a_pair_with_every_row_compared_leaves_nothing_out_and_prints_no_section(tmp_path):
    report, acc = accounted(write_pair(tmp_path))
    assert_adds_up(report, acc)
    assert acc.left == 0 and acc.rows == 2 * (T + 2 * sum(T - k for k in range(DEPTHS)))
    assert report.verdict() == "no divergence: 3 tensors agree within tolerance over 2 sequences"
    text = render_text(report, width=110)
    assert "left out" not in text
    js = json.loads(render_json(report))["serving_rows"]
    assert js["label"] == "serving" and js["left_out"] == 0 and js["compared"] == acc.rows
    assert js["tensors"]["tokens"][1] == {"depth": 1, "rows": 2 * (T - 1), "agree": 2 * (T - 1), "fail": 0,
                                          "inherited": 0, "explained": 0, "left_out": {}}


def test_draft_rows_off_trainings_path_are_left_out_and_the_verdict_names_the_share(tmp_path):
    report, acc = accounted(write_pair(tmp_path, off_path=True, hide_bug=True))
    assert_adds_up(report, acc)
    for name in ("tokens", "draft.hidden_out"):  # the depth-1 pick differs: depth 1 and 2 of those positions
        by_depth = {d.depth: d.left_out for d in acc.tensors[name]}
        assert by_depth == {0: {}, 1: {"off_path": len(OFF)}, 2: {"off_path": len(OFF)}}, name
    assert acc.left == 4 * len(OFF) and not report.diverged  # the moved rows are all off the path
    # the share over every tensor-row (target.aux.0's, all compared, among them) and the lowest place's
    assert report.verdict() == ("no divergence: 3 tensors agree within tolerance over 2 sequences (serving rows "
                                f"compared: {share(acc.compared, acc.rows)}; {share(acc.left, acc.rows)} left out; "
                                "lowest: 90% of tokens, draft.hidden_out at depth 2: see 'serving rows left out')")
    assert share(acc.compared, acc.rows) == "95%"
    section = render_text(report, width=110).split("\n\nserving rows left out", 1)[1].split("\n\n", 1)[0]
    assert section.splitlines()[:3] == [
        f" (never counted as agreement): {acc.left} of {acc.rows} rows (5%)",
        "  depth 1: 2 of 22 (off training's path); depth 2: 2 of 20 (off training's path)",
        "    at tokens, draft.hidden_out"]
    assert " ".join(section.splitlines()[3:]).split() == (
        "off training's path: the draft was fed another token than training feeds, at this depth or an earlier "
        "one of its position").split()
    js = json.loads(render_json(report))["serving_rows"]
    assert js["tensors"]["draft.hidden_out"][2]["left_out"] == {"off_path": 2} and js["left_out"] == acc.left


def test_the_places_rows_were_left_out_are_named_least_compared_first(tmp_path):
    """The outcome verdict's "not compared" (``DiffReport.not_compared_rows``) reads the accounting: each
    depth with rows left out, the tensors left out alike sharing it, least compared share first."""
    report, acc = accounted(write_pair(tmp_path, off_path=True, hide_bug=True, unmatched=True))
    assert [(names, d.depth) for names, d in acc.places()] == [
        (["tokens", "draft.hidden_out"], 2), (["tokens", "draft.hidden_out"], 1),
        (["tokens", "target.aux.0", "draft.hidden_out"], 0)]  # T rows each at depth 0, all unmatched: alike
    assert report.not_compared_rows() == [
        f"tokens, draft.hidden_out at depth 2: {T - 2 + len(OFF)} of {3 * (T - 2)} rows left out: "
        f"unmatched {T - 2}, off training's path {len(OFF)}",
        f"tokens, draft.hidden_out at depth 1: {T - 1 + len(OFF)} of {3 * (T - 1)} rows left out: "
        f"unmatched {T - 1}, off training's path {len(OFF)}",
        f"tokens, target.aux.0, draft.hidden_out at depth 0: {T} of {3 * T} rows left out, unmatched"]


def test_the_outcome_verdict_names_the_depths_left_out(tmp_path):
    """An acceptance gap with no divergence names where serving's rows were left out, by tensor and depth
    (the rows a bug in what later draft steps are fed lives in), not a two-sided coverage per tensor."""
    report, acc = accounted(write_pair(tmp_path, off_path=True, hide_bug=True))

    class Gap:  # compare/outcome.py OutcomeGap's face: one depth beyond chance
        def differing(self):
            return [object()]

        def words(self):
            return "depth 2: serving 0.30, training 0.83"

    report.outcome = Gap()
    assert report.verdict() == (
        "the outcome differs: no tensor diverged, yet serving accepts differently from training at the same steps "
        "(depth 2: serving 0.30, training 0.83); serving rows not compared: tokens, draft.hidden_out at depth 2: 2 "
        "of 20 rows left out, off training's path; tokens, draft.hidden_out at depth 1: 2 of 22 rows left out, off "
        "training's path")
    (tmp_path / "clean").mkdir()
    clean, _ = accounted(write_pair(tmp_path / "clean"))
    clean.outcome = Gap()
    assert clean.verdict().endswith("; every serving row of the 3 compared tensors was compared")


def test_the_off_path_rows_carry_the_bug_the_verdict_cannot_see(tmp_path, monkeypatch):
    """The test of the test above: its left-out rows are where serving's bug is, so counting them as agreement
    would hide it. Compared anyway (the depth filter switched off), draft.hidden_out diverges on them."""
    paths = write_pair(tmp_path, off_path=True, hide_bug=True)
    monkeypatch.setattr(compare, "_filter_depth", lambda m, good: m)
    report, acc = accounted(paths)
    assert acc.left == 0 and report.comparisons["draft.hidden_out"].stats["own_fail_rows"] == 2 * len(OFF)
    assert report.comparisons["draft.hidden_out"].diverged


@pytest.mark.parametrize("knob, reason, rows", [
    ("unmatched", "unmatched", {"tokens": 3 * T - 3, "target.aux.0": T, "draft.hidden_out": 3 * T - 3}),
    ("sibling", "repeated", {"tokens": 1, "draft.hidden_out": 1}),
    ("train_gap", "no_partner", {"draft.hidden_out": 1}),
    ("no_tokens", "unchecked_path", {"draft.hidden_out": 2 * (2 * T - 3)}),
    ("wider", "structure", {"draft.hidden_out": 2 * (3 * T - 3)}),
    ("head", "before_run", {"tokens": DEPTHS, "target.aux.0": 1, "draft.hidden_out": DEPTHS}),
])
def test_each_reason_comes_from_a_pair_built_to_produce_it(tmp_path, knob, reason, rows):
    report, acc = accounted(write_pair(tmp_path, **{knob: True}))
    assert_adds_up(report, acc)
    got = {n: sum(d.left_out.get(reason, 0) for d in ds) for n, ds in acc.tensors.items()}
    assert {n: c for n, c in got.items() if c} == rows
    assert acc.left == sum(rows.values())  # no other reason: the pair differs only there
    assert f"  {acc.label_of(reason)}: {acc.words(reason)}" in render_text(report, width=200)


def test_a_sequence_that_goes_on_otherwise_leaves_its_tail_out(tmp_path):
    report, acc = accounted(write_pair(tmp_path, continues=True))
    assert_adds_up(report, acc)
    tail = {n: sum(d.left_out.get("past_run", 0) for d in ds) for n, ds in acc.tensors.items()}
    assert tail == {"tokens": sum(T - k - OTHER for k in range(DEPTHS)), "target.aux.0": T - OTHER,
                    "draft.hidden_out": sum(T - k - OTHER for k in range(DEPTHS))}
    # the depth-0 token at OTHER - 1 is the first other token: compared, never judged
    assert {d.depth: d.left_out.get("not_judged", 0) for d in acc.tensors["tokens"]} == {0: 1, 1: 0, 2: 0}


def test_a_damaged_chunk_is_left_out_as_unreadable(tmp_path):
    paths = write_pair(tmp_path)
    chunk = Path(paths[1]) / "tensors" / "draft.hidden_out" / "data" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:10])
    report, acc = accounted(paths)
    assert_adds_up(report, acc)
    assert rows_left(acc, "unreadable") == report.comparisons["draft.hidden_out"].stats["unreadable_rows"] > 0
    assert sum(d.agree for d in acc.tensors["draft.hidden_out"]) == 0  # never agreement


@pytest.mark.parametrize("head", [False, True])
def test_tokens_on_one_side_only_check_no_path(tmp_path, head):
    """Training recorded no tokens: no depth >= 1 row was checked against a token path, so none is "off
    training's path" (with token formats compare_all still lists a tokens comparison, with no row)."""
    report, acc = accounted(write_pair(tmp_path, serve_tokens_only=True, head=head))
    assert rows_left(acc, "off_path") == 0
    assert rows_left(acc, "unchecked_path") > 0


@pytest.mark.parametrize("key", ["depth", "seq"])
def test_a_damaged_key_chunk_is_unreadable_rows_not_a_crash_or_another_depth(tmp_path, key):
    """A key column read from a damaged chunk is -1 (tracer/store/reader.py): those rows are unreadable,
    counted at depth 0, and the report still renders (a -1 depth made np.bincount raise)."""
    paths = write_pair(tmp_path)
    chunk = Path(paths[1]) / "tensors" / "draft.hidden_out" / key / "c" / "0"
    chunk.write_bytes(chunk.read_bytes()[:10])
    report, acc = accounted(paths)
    depths = [d.depth for d in acc.tensors["draft.hidden_out"]]
    assert max(depths) < DEPTHS, depths  # no row at depth 255 (-1's low byte)
    unreadable = sum(d.left_out.get("unreadable", 0) for d in acc.tensors["draft.hidden_out"])
    assert unreadable > 0 and sum(d.agree for d in acc.tensors["draft.hidden_out"]) == 0
    assert json.loads(render_json(report))["serving_rows"]["rows"] == acc.rows and render_text(report)


def test_rows_whose_inputs_differ_upstream_are_inherited_not_agreement(tmp_path):
    report, acc = accounted(write_pair(tmp_path, moved_aux=True),
                            overrides={"target.aux.0": {"max_fail_frac": 1.0}})
    assert_adds_up(report, acc)
    comp = report.comparisons["draft.hidden_out"]
    assert sum(d.inherited for d in acc.tensors["draft.hidden_out"]) == comp.stats["inherited_rows"] == comp.stats["rows"]
    assert sum(d.agree + d.fail for d in acc.tensors["draft.hidden_out"]) == 0


def test_failing_rows_reexecution_reproduced_are_inherited(tmp_path, monkeypatch):
    """rerun/reexec.py moves past a stage the draft re-run on serving's inputs reproduces, per tensor: its
    failing rows are then inherited from serving's inputs, never agreement and no longer a failure."""
    paths = write_pair(tmp_path, off_path=True, hide_bug=True)
    monkeypatch.setattr(compare, "_filter_depth", lambda m, good: m)
    report = diff_traces(*paths, narrow=False)
    before = {d.depth: (d.fail, d.inherited) for d in report.serving_rows.tensors["draft.hidden_out"]}
    report.comparisons["draft.hidden_out"].stats["reproduced_by_reexecution"] = True
    after = account(report.traces, report.alignment, report.comparisons, side="y", labels=report.labels)
    assert {d.depth: (d.fail, d.inherited) for d in after.tensors["draft.hidden_out"]} == \
        {d: (0, f + i) for d, (f, i) in before.items()}
    assert sum(f for f, _ in before.values()) == 2 * len(OFF)


def test_account_counts_the_other_side_when_the_first_is_serving(tmp_path):
    """Serving is side A here: its rows are the ones accounted for, under their own label."""
    train, serve = write_pair(tmp_path, off_path=True)
    report, acc = accounted((serve, train))
    assert serve_side(report.traces) == "x" and acc.label == "serving" and acc.other == "training"
    assert acc.left == 4 * len(OFF) and rows_left(acc, "off_path") == acc.left
    assert_adds_up(report, acc)


def test_every_reason_has_words_and_a_short_label():
    assert set(COMPARED).isdisjoint(REASONS)
    assert all(len(v) == 2 and v[0] and v[1] for v in REASONS.values())
    assert share(1, 1000) == "<1%" and share(999, 1000) == ">99%" and share(0, 5) == "0%" and share(5, 5) == "100%"


@pytest.mark.skipif(not (EXAMPLE / "serve.trace").exists(), reason="the shipped example pair is absent")
def test_the_shipped_pairs_serving_rows_add_up():
    report, acc = accounted((str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace")))
    assert_adds_up(report, acc)
    assert acc.reasons() == ["off_path"] and acc.left == 450 and acc.rows == 7635
    assert account(report.traces, report.alignment, {}, side="y", labels=report.labels).rows == 0
