"""The SGLang EAGLE-3 recorder plugin against real SGLang 0.5.23 servers on this CPU.

Servers (stopped by PID through ``ServerProcess``): the untraced chain (the session's shared
``bringup_chain_server``, tests/conftest.py), and module-scoped: traced chain (random bring-up
pair; served through ``specdiff record serve`` and stopped by SIGTERM to it while its writer is
held back) and traced topk-2 tree (the always-accepted "oracle" pair, so accepted paths are longer
than one token).
The topk-2 server is SIGKILLed mid-request at the end to show that a killed server's trace
opens. Run with ``pytest -m server``. What needs no server is beside it: the plugin and its options
in test_sglang_plugin.py, what the recorder writes in test_recorder_writes.py, ``record``'s command line in
tests/tui/test_cmd_record.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import assert_target_logits_hold_the_greedy_token

from specdiff.tracer.engines.writer.alive import wait_for_writers, writer_pids
from specdiff.tracer.store import open_trace

PROMPTS = ["def main():\n    return", "import os\nimport sys\n\nclass "]
MAX_NEW = 14


# ---- real servers ---------------------------------------------------------------------------
def _sglang_version() -> str:
    """The installed SGLang's version (the adapter's messages name it; tests also run on 0.5.19/0.5.20)."""
    from importlib.metadata import version

    return version("sglang")


server = pytest.mark.server


@pytest.fixture(scope="module")
def models(bringup_models):
    pytest.importorskip("sglang")
    return {"target": bringup_models.target, "draft": bringup_models.draft,
            "oracle_target": bringup_models.oracle_target, "oracle_draft": bringup_models.oracle_draft}


def _server(server_env, target, draft, spec, *, trace, **env_extra):
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess

    return ServerProcess(target, draft_model_path=draft, spec=spec,
                         env=server_env(SPECDIFF_TRACE=str(trace), **env_extra))


def _chain():
    from specdiff.tracer.engines.sglang.cpu.launch import SpecSettings

    return SpecSettings(num_steps=3, topk=1, num_draft_tokens=4)


@pytest.fixture(scope="module")
def untraced(bringup_chain_server):
    """The untraced chain's outputs: the session's shared server (the same pair and chain)."""
    return bringup_chain_server.fresh().generate(PROMPTS, max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def traced(models, tmp_path_factory, run_cli, server_env):
    """The traced chain served as a user runs it: ``specdiff record serve --cpu``
    (SGLang's own spawn), stopped by SIGTERM to record serve as its banner offers while its trace
    writer lags as far as it can: the writer process handles no capture while a pause file exists
    (``SPECDIFF_WRITER_TEST_PAUSE_FILE``, read by tracer/engines/writer/child.py only), from before
    the first request until record serve, the server gone (SGLang's stop SIGKILLs the server's process
    tree: tokenizer_manager.py:3559), has said twice how far the trace got. Every finished request
    must still be written and the trace closed."""
    from specdiff.tracer.engines.server import free_port
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess

    root = tmp_path_factory.mktemp("rec")
    path, pause, log = root / "chain.trace", root / "writer.pause", root / "record-serve.log"
    pause.touch()
    port = free_port()
    argv = [sys.executable, "-m", "specdiff.tui", "record", "serve", "--cpu", "--trace", str(path), "--",
            "--model-path", str(models["target"]), "--host", "127.0.0.1", "--port", str(port),
            *_chain().args(models["draft"])]
    env = server_env(SPECDIFF_SGLANG_START="spawn", SPECDIFF_WRITER_TEST_PAUSE_FILE=str(pause))
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    srv = ServerProcess(models["target"], port=port, log_path=log)  # talks to record serve's server
    srv.proc = proc
    stopped = False
    try:
        deadline = time.monotonic() + srv.startup_timeout_s
        while not _healthy(srv.url):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        # one /generate call with 2 prompts: SGLang batches them (concurrent requests)
        out = srv.generate(PROMPTS, max_new_tokens=MAX_NEW)
        # `specdiff record client` against the same traced server
        prompts = root / "prompts.jsonl"
        prompts.write_text('{"text": "for i in range(3):"}\n')
        client = run_cli("record", "client", "--url", srv.url, "--prompts", prompts, "--max-new-tokens", "5")
        held = len(open_trace(str(path)).sequences)  # what the trace held when the stop came
        proc.send_signal(signal.SIGTERM)
        stopped = True
        deadline = time.monotonic() + 180
        while log.read_text(errors="replace").count(" so far") < 2 and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        waited = log.read_text(errors="replace")
    finally:
        pause.unlink(missing_ok=True)
        if not stopped and proc.poll() is None:  # failed before the stop: stop it (record serve forwards it)
            proc.send_signal(signal.SIGTERM)
    rc = proc.wait(300)
    said = log.read_text(errors="replace")
    return {"out": out, "path": path, "client": client, "held": held, "waited": waited, "said": said, "rc": rc}


def _healthy(url: str) -> bool:
    import requests

    try:
        return requests.get(url + "/health", timeout=5).status_code == 200
    except requests.RequestException:  # not listening yet
        return False


@pytest.fixture(scope="module")
def tree(models, tmp_path_factory, server_env):
    """topk-2 tree server; killed with SIGKILL in the middle of a long last request."""
    from specdiff.tracer.engines.sglang.cpu.launch import SpecSettings

    path = tmp_path_factory.mktemp("rec") / "tree.trace"
    spec = SpecSettings(num_steps=3, topk=2, num_draft_tokens=4)
    srv = _server(server_env, models["oracle_target"], models["oracle_draft"], spec, trace=path,
                  SPECDIFF_CAPTURE="full", SPECDIFF_LOGITS_TOPK="4")
    srv.start()
    try:
        out = srv.generate(PROMPTS, max_new_tokens=MAX_NEW)
        closed_before = open_trace(str(path)).closed
        rows_before = open_trace(str(path)).rows("verify.accept_length")
        th = threading.Thread(target=lambda: _swallow(srv.generate, "x = ", max_new_tokens=400), daemon=True)
        th.start()
        deadline = time.monotonic() + 120
        while open_trace(str(path)).rows("verify.accept_length") < rows_before + 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert writer_pids(str(path)), "the trace's writer process runs"
        os.killpg(srv.pid, signal.SIGKILL)  # the whole server: no atexit, no SIGTERM handler
        srv.proc.wait(30)
        th.join(30)
        # the writer process (out of the server's tree, nice 19) writes what the ring holds, then
        # exits: on a loaded machine that comes well after the kill, so the trace is read once it is gone
        assert wait_for_writers(str(path), timeout_s=180) == []
    finally:
        srv.stop()
    return {"out": out, "path": path, "closed_before_kill": closed_before, "rows_before": rows_before}


#: Loaded by the server's Python at start-up (a ``sitecustomize`` on PYTHONPATH): after SGLang
#: builds the EAGLE-3 draft's LlamaModel, its ``norm_before_fc`` attribute is deleted, as if a
#: new SGLang release had renamed it. SGLang reads that attribute only inside ``__init__``
#: (llama_eagle3.py:173-176 decides ``input_norm`` from it), so what the server computes is
#: unchanged; only the recorder, which reads it for the contract, loses it.
RENAME_SITECUSTOMIZE = """
import importlib.abc, importlib.util, sys

_TARGET = "sglang.srt.models.llama_eagle3"


class _RenameNormBeforeFc(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            init = module.LlamaModel.__init__

            def __init__(self, *a, **kw):
                init(self, *a, **kw)
                del self.norm_before_fc

            module.LlamaModel.__init__ = __init__

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _RenameNormBeforeFc())
"""


@pytest.fixture(scope="module")
def renamed(models, tmp_path_factory, server_env):
    """Traced chain server whose SGLang lacks the draft's ``norm_before_fc`` attribute."""
    root = tmp_path_factory.mktemp("renamed")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(RENAME_SITECUSTOMIZE)
    path = root / "renamed.trace"
    srv = _server(server_env, models["target"], models["draft"], _chain(), trace=path,
                  PYTHONPATH=os.pathsep.join([str(root / "site"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    srv.start()
    try:
        out = srv.generate(PROMPTS, max_new_tokens=MAX_NEW)
    finally:
        srv.stop()
    return {"out": out, "path": path, "log": Path(srv.log_path).read_text(errors="replace")}


@server
def test_a_renamed_sglang_attribute_is_one_warning_an_unknown_fact_and_unchanged_outputs(renamed, untraced,
                                                                                          run_cli):


    lines = [ln for ln in renamed["log"].splitlines() if "specdiff:" in ln and " has no " in ln]
    assert len(lines) == 1, lines
    assert f"SGLang {_sglang_version()} has no Eagle3LlamaModel.norm_before_fc (srt/models/llama_eagle3.py:173;" in lines[0]
    assert lines[0].endswith("now unobservable: contract facts norm_before_fc")
    trace = open_trace(str(renamed["path"]))
    c = trace.contract
    assert c["norm_before_fc"] == "unknown" and c["fc_norm"] is False  # the other norm fact is still read
    assert [u["name"] for u in c["unobservable"]] == ["Eagle3LlamaModel.norm_before_fc"]
    assert c["aux_hf_indices"] == [2, 4, 5] and trace.rows("draft.fc_out") > 0  # everything else recorded
    # what the server computed is what the untraced server computed on the same path
    assert [o["output_ids"] for o in renamed["out"]] == [o["output_ids"] for o in untraced]
    r = run_cli("info", str(renamed["path"]))
    assert r.exit_code == 0
    assert f"norm_before_fc           SGLang {_sglang_version()} has no Eagle3LlamaModel.norm_before_fc" in r.output


def _swallow(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except Exception:  # noqa: BLE001 - the server is killed under this request
        pass


def _by_rid(trace):
    return {s.rid: s for s in trace.sequences}


def _rows(trace, name, seq):
    k = trace.keys(name)
    sel = np.where(k["seq"] == seq)[0]
    return trace.read(name)[sel], {c: v[sel] for c, v in k.items()}


def _check_accept_and_tokens(trace, outs):
    seqs = _by_rid(trace)
    for o in outs:
        meta = o["meta_info"]
        s = seqs[meta["id"]]  # right rid -> right sequence
        acc, keys = _rows(trace, "verify.accept_length", s.id)
        assert len(acc) == meta["spec_verify_ct"]
        gen = o["output_ids"]
        # prefill gives the first token; each verify step commits accept_length tokens
        assert sum(acc) >= len(gen) - 1 and sum(acc) - int(acc[-1]) < len(gen) - 1
        assert np.isclose(len(gen) / len(acc), meta["spec_accept_length"])
        assert s.tokens[s.prompt_len:s.prompt_len + len(gen)].tolist() == gen
        # accepted tokens, in iteration order, are the generated tokens
        toks, k2 = _rows(trace, "verify.accepted_tokens", s.id)
        order = np.argsort(k2["iter"], kind="stable")
        committed = [int(x) for row, a in zip(toks[order], acc[order]) for x in row[:a]]
        assert committed[:len(gen) - 1] == gen[1:]
        # rows are keyed at the committed length, which grows by accept_length
        pos = keys["pos"][order]
        assert (np.diff(pos) == acc[order][:-1]).all()
        assert pos[0] == s.prompt_len


def _check_aux_vs_hf(trace, target_path):
    from specdiff.replay.model.target_capture import capture_target, load_target

    model = load_target(target_path)
    idx = trace.contract["aux_hf_indices"]
    assert idx == sorted(idx) and len(idx) == 3
    checked = 0
    for s in trace.sequences:
        _, k = _rows(trace, "target.aux.0", s.id)
        if not len(k["pos"]):
            continue
        T = int(k["pos"].max()) + 1
        assert len(s.tokens) >= T
        cap = capture_target(model, torch.as_tensor(s.tokens[:T].astype(np.int64))[None], idx)
        for j in range(len(idx)):
            data, kk = _rows(trace, f"target.aux.{j}", s.id)
            ref = cap.aux[j][0, kk["pos"]].float().numpy()
            got = data.astype(np.float32)
            rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
            cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
            assert rel.max() < 3e-2 and cos.min() > 0.999, (j, rel.max(), cos.min())
            checked += len(rel)
        cat, _ = _rows(trace, "target.aux_cat", s.id)
        parts = [_rows(trace, f"target.aux.{j}", s.id)[0] for j in range(len(idx))]
        assert np.array_equal(cat, np.concatenate(parts, axis=1))
    assert checked > 0


def _check_mapped_ids(trace, draft_path):
    from safetensors.torch import load_file

    d2t = load_file(str(Path(draft_path) / "model.safetensors"))["d2t"].to(torch.int64).numpy()
    hot = d2t + np.arange(len(d2t))
    from specdiff.tracer.contract import sha256_array

    assert trace.contract["hot_token_id_sha256"] == sha256_array(hot.astype(np.int64))
    assert trace.contract["d2t_sha256"] == sha256_array(d2t)
    ids, k1 = trace.read("draft.topk"), trace.keys("draft.topk")
    mapped, k2 = trace.read("draft.topk_target"), trace.keys("draft.topk_target")

    def group(keys, data):
        out = {}
        for i in range(len(data)):
            out.setdefault((int(keys["seq"][i]), int(keys["pos"][i]), int(keys["depth"][i])), []).append(data[i])
        return out

    g1, g2 = group(k1, ids), group(k2, mapped)
    common = [key for key in g2 if key in g1]
    assert len(common) >= 0.8 * len(g2) > 0
    for key in common:
        a, b = np.stack(g1[key]), np.stack(g2[key])
        assert np.array_equal(hot[a], b), key
        assert np.array_equal(a + d2t[a], b), key


@server
def test_traced_and_untraced_greedy_tokens_are_identical(traced, untraced):
    """Also: SGLang's scheduler started by spawn (traced) and by fork (the shared untraced server,
    tests/conftest.py SERVER_START) computes the same greedy tokens."""
    assert [o["output_ids"] for o in traced["out"]] == [o["output_ids"] for o in untraced]
    assert all(o["meta_info"]["completion_tokens"] == MAX_NEW for o in untraced)


@server
def test_chain_trace_accept_lengths_tokens_and_rids(traced):
    trace = open_trace(str(traced["path"]))
    assert trace.closed, "a server stopped with SIGTERM closes its trace"
    c = trace.contract
    assert (c["engine"], c["spec_topk"], c["spec_steps"], c["spec_draft_tokens"]) == ("sglang", 1, 3, 4)
    assert c["aux_native_ids"] == [1, 3, 4] and c["aux_hf_indices"] == [2, 4, 5] and c["dropped_records"] == 0
    assert c["engine_process_start"] == "spawn"  # read in the scheduler: SGLang's own start, as users run it
    rids = {s.rid for s in trace.sequences}
    assert {o["meta_info"]["id"] for o in traced["out"]} <= rids and len(rids) == 3  # + the CLI client's
    _check_accept_and_tokens(trace, traced["out"])
    for name in ("tokens", "target.aux_cat", "draft.fc_out", "draft.hidden_out", "draft.logits_topk.values",
                 "draft.logits_topk.ids", "draft.logsumexp", "draft.topk", "draft.topk_target",
                 "verify.draft_tokens", "verify.parents", "verify.predict", "verify.accept_index",
                 "verify.retrieve_index", "target.argmax"):
        assert trace.rows(name) > 0, name
    # draft depths 0..steps-1 recorded; the logits top-k ids start with the draft's top-1
    assert set(trace.keys("draft.topk")["depth"].tolist()) == {0, 1, 2}
    # greedy: target.argmax at t is the token at t+1, the best of the target's recorded logits there
    for s in trace.sequences:
        am, k = _rows(trace, "target.argmax", s.id)
        assert (am == s.tokens[k["pos"] + 1]).all()
    assert_target_logits_hold_the_greedy_token(trace)


@server
def test_a_stop_while_the_writer_lags_keeps_every_finished_request(traced):
    """SIGTERM to record serve while its writer had written none of the 3 finished requests: the
    writer outlives SGLang's kill of the server's process tree, record serve waits for it saying how
    far the trace got, and the trace holds all 3, closed (it kept 1 of 8)."""
    said, path = traced["said"], traced["path"]
    assert traced["held"] == 0 and traced["rc"] == 0, said[-3000:]
    assert "specdiff: waiting for the trace writer (pid " in traced["waited"], said[-3000:]
    assert traced["waited"].index("specdiff: server exited (") < traced["waited"].index("waiting for the trace writer")
    assert re.search(r"specdiff: +\d+ s: \d+ records, 0 requests written so far", traced["waited"]), said[-3000:]
    trace = open_trace(str(path))
    assert trace.closed and len(trace.sequences) == 3
    assert f"specdiff: trace {path}: 3 requests (sequences), {trace.records} records, closed" in said, said[-3000:]
    assert writer_pids(str(path)) == []


@server
def test_record_client_reports_accept_lengths(traced):
    r = traced["client"]
    assert r.exit_code == 0, r.output
    assert "accept length" in r.output and "finalized when the server stops" in r.output


@server
def test_chain_trace_aux_equals_hf_hidden_states(traced, models):
    _check_aux_vs_hf(open_trace(str(traced["path"])), models["target"])


@server
def test_chain_trace_mapped_ids(traced, models):
    _check_mapped_ids(open_trace(str(traced["path"])), models["draft"])


@server
def test_tree_trace(tree, models):
    trace = open_trace(str(tree["path"]))
    assert tree["closed_before_kill"] is False
    assert not trace.closed and trace.rows("verify.accept_length") >= tree["rows_before"] + 3
    assert trace.contract["spec_topk"] == 2
    assert trace.contract["engine_process_start"] == "fork"  # the suite's servers (tests/conftest.py SERVER_START)
    # the two finished requests: accept lengths, tokens, rids as in meta_info
    _check_accept_and_tokens(trace, tree["out"])
    parents = trace.read("verify.parents")
    assert parents.shape[1] == 4 and (parents[:, 0] == -1).all()
    assert any(np.bincount(p[p >= 0]).max() >= 2 for p in parents), "a real tree: some node has 2 children"
    assert trace.info("draft.topk").shape == (2,)
    _check_aux_vs_hf(trace, models["oracle_target"])
    _check_mapped_ids(trace, models["oracle_draft"])
    assert_target_logits_hold_the_greedy_token(trace)  # a tree's verify: the accepted nodes' rows
    # capture level full: full draft logits, consistent with the top-k and logsumexp rows
    c = trace.contract
    assert (c["capture_level"], c["logits_topk"]) == ("full", 4)
    full = trace.read("draft.logits")
    assert full.shape[1] == c["draft_vocab_size"] and trace.info("draft.logits_topk.values").shape == (4,)
    assert trace.rows("draft.logits") == trace.rows("draft.logits_topk.values")
    vals = trace.read("draft.logits_topk.values")
    assert np.allclose(np.sort(full, axis=1)[:, ::-1][:, :4], vals)
    lse = torch.logsumexp(torch.as_tensor(full, dtype=torch.float32), dim=1).numpy()
    assert np.allclose(lse, trace.read("draft.logsumexp"), atol=1e-4)


#: Contract fields that decide the draft's computation, read from live objects on both sides.
COMPUTATION_FIELDS = ("spec_algorithm", "aux_hf_indices", "aux_concat_order", "embed_sha256", "embed_source",
                      "lm_head_sha256", "lm_head_source", "rope_theta", "rope_scaling", "rope_style",
                      "norm_before_fc", "fc_norm", "norm_output", "d2t_sha256", "hot_token_id_sha256",
                      "tokenizer_sha256", "chat_template_sha256", "bos_added", "draft_vocab_size")


@server
def test_serving_and_training_contracts_agree_field_by_field_on_a_correct_pair(traced, models, tmp_path):
    from specdiff.replay.diff.contract.check import check_contracts
    from specdiff.replay.diff.types import Pair
    from specdiff.replay.record.record_train import record_train

    serve = open_trace(str(traced["path"]))
    out = tmp_path / "train.trace"
    record_train(models["target"], models["draft"], str(out), replay=str(traced["path"]))
    train = open_trace(str(out))
    for f in COMPUTATION_FIELDS:
        assert f in serve.contract and f in train.contract, f
        assert serve.contract[f] != "unknown", f
    assert {f: serve.contract[f] for f in COMPUTATION_FIELDS} == {f: train.contract[f] for f in COMPUTATION_FIELDS}
    assert serve.contract["embed_source"] == "target" and serve.contract["spec_algorithm"] == "EAGLE3"
    assert serve.contract["graph_hidden_stages"] == []  # set after _capture_cuda_graphs (none on a CPU)
    assert not [m for m in check_contracts(Pair(train, serve)) if m.field in COMPUTATION_FIELDS]
