"""A server that crashes on the first request is debugged to the end.

The served draft has an aux id past the target's last layer (id 8 on the 8-layer demo target):
SGLang 0.5.23 starts, then the first request crashes in the draft's fc. The recorder keeps the
crashing request's prompt ids and what the iteration recorded before it raised (the target's
prefill rows); ``record train --replay`` replays that prompt; ``diff`` reports the crash as the
first divergence at the stage where serving stopped, explained by the aux id, with the fix.

The unit tests build small traces with the store's writer and check the diff's decision (the
crash leads unless a value divergence comes earlier; the cause names the dropped id).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specdiff.tracer.crash import UNKNOWN_IDS, crash_record, crash_requests
from specdiff.tracer.store import TraceWriter, open_trace

MODELS = Path(__file__).resolve().parents[2] / "traces" / "models"
PAST_LAST = [-1, 2, 8]  # SGLang ids; 8 -> capture index 9 on an 8-layer target: never reached


def _draft(root: Path, ids: list[int]) -> Path:
    from dataclasses import replace

    from specdiff.demo.scenarios import scenario_ids, write_served_draft

    # the 'correct' scenario writes its ids as given: here ids no training used
    return write_served_draft("correct", MODELS / "draft", root / "draft-past-last",
                              ids=replace(scenario_ids(), correct=list(ids)))


# ---- the crash record's requests ------------------------------------------------------------------
def test_crash_requests_keep_the_ids_read_and_say_unknown_otherwise(fc_crash):
    got = crash_requests(["a", "b", "c"], {"a": [5, 6, 7], "b": []})
    assert got == [{"rid": "a", "input_ids": [5, 6, 7]}, {"rid": "b", "input_ids": UNKNOWN_IDS},
                   {"rid": "c", "input_ids": UNKNOWN_IDS}]
    c = crash_record(fc_crash(), forward="draft extend (prefill)", rids=["a"], prompts={"a": [1, 2]})
    assert c["requests"] == [{"rid": "a", "input_ids": [1, 2]}]
    assert c["engine_where"] is None  # raised by torch alone: no engine frame to name
    # prompts as the engines hold them (SGLang 0.5.23 Req.origin_input_ids: array.array), or a tensor
    # (a truth test of a tensor of several ids raises)
    import array

    held = {"a": array.array("i", [5, 6]), "b": torch.tensor([7, 8, 9]), "c": np.array([], np.int64)}
    assert crash_requests(["a", "b", "c"], held) == [{"rid": "a", "input_ids": [5, 6]}, {"rid": "b", "input_ids": [7, 8, 9]},
                                                     {"rid": "c", "input_ids": UNKNOWN_IDS}]


def test_replay_takes_a_crashing_prompt_from_the_crash_record_when_no_sequence_was_written(tmp_path, fc_crash):
    """The vLLM recorder (and any engine that died before its writer ran) leaves the ids only in the
    crash record: the replay reads them there; ids it never read are said, not guessed."""
    from specdiff.replay.record.sequences import sequences_from_trace
    from specdiff.replay.trainers.errors import RecordTrainError

    def serve(name, prompts):
        tw = TraceWriter(str(tmp_path / name), side="serve", contract={"engine": "vllm"})
        tw.set_contract(crash=crash_record(fc_crash(), forward="draft extend (prefill)", rids=["a", "b"],
                                           prompts=prompts))
        tw.close()
        return str(tmp_path / name)

    seqs, contract = sequences_from_trace(serve("s1.trace", {"a": [5, 6, 7]}))
    assert [(s.rid, list(s.tokens), s.prompt_len) for s in seqs] == [("a", [5, 6, 7], 3)]
    assert contract["crash_replay"].startswith("serving crashed on request a (3 prompt tokens, from the crash "
                                               "record), request b (its token ids are unknown: not replayed)")
    with pytest.raises(RecordTrainError, match="no token sequences to replay"):
        sequences_from_trace(serve("s2.trace", {}))


# ---- the diff's decision on small traces ----------------------------------------------------------
PROMPT = [11, 12, 13, 14, 15, 16, 17]


def _contract(**extra) -> dict:
    base = {"num_layers": 8, "hidden_size": 4, "vocab_size": 64, "model_name": "/nonexistent/target",
            "draft_name": "/nonexistent/draft"}
    return {**base, **extra}


def _aux(seed: int, n: int, slots: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4 * slots, generator=g)


def _train(path: Path, *, shift: float = 0.0) -> str:
    """A training trace of PROMPT: 3 aux slots, fc rows at every position."""
    tw = TraceWriter(str(path), side="train", contract=_contract(engine="specdiff-reference", aux_hf_indices=[0, 3, 6],
                                                               aux_native_ids=[0, 3, 6]))
    s = tw.add_sequence(np.asarray(PROMPT), prompt_len=len(PROMPT), rid="r0")
    n, pos = len(PROMPT), np.arange(len(PROMPT))
    aux = _aux(0, n, 3)
    aux[:, :4] += shift
    for j in range(3):
        tw.append(f"target.aux.{j}", aux[:, 4 * j:4 * j + 4], seq=s, pos=pos)
    tw.append("draft.fc_in", aux, seq=s, pos=pos[:-1] if False else pos)
    tw.close()
    return str(path)


def _serve(path: Path, *, crash: dict, slots: int = 3) -> str:
    """A serving trace that crashed on PROMPT after the target's prefill (aux rows, no draft row)."""
    tw = TraceWriter(str(path), side="serve",
                     contract=_contract(engine="sglang", engine_version="0.5.23",
                                        aux_hf_indices=[0, 3, 6][:slots], aux_native_ids=[-1, 2, 8][:2] + [5][:slots - 2]
                                        if slots == 3 else [-1, 2, 8], aux_dropped_ids=[] if slots == 3 else [8]))
    s = tw.add_sequence(np.asarray(PROMPT), prompt_len=len(PROMPT), rid="r0")
    aux = _aux(0, len(PROMPT), 3)
    for j in range(slots):
        tw.append(f"target.aux.{j}", aux[:, 4 * j:4 * j + 4], seq=s, pos=np.arange(len(PROMPT)))
    tw.set_contract(crash=crash)
    tw.close()
    return str(path)


