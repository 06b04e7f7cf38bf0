"""Explanations read from the rows' structure: a first divergence whose rows agree at every
sequence's position 0 and differ after (a rope table lost after load: rotary is the identity at position 0)
is named position-dependent; one that agrees at draft depth 0 and differs from depth 1 is named
depth-dependent. Both say where, not what: the narrowing still runs. Real zarr stores (``aux_traces``) with
one side's rows changed as the mistake would."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.tracer.store import TraceWriter


def _written(aux_traces, path, change) -> str:
    """The serving trace of ``aux_traces`` with ``change(name, rows, kw)`` applied to every append."""
    append = TraceWriter.append

    def changed(self, name, rows, **kw):
        append(self, name, change(name, np.array(rows), kw), **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TraceWriter, "append", changed)
        return aux_traces.write(path, side="serve", hf=[3, 6, 7])


def _rotated_after_position_0(name, rows, kw):
    """Every target layer's rows rotated by a position-dependent angle, as a lost rotary cache does; position 0
    (angle 0) untouched."""
    if not name.startswith("target.aux"):
        return rows
    pos = np.asarray(kw["pos"], np.float64)[:, None]
    half = rows.shape[1] // 2
    a, b = rows[:, :half], rows[:, half:]
    c, s = np.cos(0.7 * pos), np.sin(0.7 * pos)
    return np.concatenate([a * c - b * s, a * s + b * c], axis=1).astype(rows.dtype)


def _other_picks_from_depth_1(name, rows, kw):
    if name in ("draft.topk", "draft.topk_target") and kw.get("depth") == 1:
        return rows + 1
    return rows


def test_rows_spared_at_position_0_name_a_position_dependent_difference(tmp_path, aux_traces, run_cli):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _written(aux_traces, tmp_path / "serve.trace", _rotated_after_position_0)
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert js["first_divergence"]["tensor"] == "target.aux.0", js["verdict"]
    e = js["explanations"][0]
    assert e["cause"] == "position_dependent", js["explanations"]
    assert e["message"].startswith("target.aux.0 agrees at position 0 of every sequence and differs from every "
                                   "later position"), e["message"]
    assert e["evidence"][0].startswith("2 rows at position 0 of every sequence agree; "), e["evidence"]
    assert js["narrowing"] is not None  # named, not proven: the narrowing still ran (or said why it could not)


def test_rows_spared_at_depth_0_name_a_depth_dependent_difference(tmp_path, aux_traces, run_cli):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _written(aux_traces, tmp_path / "serve.trace", _other_picks_from_depth_1)
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert js["first_divergence"]["tensor"] == "draft.topk" and js["first_divergence"]["depth"] == 1, js["verdict"]
    causes = [e["cause"] for e in js["explanations"]]
    assert causes == ["depth_dependent"], js["explanations"]
    assert "agrees at draft depth 0 and differs from depth 1 on" in js["explanations"][0]["message"]


def test_a_difference_at_every_row_is_neither(tmp_path, aux_traces, run_cli):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _written(aux_traces, tmp_path / "serve.trace",
                     lambda name, rows, kw: rows * 1.5 if name == "target.aux.0" else rows)
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert js["first_divergence"]["tensor"] == "target.aux.0"
    assert not {"position_dependent", "depth_dependent"} & {e["cause"] for e in js["explanations"]}
