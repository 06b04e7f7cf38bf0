"""A serving trace whose server died before it wrote one request, and was never closed, is no verdict: ``diff``
says nothing was compared, what the trace holds, that it was not closed and that no crash is recorded, exits 1.

Before, a trace holding no sequence at all (the server ended in its first iteration: the recorder writes a
request's rows and tokens when its iteration ends) stopped ``diff`` with exit 2 and "share no token sequence
... record the training side with `record train --replay SERVE_TRACE`", which refuses a trace without sequences;
and a cut-off trace with sequences but no tensor row said "no divergence in what it holds"."""

from __future__ import annotations

import json

import pytest

from specdiff.tracer.store import TraceWriter, open_trace


def _contract(aux_traces) -> dict:
    return {"num_layers": aux_traces.L, "hidden_size": aux_traces.H, "aux_hf_indices": [3, 6, 7],
            "dtype": "float32", "draft_vocab_size": aux_traces.VD, "spec_steps": 2}


def _never_closed(aux_traces, path, monkeypatch, *, sequences: int) -> str:
    """A serving trace as a server that died leaves it: its vocab map (written at start-up), ``sequences`` of
    the aux fixture's sequences' tokens, no tensor row, no close."""
    with monkeypatch.context() as m:
        m.setattr(TraceWriter, "__exit__", lambda self, *exc: None)
        with TraceWriter(str(path), side="serve", contract=_contract(aux_traces), overwrite=True) as w:
            w.append("draft.d2t", aux_traces.D2T, seq=-1, pos=range(len(aux_traces.D2T)))
            for s in aux_traces.SEQS[:sequences]:
                w.add_sequence(s, prompt_len=4, rid="died")
            w.flush()
    t = open_trace(str(path))
    assert not t.closed and len(t.sequences) == sequences and t.names == ["draft.d2t"], (t.closed, t.names)
    return str(path)


def _lead(stdout: str) -> str:
    return " ".join(stdout.split("\n\n")[0].split())


def test_a_cut_off_trace_without_any_sequence_is_nothing_compared(tmp_path, aux_traces, run_cli, monkeypatch):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _never_closed(aux_traces, tmp_path / "serve.trace", monkeypatch, sequences=0)
    r = run_cli("diff", train, serve)
    assert r.exit_code == 1, r.output
    lead = _lead(r.stdout)
    assert lead.startswith("nothing compared: no tensor row of the 0 aligned sequences is held by both sides "
                           f"(training {open_trace(train).records} records, serving 1)"), lead
    assert ("serving trace cut off (not closed: it holds 0 sequences, 1 records: draft.d2t), no crash recorded"
            in lead), lead
    assert "its server ended before it wrote a request" in lead and "share no token sequence" not in r.output
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert js["nothing_compared"] is True and js["crash"] is None and js["verdict"] == lead
    assert js["cut_off"] == [{"label": "serving", "sequences": 0, "records": 1}]


def test_a_cut_off_trace_of_tokens_only_says_nothing_compared_not_no_divergence(tmp_path, aux_traces, run_cli,
                                                                               monkeypatch):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _never_closed(aux_traces, tmp_path / "serve.trace", monkeypatch, sequences=1)
    r = run_cli("diff", train, serve)
    assert r.exit_code == 1, r.output
    lead = _lead(r.stdout)
    assert lead.startswith("nothing compared: no tensor row of the 1 aligned sequences is held by both sides"), lead
    assert "serving trace cut off (not closed: it holds 1 sequences, 1 records: draft.d2t), no crash recorded" in lead
    assert "no divergence" not in lead


def test_two_closed_traces_with_no_sequence_in_common_still_stop_the_diff(tmp_path, aux_traces, run_cli):
    # both hold sequences, none shared: the pipeline's mistake (exit 2, record train --replay), not a dead server
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7], seqs=aux_traces.SEQS[:1])
    serve = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[3, 6, 7], seqs=aux_traces.SEQS[1:])
    r = run_cli("diff", train, serve)
    assert r.exit_code == 2 and "share no token sequence" in r.output, r.output


@pytest.mark.anyio
async def test_the_app_header_says_nothing_was_compared_of_a_trace_without_sequences(tmp_path, aux_traces, tui,
                                                                                     monkeypatch):
    from specdiff.tui.app import SpecdiffApp

    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _never_closed(aux_traces, tmp_path / "serve.trace", monkeypatch, sequences=0)
    app = SpecdiffApp(train, serve, export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert tui.static_text(app, "#verdict").startswith("nothing compared: "), tui.static_text(app, "#verdict")
        await pilot.press("q")
    assert app.return_code == 1