def _draft_crash(fc_crash) -> dict:
    return crash_record(fc_crash(), forward="draft extend (prefill)", iteration=0, kind="prefill", rids=["r0"],
                        prompts={"r0": PROMPT})


def test_the_crash_leads_at_the_stage_serving_stopped_with_the_dropped_id_as_cause(tmp_path, fc_crash):
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.report import render_text

    train = _train(tmp_path / "train.trace")
    serve = _serve(tmp_path / "serve.trace", crash=_draft_crash(fc_crash), slots=2)
    rep = diff_traces(train, serve, narrow=False)
    assert rep.diverged and rep.first is None and rep.crash["stage"] == "draft.fc_in"
    v = rep.verdict()
    assert v.startswith("first divergence: serving crashed at draft.fc_in (seq 0 r0, 7 prompt tokens): "
                        "RuntimeError in draft extend (prefill) (iteration 0): mat1 and mat2"), v
    assert "aux id 8 is past the target's last layer (8 layers)" in v
    cause = rep.crash["cause"]
    assert cause["kind"] == "contract.aux_dropped_ids" and "-1..6" in cause["fix"]
    text = render_text(rep, width=1000)
    # the slot counts differ, so no aux slot is compared row by row: the layout difference is the evidence
    assert "recorded before the crash: target.aux.2: training fed the draft 3 aux hidden state slot(s), serving 2" \
        in text
    assert "cause (contract.aux_dropped_ids): aux id 8 is past" in text and "fix: use ids in -1..6" in text
    j = rep.to_json()
    assert j["diverged"] and j["crash"]["stage"] == "draft.fc_in" and j["crash"]["cause"]["fix"] == cause["fix"]


def test_the_app_shows_the_crash_its_cause_and_fix(tmp_path, tui, fc_crash):
    import asyncio

    from specdiff.tui.app import SpecdiffApp

    train = _train(tmp_path / "train.trace")
    serve = _serve(tmp_path / "serve.trace", crash=_draft_crash(fc_crash), slots=2)
    app = SpecdiffApp(train, serve, export_root=tmp_path)

    async def run():
        async with app.run_test(size=(160, 50)) as pilot:
            await tui.wait_for(pilot, lambda: app.report is not None, timeout=60)
            # the fix is in the header's fix line where the app has one, else in the Explain pane
            got = [tui.static_text(app, sel) if app.query(sel) else "" for sel in ("#verdict", "#fix", "#explain-body")]
            await pilot.press("q")
            return got

    verdict, fix, explain = asyncio.run(run())
    assert verdict.startswith("first divergence: serving crashed at draft.fc_in (seq 0 r0"), verdict
    assert "use ids in -1..6" in fix + explain, (fix, explain)
    flat = " ".join(explain.split())
    assert "contract.aux_dropped_ids: aux id 8 is past the target's last layer" in flat, flat
    assert app.return_code == 1


