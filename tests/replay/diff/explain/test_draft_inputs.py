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
