"""What a later draft step is fed: a serving bug in the ids fed at depth >= 1 diverges at
``draft.input_ids``, the tokens stage, with both ids and the map between them named; a correct pair's fed
ids agree. Real zarr stores: the session's ``aux_traces`` pair plus ``draft.input_ids`` at depth 1, written
as each side feeds it (training: the teacher's target id; serving: hot_token_id[previous pick], or the
mistake)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.tracer.store import TraceWriter


def _with_fed_ids(aux_traces, path, side: str, feed) -> str:
    """``aux_traces.write`` plus ``draft.input_ids`` at depth 1: ``feed(draft id, target id)`` per row (the
    depth-0 pick as a draft id and as its target id under the pair's d2t)."""
    append = TraceWriter.append

    def also_fed(self, name, rows, **kw):
        append(self, name, rows, **kw)
        if name == "draft.topk" and kw.get("depth") == 0:
            draft = np.asarray(rows).reshape(-1).astype(np.int64)
            fed = feed(draft, draft + aux_traces.D2T[draft])
            append(self, "draft.input_ids", fed.astype(np.int64), seq=kw["seq"], pos=kw["pos"],
                   depth=np.ones(len(fed), np.int64))

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TraceWriter, "append", also_fed)
        return aux_traces.write(path, side=side, hf=[3, 6, 7])


@pytest.fixture
def train(tmp_path, aux_traces):
    return _with_fed_ids(aux_traces, tmp_path / "train.trace", "train", lambda draft, target: target)


def test_a_correct_pair_feeds_the_same_ids(train, tmp_path, aux_traces, run_cli):
    serve = _with_fed_ids(aux_traces, tmp_path / "serve.trace", "serve", lambda draft, target: target)
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert js["first_divergence"] is None and js["verdict"].startswith("no divergence"), js["verdict"]


@pytest.mark.parametrize("cause, says", [("draft_input_unmapped", "never mapped to the target vocabulary"),
                                         ("draft_input_mapped_twice", "twice")])
def test_a_later_step_fed_through_the_wrong_map_diverges_at_its_fed_ids(train, tmp_path, aux_traces, run_cli,
                                                                         cause, says):
    hot = np.arange(len(aux_traces.D2T)) + aux_traces.D2T  # SGLang's hot_token_id

    def twice(draft, target):  # hot_token_id applied to the target id again, where it lies in the draft vocab
        return np.where(target < len(hot), hot[np.clip(target, 0, len(hot) - 1)], target)

    feed = {"draft_input_unmapped": lambda draft, target: draft, "draft_input_mapped_twice": twice}[cause]
    serve = _with_fed_ids(aux_traces, tmp_path / "serve.trace", "serve", feed)
    r = run_cli("diff", train, serve, "--format", "json")
    js = json.loads(r.stdout)
    assert r.exit_code == 1 and js["first_divergence"]["tensor"] == "draft.input_ids", js["verdict"]
    assert js["first_divergence"]["depth"] == 1
    e = js["explanations"][0]
    assert e["cause"] == cause and says in e["message"], e
    assert "d2t[" in e["evidence"][1] and e["fix"]