def test_a_value_divergence_before_the_crash_stage_stays_first(tmp_path, fc_crash):
    from specdiff.replay.diff.pipeline import diff_traces

    train = _train(tmp_path / "train.trace", shift=1.0)  # aux slot 0 differs in every row
    serve = _serve(tmp_path / "serve.trace", crash=_draft_crash(fc_crash), slots=3)
    rep = diff_traces(train, serve, narrow=False)
    assert rep.first is not None and rep.first.name == "target.aux.0"
    assert rep.crash is not None and rep.crash["stage"] == "draft.fc_in"
    assert rep.verdict().startswith("first divergence: target.aux.0")


# ---- a real server ------------------------------------------------------------------------------
@pytest.mark.server
@pytest.mark.timeout(900)
def test_a_server_crashing_on_its_first_request_is_diffed_to_the_crash(tmp_path, run_cli, server_env):
    pytest.importorskip("sglang")
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    draft = _draft(tmp_path, PAST_LAST)
    assert json.loads((draft / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == \
        PAST_LAST
    serve = tmp_path / "serve.trace"
    srv = ServerProcess(MODELS / "target", draft_model_path=draft, env=server_env(SPECDIFF_TRACE=str(serve)),
                        spec=SpecSettings(num_steps=3, topk=1, num_draft_tokens=4))
    srv.start(wait=False)  # SGLang's /health runs a generation, which this draft crashes
    try:
        srv.wait_ready(path="/model_info")
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"text": "def main():"}\n')
        r = run_cli("record", "client", "--url", srv.url, "--prompts", prompts, "--max-new-tokens", "8")
        srv.proc.wait(120)
    finally:
        srv.stop()
    assert r.exit_code == 2 and "died during request 0" in r.output, r.output

    t = open_trace(str(serve))
    crash = t.contract["crash"]
    assert crash["engine_where"].startswith("srt/models/llama_eagle3.py:"), crash["engine_where"]
    assert "self.fc(" in crash["engine_where"]
    [req] = crash["requests"]
    [seq] = t.sequences
    # the crashing request's prompt, and what the target's prefill recorded before the draft raised
    assert seq.rid == req["rid"] and list(seq.tokens[:seq.prompt_len]) == req["input_ids"]
    assert t.contract["aux_dropped_ids"] == [8] and "target.aux.0" in t.names and "draft.fc_in" not in t.names
    n_aux = t.rows("target.aux.0")
    assert n_aux == seq.prompt_len

    train = tmp_path / "train.trace"
    rt = run_cli("record", "train", "--target", MODELS / "target", "--draft", MODELS / "draft", "--replay", serve,
                 "-o", train)
    assert rt.exit_code == 0, rt.output
    notes = [ln for ln in rt.output.splitlines() if "crashed on" in ln]
    assert len(notes) == 1 and f"request {req['rid']}" in notes[0], rt.output

    d = run_cli("diff", train, serve, "--format", "text")
    assert d.exit_code == 1, d.output
    first = " ".join(d.output.split("\n\n", 1)[0].split())  # the headline, unwrapped
    assert first.startswith(f"first divergence: serving crashed at draft.fc_in (seq 0 {req['rid']}, "
                            f"{len(req['input_ids'])} prompt tokens): RuntimeError in draft extend (prefill)"), first
    assert "aux id 8 is past the target's last layer (8 layers)" in first
    # the engine's rule and the line that raised, read from the live server
    assert "(srt/models/llama.py:929 LlamaForCausalLM.set_eagle3_layers_to_capture)" in first
    assert "it raises at srt/models/llama_eagle3.py:247 forward" in first
    assert "fix: use ids in -1..6" in d.output
    j = json.loads(run_cli("diff", train, serve, "--format", "json").output)
    assert j["diverged"] and j["first_divergence"] is None and j["crash"]["stage"] == "draft.fc_in"
    assert j["explanations"][0]["cause"] == "contract.aux_dropped_ids" and "-1..6" in j["explanations"][0]["fix"]
    assert j["crash"]["recorded_before"] and open_trace(str(serve)).rows("target.aux.0") == n_aux
