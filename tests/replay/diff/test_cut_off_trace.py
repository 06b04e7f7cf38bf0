"""A trace its writer never closed (a server killed before its writer wrote everything)
holds only some of what was served: ``diff`` names it in its first line with the sequences
it holds, never says a plain "no divergence" over it, and exits 1; the app's header says the same."""

from __future__ import annotations

import json

import pytest

from specdiff.tracer.store import TraceWriter, open_trace


def _cut_off(aux_traces, path, monkeypatch, **kw) -> str:
    """``aux_traces.write`` whose writer is never closed, as a killed writer leaves its trace: every
    append journaled, no close."""
    with monkeypatch.context() as m:
        m.setattr(TraceWriter, "__exit__", lambda self, *exc: None)
        out = aux_traces.write(path, **kw)
    assert not open_trace(out).closed
    return out


def test_a_cut_off_serving_trace_leads_the_report_and_is_no_clean_pair(tmp_path, aux_traces, run_cli, monkeypatch):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    closed = aux_traces.write(tmp_path / "closed.trace", side="serve", hf=[3, 6, 7])
    cut = _cut_off(aux_traces, tmp_path / "cut.trace", monkeypatch, side="serve", hf=[3, 6, 7],
                   seqs=aux_traces.SEQS[:1])
    clean = run_cli("diff", train, closed)
    assert clean.exit_code == 0 and clean.stdout.startswith("no divergence"), clean.output
    r = run_cli("diff", train, cut)
    first = r.stdout.splitlines()[0]
    assert first.startswith("serving trace cut off (not closed: it holds 1 sequences, "), first
    assert r.exit_code == 1, r.output
    js = json.loads(run_cli("diff", train, cut, "--format", "json").stdout)
    assert js["cut_off"] == [{"label": "serving", "sequences": 1, "records": open_trace(cut).records}]
    assert js["verdict"] == (f"serving trace cut off (not closed: it holds 1 sequences, {open_trace(cut).records} "
                             "records): no divergence in what it holds, but what it lost is not compared, so "
                             "equivalence is not shown")
    assert " ".join(r.stdout.split("\n\n")[0].split()) == js["verdict"]  # the text report's first paragraph
    assert "cut_off" not in json.loads(run_cli("diff", train, closed, "--format", "json").stdout)


def test_a_divergence_in_a_cut_off_trace_is_said_after_the_cut(tmp_path, aux_traces, run_cli, monkeypatch):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[0, 3, 6])
    cut = _cut_off(aux_traces, tmp_path / "cut.trace", monkeypatch, side="serve", hf=[3, 6, 7])
    r = run_cli("diff", train, cut)
    first = r.stdout.splitlines()[0]
    assert first.startswith("serving trace cut off (not closed: it holds 2 sequences, ") and \
        "; first divergence: target.aux." in first, first
    assert r.exit_code == 1


@pytest.mark.anyio
async def test_the_app_header_names_the_cut_off_trace(tmp_path, aux_traces, monkeypatch, tui):
    from specdiff.tui.app import SpecdiffApp

    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    cut = _cut_off(aux_traces, tmp_path / "cut.trace", monkeypatch, side="serve", hf=[3, 6, 7])
    app = SpecdiffApp(train, cut, export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        header = tui.static_text(app, "#verdict")
        assert header.startswith("serving trace cut off (not closed: it holds 2 sequences, "), header
        assert app.query_one("#verdict").has_class("diverged")
        await pilot.press("q")
    assert app.return_code == 1