def _served_as_recorded(aux_traces, path, side: str, feed=None, picks=None) -> str:
    """``aux_traces.write`` with depth 1 as a real server records it: ``tokens`` and ``draft.input_ids`` at
    depth 1 hold the id the step was fed, ``draft.topk_target`` at depth 0 the id its depth-0 step selected.
    Both sides select ``picks(teacher)`` (default: the teacher's token x_{t+2}, every pick right). Training
    (``side="train"``) feeds the teacher's token; serving is fed ``feed(selected, fed at depth 0)`` (default: what it
    selected, a correct server)."""
    append = TraceWriter.append
    fed0: dict[int, np.ndarray] = {}
    picks = picks or (lambda teacher: teacher)
    feed = feed or (lambda selected, before: selected)

    def as_recorded(self, name, rows, **kw):
        depth, seq = kw.get("depth"), kw["seq"]
        if name == "tokens" and depth == 0:
            fed0[seq] = np.asarray(rows).reshape(-1).astype(np.int64)
        if name == "draft.topk_target" and depth == 0:  # both drafts pick alike on the same inputs
            rows = np.r_[picks(fed0[seq][1:]), fed0[seq][-1:]].reshape(-1, 1)  # pos n-1 has no depth 1
        if name == "tokens" and depth == 1:
            teacher = np.asarray(rows).reshape(-1).astype(np.int64)
            rows = teacher if side == "train" else feed(picks(teacher), fed0[seq][:len(teacher)])
            append(self, "draft.input_ids", rows, seq=seq, pos=kw["pos"], depth=kw["depth"])
        append(self, name, rows, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TraceWriter, "append", as_recorded)
        return aux_traces.write(path, side=side, hf=[3, 6, 7])


@pytest.fixture
def train_as_recorded(tmp_path, aux_traces):
    return _served_as_recorded(aux_traces, tmp_path / "train.trace", "train")


def test_a_correct_server_as_recorded_compares_its_fed_ids_and_agrees(train_as_recorded, tmp_path, aux_traces,
                                                                      run_cli):
    """Every pick right and fed: the depth-1 rows are compared and agree; picks that miss are fed as picked
    (a correct server drafting its own tokens) and left out, never a divergence."""
    serve = _served_as_recorded(aux_traces, tmp_path / "serve.trace", "serve")
    js = json.loads(run_cli("diff", train_as_recorded, serve, "--format", "json").stdout)
    assert js["first_divergence"] is None and js["verdict"].startswith("no divergence"), js["verdict"]
    fed = {d["depth"]: d for d in js["serving_rows"]["tensors"]["draft.input_ids"]}[1]
    assert fed["agree"] == fed["rows"] > 0, fed
    def every_other_missed(teacher):
        return np.where(np.arange(len(teacher)) % 2, teacher + 1, teacher)

    train = _served_as_recorded(aux_traces, tmp_path / "train-missed.trace", "train", picks=every_other_missed)
    missed = _served_as_recorded(aux_traces, tmp_path / "missed.trace", "serve", picks=every_other_missed)
    js = json.loads(run_cli("diff", train, missed, "--format", "json").stdout)
    assert js["first_divergence"] is None, js["verdict"]
    fed = {d["depth"]: d for d in js["serving_rows"]["tensors"]["draft.input_ids"]}[1]
    assert fed["left_out"] == {"off_path": fed["rows"] - fed["agree"]} and fed["agree"] > 0, fed


@pytest.mark.parametrize("cause, feed, says, how", [
    ("draft_input_stale", lambda selected, before: before, "stale input-ids buffer", "serving fed depth 0 "),
    ("draft_input_not_selected", lambda selected, before: selected + 1000, "another id than the one its previous step "
     "selected", "serving's depth-0 selection ")])
def test_a_later_step_fed_other_than_its_pick_as_a_server_records_it(train_as_recorded, tmp_path, aux_traces, run_cli,
                                                                     cause, feed, says, how):
    """As a server records it, a wrongly fed step's ``tokens`` row is what it was fed: off training's token
    path. Its own pick (draft.topk_target at depth 0) was the teacher's token, so the fed ids are compared
    there and diverge at draft.input_ids depth 1 (before the fix: no divergence, the rows left out)."""
    serve = _served_as_recorded(aux_traces, tmp_path / "serve.trace", "serve", feed=feed)
    r = run_cli("diff", train_as_recorded, serve, "--format", "json")
    js = json.loads(r.stdout)
    assert r.exit_code == 1, js["verdict"]
    first = js["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.input_ids", 1), js["verdict"]
    e = js["explanations"][0]
    assert e["cause"] == cause and says in e["message"], e
    assert how in e["evidence"][1] and e["fix"], e
