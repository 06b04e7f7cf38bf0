"""The diff engine on small hand-built traces: alignment, metrics, tolerance edges, NaN/Inf,
empty and non-overlapping traces, first divergence and the explanations.

Scenario tests on traces recorded by the real recorders live in tests/server/test_scenarios.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from specdiff.replay.diff.align.align import AlignmentError, align_sequences
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.measure.tolerance import ToleranceError, default_tolerance, parse_overrides
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.diff.types import Pair
from specdiff.tracer.store import TraceWriter, open_trace


def test_identical_pair_has_no_divergence_and_exit_0(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], order=[1, 0], noise=2e-4)  # other row order
    report = diff_traces(a, b)
    assert report.first is None, report.verdict()
    assert report.verdict().startswith("no divergence")
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["diverged"] is False


def test_seed_layer_shift_is_first_divergence_with_slot_mapping(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 6, 7])
    report = diff_traces(a, b)
    assert report.first.name == "target.aux.0"
    i = report.first.first_failing_row
    assert int(report.first.match.pos[i]) == 0
    cause = report.explanations[0]
    assert cause.cause == "aux_layer_shift"
    assert "serving slot 0 = training HF hidden_states[3]" in cause.message
    assert "training slot 0 is the embedding output" in cause.message
    assert "[-1, 2, 5] (SGLang convention for HF [0, 3, 6]" in cause.fix
    assert "rule assumed: plus-one" in cause.fix  # these traces name no target architecture
    (aux,) = [m for m in report.contract if m.field == "aux_hf_indices"]
    assert (list(aux.x), list(aux.y)) == ([0, 3, 6], [3, 6, 7])
    text = render_text(report)
    assert text.split("\n\n", 1)[0].startswith("first divergence: target.aux.0 at seq 0 pos 0 — serving slot 0")
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "text"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "aux_layer_shift" in proc.stdout


def test_all_slots_off_by_one_names_the_convention(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[2, 4, 5], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 5, 6])
    report = diff_traces(a, b)
    assert report.first.name == "target.aux.0"
    assert "every layer off by one" in report.explanations[0].message


@pytest.mark.parametrize("probes", [False, True], ids=["slots-only", "with-probes"])
def test_aux_slots_in_another_concat_order_are_a_permutation(tmp_path, probes, aux_traces):
    """Training kept the order the user gave (HF [6, 0, 3]); SGLang concatenates ascending."""
    a = aux_traces.write(tmp_path / "a", side="train", hf=[6, 0, 3], probes=probes)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6])
    report = diff_traces(a, b)
    assert report.first.name == "target.aux.0"
    cause = report.explanations[0]
    assert [e.cause for e in report.explanations] == ["aux_slot_permutation"]
    assert ("serving slot 0 = training slot 1, serving slot 1 = training slot 2, serving slot 2 = training slot 0"
            in cause.message)
    assert "training concatenates HF [6, 0, 3]; serving concatenates HF [0, 3, 6]" in cause.message
    assert cause.matrix["rows"] == ["serving slot 0", "serving slot 1", "serving slot 2"]


def test_a_layer_shift_is_not_called_a_permutation(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 6, 7])  # slot 0 = training slot 1, but 7 is new
    assert [e.cause for e in diff_traces(a, b).explanations] == ["aux_layer_shift"]


def test_other_values_in_the_right_layers_are_not_called_a_layer_shift(tmp_path, aux_traces):
    """Slot 0 matches its own layer, slots 1-2 match no layer (another target): not a layer mix-up."""
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], noise=[0, 0.5, 0.5])
    report = diff_traces(a, b)
    assert report.first.name == "target.aux.1"
    assert report.explanations == []


def test_depth_rows_off_the_teacher_path_are_not_compared(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], guess_wrong_at=(1, 4))
    report = diff_traces(a, b)
    assert report.first is None, report.verdict()
    topk = report.comparisons["draft.topk"]
    assert topk.stats["rows"] == 36 - 4 and topk.stats["coverage"] < 1  # 2 positions x 2 sequences dropped
    assert not ((topk.match.depth == 1) & np.isin(topk.match.pos, [1, 4])).any()


def test_d2t_direct_ids_is_first_divergence_at_mapped_ids(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    direct = aux_traces.D2T + np.arange(aux_traces.VD)  # saved as target ids, served as offsets
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=direct)
    report = diff_traces(a, b)
    assert report.first.name == "draft.topk_target"
    assert [e.cause for e in report.explanations] == ["d2t_direct_ids"]


def test_missing_d2t_is_explained_as_identity(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=np.zeros(aux_traces.VD, np.int64))
    report = diff_traces(a, b)
    assert report.first.name == "draft.topk_target"
    assert report.explanations[0].cause == "d2t_missing"


def test_norm_before_fc_on_serving_only_is_explained(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], fc_in_norm=False)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], fc_in_norm=True)
    report = diff_traces(a, b)
    assert report.first.name == "draft.fc_in"
    assert [e.cause for e in report.explanations] == ["norm_before_fc"]
    assert "applied on serving only" in report.explanations[0].message


def test_nan_is_always_a_divergence_and_reported(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], nan_at=5)
    report = diff_traces(a, b)
    assert report.first.name == "target.aux.0"
    assert report.first.stats["nonfinite_rows"] == 2  # one per sequence
    assert int(report.first.match.pos[report.first.first_failing_row]) == 5


def test_position_shift_is_explained(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], shift_pos=1)
    report = diff_traces(a, b)
    assert report.first is not None
    assert any(e.cause == "position_shift" for e in report.explanations)


def test_recorded_findings_that_bear_on_the_divergence_are_shown(tmp_path, aux_traces):

    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[3, 6, 7])
    findings = [{"kind": "aux.dropped_id", "severity": "error", "engine": "sglang", "message": "id 7 dropped", "fix": ""},
                {"kind": "vocab.coverage", "severity": "warn", "engine": "all", "message": "low", "fix": ""}]
    trace_b = open_trace(b)
    trace_b.contract["findings"] = findings
    from specdiff.replay.diff.pipeline import diff_opened

    report = diff_opened(Pair(open_trace(a), trace_b))
    assert [f["kind"] for f in report.findings] == ["aux.dropped_id"]  # vocab.* does not bear on target.aux
    assert "[error] aux.dropped_id: id 7 dropped" in render_text(report)


def test_non_overlapping_traces_are_a_clear_error(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    other = [np.arange(500, 510), np.arange(600, 607)]
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], seqs=other)
    with pytest.raises(AlignmentError, match="share no token sequence"):
        diff_traces(a, b)
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "text"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("specdiff: error: ") and proc.stderr.count("\n") == 1


def test_empty_trace_is_a_clear_error(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    TraceWriter(str(tmp_path / "empty"), side="serve").close()
    with pytest.raises(AlignmentError, match=r"\(2 vs 0 sequences\)"):
        diff_traces(a, str(tmp_path / "empty"))


def test_prefix_match_aligns_a_shorter_replay(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], seqs=[aux_traces.SEQS[0][:8], aux_traces.SEQS[1]], extra_seq=True)
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6])
    traces = Pair(open_trace(a), open_trace(b))
    al = align_sequences(traces)
    assert [p.length for p in al.seq_pairs] == [8, 9]
    assert al.unmatched.x == (2,)


# ---- metrics and tolerances -------------------------------------------------------------------
def test_metrics_on_known_values():
    x = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])
    y = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]])
    assert metrics.relative_error(x, y).tolist() == pytest.approx([0.0, np.sqrt(2), 0.0])
    assert metrics.cosine(x, y).tolist() == pytest.approx([1.0, 0.0, 1.0])
    assert metrics.max_abs_error(x, y).tolist() == [0.0, 1.0, 0.0]
    assert metrics.id_overlap(np.array([[1, 2, 3]]), np.array([[3, 9, 1]])).tolist() == pytest.approx([2 / 3])
    assert metrics.nonfinite_rows(np.array([[np.inf, 0]]), np.array([[0, 0]])).tolist() == [True]
    logits = np.log(np.array([[0.7, 0.2, 0.1]]))
    assert metrics.full_kl(logits, logits).tolist() == pytest.approx([0.0], abs=1e-9)
    vals, ids, lse = np.array([[np.log(0.7), np.log(0.2)]]), np.array([[0, 1]]), np.zeros(1)
    assert metrics.topk_kl(vals, ids, lse, vals, ids, lse).tolist() == pytest.approx([0.0], abs=1e-6)
    swapped = metrics.topk_kl(vals, ids, lse, vals[:, ::-1], ids, lse)
    assert swapped[0] > 0.3


def test_tolerance_edges_are_inclusive_and_looser_dtype_wins():
    tol = default_tolerance("bfloat16", "float32", kind="float")
    assert tol.rel == 0.05 and tol.cos == 0.995
    strict = default_tolerance("float32", "float32", kind="float", preset="strict")
    assert strict.rel == pytest.approx(2e-4)
    assert parse_overrides(["draft.fc_out=rel:0.1,cos:0.9"]) == {"draft.fc_out": {"rel": 0.1, "cos": 0.9}}
    with pytest.raises(ToleranceError, match="not a stage"):
        parse_overrides(["draft.nothing=rel:0.1"])
    with pytest.raises(ToleranceError, match="is not a number"):
        parse_overrides(["draft.fc_out=rel:abc"])


def test_tolerance_override_turns_a_divergence_off(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], noise=0.2)  # rel err ~0.2
    assert diff_traces(a, b).first.name == "target.aux.0"
    loose = diff_traces(a, b, overrides=parse_overrides(["target.aux=rel:0.5,cos:0.9"]))
    assert loose.first is None


def test_explanation_samples_read_a_few_runs_of_rows_not_the_whole_trace():
    """The explanation checks read a sample of aligned rows; rows are read chunk by chunk, so the
    sample must be a few runs of neighbouring rows (a few chunks), not rows spread one per chunk over
    the whole trace (which decoded a 1 GiB trace 18 times for one explanation)."""
    from specdiff.replay.diff.explain.sample import MAX_ROWS, SAMPLE_WINDOWS, sample_rows
    from specdiff.replay.diff.types import RowMatch

    n = 100_000
    rng = np.random.default_rng(0)
    serve_rows = rng.permutation(n)  # serving interleaves requests: its rows come in another order
    m = RowMatch(Pair(np.arange(n), serve_rows), np.zeros(n, int), np.arange(n), np.zeros(n, int), Pair(0, 0))
    rx, ry = sample_rows(m)
    assert len(rx) == MAX_ROWS and len(np.unique(rx)) == MAX_ROWS
    runs = 1 + int((np.diff(np.sort(rx)) > 1).sum())
    assert runs <= SAMPLE_WINDOWS
    assert rx.min() < n // SAMPLE_WINDOWS and rx.max() > n - n // SAMPLE_WINDOWS  # spread over the trace
    assert np.array_equal(ry, serve_rows[rx])  # pairs stay pairs
    small = RowMatch(Pair(np.arange(10), np.arange(10)), np.zeros(10, int), np.arange(10), np.zeros(10, int), Pair(0, 0))
    assert np.array_equal(sample_rows(small)[0], np.arange(10))  # a small match is read whole


@pytest.mark.parametrize("rows_kind", ["all", "with gaps", "reversed", "scattered", "chunk longer than a block"])
def test_blocks_are_cut_at_chunk_boundaries_so_no_chunk_is_decoded_twice(tmp_path, rows_kind):
    """Blocks of aligned rows end where side x's chunks end: a block ending mid-chunk made the next
    block decode that chunk again (170-row chunks of H=4096 x 3 slots, 341-row blocks: every third
    chunk decoded twice). Rows that jump between chunks keep plain blocks; no block exceeds its size."""
    from specdiff.replay.diff.compare.blocks import block_bounds
    from specdiff.tracer.store import TraceWriter, open_trace

    chunk = 170
    with TraceWriter(str(tmp_path / "t.trace"), side="train", chunk_bytes=chunk * 64 * 4) as w:
        w.append("target.aux.0", np.zeros((2000, 64), np.float32), seq=0, pos=np.arange(2000))
    trace = open_trace(str(tmp_path / "t.trace"))
    rows = {"all": np.arange(2000), "with gaps": np.flatnonzero(np.arange(2000) % 7 != 3),
            "reversed": np.arange(2000)[::-1], "scattered": np.random.default_rng(0).permutation(2000),
            "chunk longer than a block": np.arange(2000)}[rows_kind]
    step = 100 if rows_kind == "chunk longer than a block" else 512
    bounds = block_bounds(trace, "target.aux.0", rows, step)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(rows)
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(bounds, bounds[1:]))  # contiguous, in order
    assert all(0 < b - a <= step for a, b in bounds)
    if rows_kind == "scattered":
        assert bounds == [(a, min(a + step, len(rows))) for a in range(0, len(rows), step)]
        return
    chunks_of = [set((rows[a:b] // chunk).tolist()) for a, b in bounds]
    if rows_kind == "chunk longer than a block":
        assert all(len(c) == 1 for c in chunks_of)  # a piece of one chunk each
    else:
        assert all(not (x & y) for i, x in enumerate(chunks_of) for y in chunks_of[i + 1:])
        assert len(bounds) == -(-2000 // (chunk * 3))  # 3 whole chunks (510 rows) a block


def test_row_keys_of_many_sequences_map_each_row_to_its_pair_and_aligned_position():
    """Rows are keyed by one sorted lookup over all sequences (a mask per sequence cost rows x
    sequences: 27 s at 20 GiB); the keys must be what a row-by-row reading of the pairs gives:
    the pair, the position minus the pair's start on this side, inside the common length only."""
    from specdiff.replay.diff.align.align import _keyed, pack_keys

    rng = np.random.default_rng(1)
    n = 5000
    keys = {"seq": rng.integers(0, 60, n).astype(np.int32), "pos": rng.integers(0, 40, n).astype(np.int32),
            "depth": rng.integers(0, 3, n).astype(np.int16)}

    class Rows:
        def keys(self, name, columns):
            return {c: keys[c] for c in columns}

    seq_ids = rng.choice(60, 45, replace=False)  # some seqs have no pair
    seq_to_pair = {int(s): (i, int(rng.integers(5, 40)), int(rng.integers(0, 4))) for i, s in enumerate(seq_ids)}
    packed, valid = _keyed(Rows(), "t", seq_to_pair)
    for r in range(n):
        s, p, d = int(keys["seq"][r]), int(keys["pos"][r]), int(keys["depth"][r])
        pair, length, start = seq_to_pair.get(s, (-1, 0, 0))
        inside = pair >= 0 and start <= p < start + length
        assert valid[r] == inside
        if inside:
            assert packed[r] == pack_keys(np.array([pair]), np.array([p - start]), np.array([d]))[0]


def test_rows_grouped_by_value_keep_their_order_and_cover_every_row():
    """Acceptance and the re-run plan take each sequence's rows from one sort, not one mask per
    sequence over all rows (rows x sequences); the groups must be exactly those masks."""
    from specdiff.replay.diff.align.align import rows_by_value

    values = np.random.default_rng(2).integers(-3, 50, 4000)
    groups = rows_by_value(values)
    assert sorted(groups) == sorted(set(values.tolist()))
    for v, idx in groups.items():
        assert np.array_equal(idx, np.flatnonzero(values == v))
    assert rows_by_value(np.zeros(0, np.int64)) == {}
