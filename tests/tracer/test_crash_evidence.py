"""A crashed server leaves evidence: the contract from start-up and the exception in its trace,
named by ``info``, ``record client`` and ``diff`` (exit 1, no traceback).

The end-to-end case runs real SGLang on this CPU: the demo draft (traces/models) served with an
aux layer id one past the last capturable layer (SGLang id L-1 = 7), which starts fine and then
crashes the first request in the draft's fc ('mat1 and mat2 shapes cannot be multiplied').
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from specdiff.tracer.crash import crash_record, describe_crash, forward_name
from specdiff.tracer.store import TraceWriter, open_trace

MODELS = Path(__file__).resolve().parents[2] / "traces" / "models"


def _bad_draft(root: Path) -> Path:
    """The demo draft with SGLang aux ids [-1, 2, 7]: id 7 = L-1 is never captured (L = 8)."""
    d = root / "draft-id-L-1"
    shutil.copytree(MODELS / "draft", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 2, 7]
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d


# ---- the crash record ----------------------------------------------------------------------
def test_a_crash_record_names_the_forward_and_the_shapes_involved(fc_crash):
    exc = fc_crash()
    c = crash_record(exc, forward=forward_name(is_draft=True, mode="EXTEND"), forward_shapes={"input_ids": [7]},
                     iteration=0, kind="prefill", rids=["r0"])
    assert c["type"] == "RuntimeError" and "mat1 and mat2" in c["message"]
    assert c["forward"] == "draft extend (prefill)" and c["forward_shapes"] == {"input_ids": [7]}
    assert c["shapes"]["Linear.forward: input"] == [7, 512] and c["shapes"]["Linear.forward: self.weight"] == [256, 768]
    assert describe_crash(c).startswith("RuntimeError in draft extend (prefill) (iteration 0): mat1 and mat2")
    # outside any model forward: the innermost function is named instead
    assert crash_record(exc, forward=None)["forward"].endswith("), outside the model forwards")
    assert forward_name(is_draft=False, mode="TARGET_VERIFY") == "target verify"


def _serve_trace(path: Path, draft: Path, crash: dict | None) -> str:
    contract = {"engine": "sglang", "engine_version": "0.5.23", "num_layers": 8, "hidden_size": 256,
                "vocab_size": 4096, "aux_hf_indices": [0, 3], "aux_native_ids": [-1, 2, 7],
                "aux_dropped_ids": [7], "model_name": str(MODELS / "target"), "draft_name": str(draft)}
    tw = TraceWriter(str(path), side="serve", contract=contract)
    if crash is not None:
        tw.set_contract(crash=crash)
    tw.close()
    return str(path)


def _train_trace(path: Path) -> str:
    contract = {"engine": "specdiff-reference", "num_layers": 8, "hidden_size": 256, "vocab_size": 4096,
                "aux_hf_indices": [0, 3, 6], "model_name": str(MODELS / "target"),
                "draft_name": str(MODELS / "draft")}
    with TraceWriter(str(path), side="train", contract=contract) as tw:
        tw.add_sequence([5, 6, 7, 8], prompt_len=2, rid="s0")
    return str(path)


def test_diff_of_a_serve_trace_that_crashed_before_any_sequence_reports_the_crash_first(tmp_path, run_cli, fc_crash):
    crash = crash_record(fc_crash(), forward="draft extend (prefill)", iteration=0, kind="prefill", rids=["r0"])
    serve = _serve_trace(tmp_path / "serve.trace", _bad_draft(tmp_path), crash)
    train = _train_trace(tmp_path / "train.trace")
    r = run_cli("diff", train, serve, "--format", "text")
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    first = " ".join(r.output.split("\n\n", 1)[0].split())  # the headline, unwrapped
    assert first.startswith("first divergence: serving crashed at draft.fc_in (request r0): RuntimeError in draft "
                            "extend (prefill) (iteration 0): mat1 and mat2 shapes cannot be multiplied")
    assert "aux id 7 asks for the output of the target's last layer (8 layers)" in first
    assert "Linear.forward: self.weight: [256, 768]" in r.output
    # the contracts are still compared
    assert "serving captured HF hidden_states[0, 3]; training used [0, 3, 6]" in r.output
    j = json.loads(run_cli("diff", train, serve, "--format", "json").output)
    assert j["diverged"] and j["crash"]["forward"] == "draft extend (prefill)" and j["crash"]["label"] == "serving"
    assert j["preflight_findings"][0]["kind"] == "aux.slot_count"


def test_diff_without_a_crash_and_without_sequences_is_still_a_bad_input_line(tmp_path, run_cli):
    serve = _serve_trace(tmp_path / "serve.trace", _bad_draft(tmp_path), None)
    r = run_cli("diff", _train_trace(tmp_path / "train.trace"), serve, "--format", "text")
    assert r.exit_code == 2 and r.output.startswith("specdiff: error: ") and "share no token sequence" in r.output


def test_record_client_names_the_trace_of_a_server_that_died(tmp_path, monkeypatch, run_cli, fc_crash):
    from specdiff.tracer import live
    from specdiff.tracer.engines.sglang.cpu.launch import free_port

    monkeypatch.setattr(live, "registry_dir", lambda: str(tmp_path / "reg"))
    crash = crash_record(fc_crash(), forward="draft extend (prefill)", iteration=0, kind="prefill")
    serve = _serve_trace(tmp_path / "serve.trace", MODELS / "draft", crash)
    port = free_port()  # nothing listens there any more: a dead server
    live.register_server(port=port, trace=serve)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "def f():"}\n')
    r = run_cli("record", "client", "--url", f"http://127.0.0.1:{port}", "--prompts", prompts)
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.startswith("specdiff: error:")]
    assert len(lines) == 1
    assert f"the server at http://127.0.0.1:{port} died during request 0" in lines[0]
    assert f"its trace {serve} holds the crash: RuntimeError in draft extend (prefill)" in lines[0]


# ---- a real server ------------------------------------------------------------------------------
@pytest.mark.server
def test_a_server_crashing_on_an_aux_id_past_the_last_layer_leaves_contract_and_crash(tmp_path, monkeypatch, run_cli,
                                                                                      server_env):
    pytest.importorskip("sglang")
    from specdiff.tracer import live
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    draft = _bad_draft(tmp_path)
    path = tmp_path / "serve.trace"
    srv = ServerProcess(MODELS / "target", draft_model_path=draft, env=server_env(SPECDIFF_TRACE=str(path)),
                        spec=SpecSettings(num_steps=3, topk=1, num_draft_tokens=4))
    # SGLang's /health runs a one-token generation, which this draft crashes: wait on /model_info.
    srv.start(wait=False)
    try:
        _wait_model_info(srv)
        # the contract is there before any request
        before = open_trace(str(path))
        assert before.contract["aux_hf_indices"] == [0, 3] and before.contract["aux_dropped_ids"] == [7]
        assert "crash" not in before.contract and not before.sequences
        assert live.trace_of_server(srv.url) == str(path)
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"text": "def main():"}\n')
        r = run_cli("record", "client", "--url", srv.url, "--prompts", prompts, "--max-new-tokens", "8")
        srv.proc.wait(120)
    finally:
        log = Path(srv.log_path).read_text(errors="replace")
        srv.stop()
    assert r.exit_code == 2, r.output
    line = [ln for ln in r.output.splitlines() if ln.startswith("specdiff: error:")]
    assert len(line) == 1 and "died during request 0" in line[0] and str(path) in line[0], r.output
    assert "holds the crash: RuntimeError in draft extend (prefill)" in line[0]
    assert "mat1 and mat2" in log  # SGLang's own traceback, for reference

    trace = open_trace(str(path))
    c = trace.contract["crash"]
    # the crashing request's prompt is kept (its sequence, and its ids in the crash record)
    [seq] = trace.sequences
    assert trace.closed and [seq.rid] == c["rids"] == [r["rid"] for r in c["requests"]]
    assert list(seq.tokens[:seq.prompt_len]) == c["requests"][0]["input_ids"]
    assert (c["type"], c["forward"], c["kind"]) == ("RuntimeError", "draft extend (prefill)", "prefill")
    assert "mat1 and mat2 shapes cannot be multiplied" in c["message"]
    assert any(shape == [256, 768] for key, shape in c["shapes"].items() if key.endswith("self.weight")), c["shapes"]

    info = run_cli("info", path)
    assert info.exit_code == 0
    assert f"crash      the server raised RuntimeError in draft extend (prefill) (iteration {c['iter']}): mat1 and mat2" \
        in info.output

    prompts_train = tmp_path / "train.jsonl"
    prompts_train.write_text('{"text": "def main():"}\n')
    train = tmp_path / "train.trace"
    rt = run_cli("record", "train", "--target", MODELS / "target", "--draft", MODELS / "draft",
              "--prompts", prompts_train, "-o", train)
    assert rt.exit_code == 0, rt.output
    d = run_cli("diff", train, path, "--format", "text")
    assert d.exit_code == 1, d.output
    first = " ".join(d.output.split("\n\n", 1)[0].split())  # the headline, unwrapped
    assert first.startswith("first divergence: serving crashed at draft.fc_in (seq 0 "), first
    assert "RuntimeError in draft extend (prefill)" in first
    assert "aux id 7 asks for the output of the target's last layer (8 layers)" in first


def _wait_model_info(srv, timeout_s: float = 600.0) -> None:
    import time

    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert srv.proc.poll() is None, Path(srv.log_path).read_text(errors="replace")[-3000:]
        try:
            if requests.get(srv.url + "/model_info", timeout=5).status_code == 200:
                return
        except requests.RequestException:  # not listening yet, or busy starting
            pass
        time.sleep(0.5)
    raise AssertionError("server not up")


# ---- the plugin's crash path, on fake SGLang objects with SGLang's names --------------------------
def _batch():
    from types import SimpleNamespace

    req = SimpleNamespace(rid="r0", origin_input_ids=[1, 2, 3, 4, 5, 6, 7])
    return SimpleNamespace(reqs=[req], forward_iter=0, forward_mode=SimpleNamespace(is_extend=lambda: True),
                           prefix_lens=[0], extend_lens=[7], seq_lens=torch.tensor([7]))


@pytest.mark.parametrize("where,forward", [("draft", "draft extend (prefill)"), ("target", "target prefill"),
                                           ("sampling", "eagle_sample (test_crash_evidence.py:")])
def test_an_exception_in_an_iteration_is_written_with_its_forward_and_the_trace_closed(
        tmp_path, monkeypatch, where, forward):
    from types import SimpleNamespace

    from specdiff.tracer.engines.options import Options
    from specdiff.tracer.engines.sglang import plugin as sglang_plugin
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.hooks import Recorder
    from specdiff.tracer.engines.writer.thread import AsyncTraceWriter

    path = tmp_path / "s.trace"
    rec = Recorder(Options(path=str(path)), SGLangAdapter("0.5.23", log=lambda m: None))
    rec.writer = AsyncTraceWriter(TraceWriter(str(path), side="serve", contract={"engine": "sglang"}), rec._write)
    monkeypatch.setattr(sglang_plugin, "_rec", rec)
    runner = SimpleNamespace(is_draft_worker=where == "draft", model=SimpleNamespace())
    fb = SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND"), input_ids=torch.zeros(7, dtype=torch.long),
                         positions=torch.arange(7))

    def model_forward(self, forward_batch):
        if where != "sampling":
            _raise_fc()
        return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=None, next_token_logits=None))

    def eagle_sample():
        raise RuntimeError("probabilities contain nan")

    def iteration(self, batch):
        sglang_plugin._around_runner_forward(model_forward, runner, fb)
        if where == "sampling":
            eagle_sample()

    with pytest.raises(RuntimeError, match="probabilities" if where == "sampling" else "mat1 and mat2"):
        sglang_plugin._around_iteration(iteration, SimpleNamespace(), _batch())
    t = open_trace(str(path))
    c = t.contract["crash"]
    assert t.closed and c["forward"].startswith(forward) and (c["iter"], c["kind"], c["rids"]) == (0, "prefill", ["r0"])
    if where != "sampling":
        assert c["shapes"]["Linear.forward: self.weight"] == [256, 768]
        assert c["forward_shapes"] == {"input_ids": [7], "positions": [7]}
    else:
        assert c["forward"].endswith("), outside the model forwards") and c["message"] == "probabilities contain nan"


def _raise_fc():
    torch.nn.Linear(768, 256, bias=False)(torch.zeros(7, 512))  # 2 slots against an fc for 3


def test_the_app_opens_a_crashed_serve_trace_on_the_crash(tmp_path, tui, fc_crash):
    import asyncio

    from specdiff.tui.app import SpecdiffApp

    crash = crash_record(fc_crash(), forward="draft extend (prefill)", iteration=0, kind="prefill", rids=["r0"])
    serve = _serve_trace(tmp_path / "serve.trace", _bad_draft(tmp_path), crash)
    train = _train_trace(tmp_path / "train.trace")
    app = SpecdiffApp(train, serve, export_root=tmp_path)

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            await tui.wait_for(pilot, lambda: app.report is not None, timeout=60)
            verdict = tui.static_text(app, "#verdict")
            await pilot.press("q")
            return verdict

    verdict = asyncio.run(run())
    assert verdict.startswith("first divergence: serving crashed at draft.fc_in (request r0): RuntimeError in draft "
                              "extend (prefill)"), verdict
    assert app.return_code == 1
