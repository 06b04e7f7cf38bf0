"""Zero rows compared is no verdict: a serving trace closed with its sequences' tokens and no
tensor (a server that died on its first request, no crash recorded) once gave "no divergence: 0 tensors agree",
exit 0. ``diff`` now says nothing was compared, what each side holds and what to do, exits 1; the app's header
says the same and its exit code follows."""

from __future__ import annotations

import json

import pytest

from specdiff.tracer.store import TraceWriter, open_trace


def _tokens_only(aux_traces, path) -> str:
    """A closed serving trace holding the first sequence's tokens and not one tensor row."""
    contract = {"num_layers": aux_traces.L, "hidden_size": aux_traces.H, "aux_hf_indices": [3, 6, 7],
                "dtype": "float32", "draft_vocab_size": aux_traces.VD, "spec_steps": 2}
    with TraceWriter(str(path), side="serve", contract=contract, overwrite=True) as w:
        w.add_sequence(aux_traces.SEQS[0], prompt_len=4, rid="died")
    assert open_trace(str(path)).closed and open_trace(str(path)).records == 0
    return str(path)


def test_a_serving_trace_of_tokens_only_is_no_verdict(tmp_path, aux_traces, run_cli):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _tokens_only(aux_traces, tmp_path / "serve.trace")
    r = run_cli("diff", train, serve)
    assert r.exit_code == 1, r.output
    lead = " ".join(r.stdout.split("\n\n")[0].split())
    assert lead.startswith("nothing compared: no tensor row of the 1 aligned sequences is held by both sides "
                           f"(training {open_trace(train).records} records, serving 0)"), lead
    assert "record the serving side again" in lead and "no divergence" not in r.stdout
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert js["nothing_compared"] is True and js["diverged"] is False and js["verdict"] == lead


def test_two_traces_with_no_tensor_in_common_are_no_verdict(tmp_path, aux_traces, run_cli):
    # both hold records, none of one name: the fix is the pipeline, not re-recording one side
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    contract = {"num_layers": aux_traces.L, "hidden_size": aux_traces.H, "aux_hf_indices": [3, 6, 7],
                "dtype": "float32", "draft_vocab_size": aux_traces.VD, "spec_steps": 2}
    with TraceWriter(str(tmp_path / "serve.trace"), side="serve", contract=contract, overwrite=True) as w:
        sid = w.add_sequence(aux_traces.SEQS[0], prompt_len=4, rid="x")
        w.append("draft.d2t", aux_traces.D2T + 1, seq=-1, pos=range(len(aux_traces.D2T)))
        assert sid == 0
    r = run_cli("diff", train, tmp_path / "serve.trace")
    assert r.exit_code == 1 and r.stdout.startswith("nothing compared: "), r.output
    assert "hold no tensor in common" in " ".join(r.stdout.split()), r.output


def test_a_pair_with_rows_compared_is_not_nothing(tmp_path, aux_traces, run_cli):
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[3, 6, 7])
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    assert "nothing_compared" not in js and js["verdict"].startswith("no divergence: ")


@pytest.mark.anyio
async def test_the_app_header_says_nothing_was_compared(tmp_path, aux_traces, tui):
    from specdiff.tui.app import SpecdiffApp

    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    app = SpecdiffApp(train, _tokens_only(aux_traces, tmp_path / "serve.trace"), export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert tui.static_text(app, "#verdict").startswith("nothing compared: "), tui.static_text(app, "#verdict")
        await pilot.press("q")
    assert app.return_code == 1


def test_fix_on_a_pair_that_compared_nothing_says_so_and_writes_nothing(tmp_path, aux_traces, run_cli):
    # "nothing to fix: the traces agree" was its answer to any pair without a divergence
    train = aux_traces.write(tmp_path / "train.trace", side="train", hf=[3, 6, 7])
    serve = _tokens_only(aux_traces, tmp_path / "serve.trace")
    r = run_cli("fix", train, serve, "-o", tmp_path / "fixed")
    assert r.exit_code == 1, r.output
    assert r.stdout.startswith("nothing to fix found, but the traces do not show agreement: nothing compared: ")
    assert not (tmp_path / "fixed").exists()
