"""The SGLang EAGLE-3 recorder plugin against real SGLang 0.5.23 servers on this CPU.

Servers (stopped by PID through ``ServerProcess``): the untraced chain (the session's shared
``bringup_chain_server``, tests/conftest.py), and module-scoped: traced chain (random bring-up
pair; served through ``specdiff record serve`` and stopped by SIGTERM to it while its writer is
held back) and traced topk-2 tree (the always-accepted "oracle" pair, so accepted paths are longer
than one token).
The topk-2 server is SIGKILLed mid-request at the end to show that a killed server's trace
opens. Run with ``pytest -m server``. The first tests in this file need no server.
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

from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.sglang.attribution import _parents
from specdiff.tracer.engines.writer.alive import wait_for_writers, writer_pids
from specdiff.tracer.engines.writer.thread import AsyncTraceWriter
from specdiff.tracer.store import TraceWriter, open_trace

PROMPTS = ["def main():\n    return", "import os\nimport sys\n\nclass "]
MAX_NEW = 14


# ---- no server ------------------------------------------------------------------------------
def test_options_from_env():
    assert Options.from_env({}) is None
    o = Options.from_env({"SPECDIFF_TRACE": "/x", "SPECDIFF_CAPTURE": "full", "SPECDIFF_LOGITS_TOPK": "4",
                          "SPECDIFF_RIDS": "^a", "SPECDIFF_EAGER_DRAFT": "1"})
    assert (o.path, o.capture, o.logits_topk, o.rids, o.eager_draft) == ("/x", "full", 4, "^a", True)
    # unset or empty: the defaults
    o = Options.from_env({"SPECDIFF_TRACE": "/x", "SPECDIFF_CAPTURE": "", "SPECDIFF_LOGITS_TOPK": " "})
    assert (o.capture, o.logits_topk, o.max_queue_mb, o.rids, o.eager_draft) == ("default", 8, 256, None, False)
    assert Options.from_env({"SPECDIFF_TRACE": "/x", "SPECDIFF_CAPTURE": " FULL ",
                             "SPECDIFF_EAGER_DRAFT": "off"}).capture == "full"


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("SPECDIFF_CAPTURE", "fulll", "default or full"),
    ("SPECDIFF_LOGITS_TOPK", "eight", "an integer >= 1 (default 8)"),
    ("SPECDIFF_LOGITS_TOPK", "0", "an integer >= 1 (default 8)"),
    ("SPECDIFF_MAX_QUEUE_MB", "2GB", "an integer >= 1 (default 256)"),
    ("SPECDIFF_EAGER_DRAFT", "maybe", "1/true/yes/on or 0/false/no/off"),
    ("SPECDIFF_RIDS", "req-[", "a Python regular expression (this one: unterminated character set at position 4)"),
])
def test_a_bad_environment_value_is_one_error_naming_the_variable_the_value_and_what_is_accepted(name, value,
                                                                                               accepted):
    from specdiff.tracer.engines.options import OptionError
    from specdiff.tracer.errors import SpecdiffError

    with pytest.raises(OptionError) as err:
        Options.from_env({"SPECDIFF_TRACE": "/x", name: value})
    assert str(err.value) == f"{name}={value!r} is not valid; accepted values: {accepted}"
    assert isinstance(err.value, SpecdiffError) and err.value.name == name


def test_a_bad_environment_value_refuses_tracing_in_one_log_line_of_the_scheduler(tmp_path, caplog):
    from specdiff.tracer.engines.sglang import plugin as sglang_plugin

    env = {"SPECDIFF_TRACE": str(tmp_path / "s.trace"), "SPECDIFF_LOGITS_TOPK": "-3"}

    def run_scheduler_process(tp_rank, dp_rank):  # the name load() looks for up the stack
        return sglang_plugin.load(env)

    with caplog.at_level("WARNING", logger="specdiff.tracer"):
        assert sglang_plugin.load(env) is False  # not a scheduler: nothing logged
        assert caplog.records == []
        assert run_scheduler_process(0, None) is False
    assert [r.getMessage() for r in caplog.records] == [
        "specdiff: tracing refused: SPECDIFF_LOGITS_TOPK='-3' is not valid; accepted values: an integer >= 1 "
        "(default 8); the server runs untraced"]
    assert sglang_plugin._rec is None and not (tmp_path / "s.trace").exists()


def test_plugin_is_inert_outside_the_scheduler(monkeypatch):
    from specdiff.tracer.engines.sglang import plugin as sglang_plugin

    monkeypatch.delenv("SPECDIFF_TRACE", raising=False)
    assert sglang_plugin.load() is False
    # asked for, but not called from SGLang's run_scheduler_process: nothing registered
    assert sglang_plugin.load({"SPECDIFF_TRACE": "/tmp/never"}) is False
    assert sglang_plugin._rec is None


def test_tree_parents_from_sibling_links():
    # root 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}
    nt = np.array([1, 3, 5, -1, -1, -1])
    ns = np.array([-1, 2, -1, 4, -1, -1])
    assert _parents(nt, ns).tolist() == [-1, 0, 0, 1, 1, 2]


def test_async_writer_counts_drops_and_survives_failure(tmp_path):
    gate = threading.Event()

    def slow(tw, item):
        gate.wait(5)
        tw.append("verify.accept_length", np.array([item]), seq=0, pos=item)

    tw = TraceWriter(str(tmp_path / "a.trace"), side="serve")
    aw = AsyncTraceWriter(tw, slow, max_items=2)
    results = [aw.submit(i) for i in range(6)]
    assert results.count(False) >= 3 and aw.dropped == results.count(False)
    gate.set()
    assert aw.close()
    t = open_trace(str(tmp_path / "a.trace"))
    assert t.closed and t.contract["dropped_records"] == aw.dropped
    assert t.rows("verify.accept_length") == 6 - aw.dropped

    def broken(tw, item):
        raise RuntimeError("disk full")

    tw2 = TraceWriter(str(tmp_path / "b.trace"), side="serve")
    aw2 = AsyncTraceWriter(tw2, broken)
    aw2.submit(1)
    for _ in range(100):
        if aw2.failed:
            break
        time.sleep(0.02)
    assert aw2.failed and not aw2.active and aw2.submit(2) is False


def test_a_trace_cut_at_any_journal_write_has_no_target_row_past_its_tokens(tmp_path):
    """A SIGKILLed server's trace ends at an arbitrary journal write. Seen on SGLang 0.5.20 (CPU,
    loaded machine): rows of a request's first decode iteration were journaled, its tokens were
    not, and the target rows at t had no token x_{t+1}. Invariant checked at every write: a
    ``target.*`` row at t is written only once the sequence holds t + 2 tokens."""
    from specdiff.tracer.engines.sglang.attribution import IterCapture, write_capture
    from specdiff.tracer.engines.sglang.hooks import Recorder

    H, K, N = 4, 3, 4  # hidden size, aux layers, draft tokens (chain, topk 1)
    rec = Recorder(Options(path=str(tmp_path / "k.trace")))
    rec.hidden_size, rec.num_aux, rec.topk = H, K, 1
    rec.recorded["r"] = "all"  # what the sampler decides at the request's first hook (no SPECDIFF_SAMPLE)
    tw = TraceWriter(rec.opts.path, side="serve")
    violations = []
    append = tw.append

    def checked_append(name, data, *, seq, pos, **kw):
        if name.startswith("target."):
            for sq, t in zip(np.broadcast_to(seq, np.shape(pos)).tolist(), np.ravel(pos).tolist()):
                if len(tw._sequences[sq].tokens) < t + 2:
                    violations.append((name, sq, t, len(tw._sequences[sq].tokens)))
        return append(name, data, seq=seq, pos=pos, **kw)

    tw.append = checked_append
    prefill = IterCapture(iter=0, kind="prefill", rids=["r"], prompts={"r": [5, 6, 7]}, prefix_lens=[0],
                          extend_lens=[3])
    prefill.t.update(target_aux=torch.randn(3, K * H), next_token_ids=torch.tensor([8]))
    write_capture(rec, tw, prefill)
    decode = IterCapture(iter=1, kind="decode", rids=["r"])  # committed length 3, accepts 3 of 4
    decode.t.update(seq_lens=torch.tensor([3]), predict=torch.tensor([9, 10, 11, 12]),
                    accept_lens=torch.tensor([3]), accept_index=torch.tensor([[0, 1, 2, -1]]),
                    target_aux=torch.randn(N, K * H), verify_positions=torch.arange(3, 3 + N))
    write_capture(rec, tw, decode)
    assert violations == []
    tw.close()
    t = open_trace(rec.opts.path)
    assert t.sequences[0].tokens.tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert t.rows("target.aux.0") == 3 + 3  # prompt rows + the accepted rows


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
    """The traced chain served as a user runs it (issue 44 part 4): ``specdiff record serve --cpu``
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
    far the trace got, and the trace holds all 3, closed (issue 44 part 4: it kept 1 of 8)."""
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


# ---- CLI helpers (no server) ----------------------------------------------------------------
def test_record_serve_command_and_env(tmp_path):
    from specdiff.tui.cmd_record import serve_command, trace_env

    env = trace_env(str(tmp_path / "t.trace"), "full", 4, "^r", True, base={"PATH": "/bin"})
    assert env["SPECDIFF_TRACE"].endswith("t.trace") and env["SPECDIFF_CAPTURE"] == "full"
    assert env["SPECDIFF_LOGITS_TOPK"] == "4" and env["SPECDIFF_RIDS"] == "^r" and env["SPECDIFF_EAGER_DRAFT"] == "1"
    argv, env2 = serve_command("sglang", ["--model-path", "M"], cpu=False, env=env)
    assert argv[1:] == ["-m", "sglang.launch_server", "--model-path", "M"] and env2 is env
    argv, env3 = serve_command("sglang", ["--model-path", "M"], cpu=True, env=env)
    assert argv[1].endswith("serve.py") and "--device" in argv and argv[-2:] == ["--model-path", "M"]
    assert env3["SGLANG_USE_CPU_ENGINE"] == "1" and env3["SPECDIFF_TRACE"] == env["SPECDIFF_TRACE"]


def test_record_cli_errors_are_one_line(tmp_path, run_cli):


    r = run_cli("record", "serve", "--cpu")
    assert r.exit_code == 2 and "no SGLang arguments" in r.output
    (tmp_path / "exists.trace").mkdir()
    r = run_cli("record", "serve", "--trace", str(tmp_path / "exists.trace"), "--", "--model-path", "M")
    assert r.exit_code == 2 and "already exists" in r.output
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "a"}\n{"nope": 1}\n')
    r = run_cli("record", "client", "--url", "http://127.0.0.1:9", "--prompts", str(bad))
    assert r.exit_code == 2 and "p.jsonl:2" in r.output


def test_read_prompts(tmp_path):
    from specdiff.tui.serve_http import read_prompts

    p = tmp_path / "p.jsonl"
    p.write_text('"plain"\n\n{"prompt": "b", "max_new_tokens": 3}\n{"input_ids": [1, 2]}\n')
    assert read_prompts(str(p)) == [{"text": "plain"}, {"prompt": "b", "max_new_tokens": 3}, {"input_ids": [1, 2]}]


def test_async_writer_bounds_queued_bytes(tmp_path):
    gate = threading.Event()

    class Item:
        def __init__(self, n):
            self.n = n

        def nbytes(self):
            return 600

    def slow(tw, item):
        gate.wait(5)

    aw = AsyncTraceWriter(TraceWriter(str(tmp_path / "c.trace"), side="serve"), slow, max_items=100, max_bytes=1000)
    ok = [aw.submit(Item(i)) for i in range(4)]
    # the first is taken by the thread (or queued), at most one more fits under 1000 bytes
    assert ok[0] and ok.count(True) <= 2 and aw.dropped == ok.count(False)
    gate.set()
    assert aw.close()
    assert aw.queued_bytes == 0


def test_plugin_registers_only_in_scheduler_rank0(monkeypatch, tmp_path, caplog):
    pytest.importorskip("sglang")
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    from specdiff.tracer.engines.sglang import plugin as sglang_plugin

    registered = []

    def _fresh():
        monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, t, h, ht: registered.append(t)))
        monkeypatch.setattr(sglang_plugin, "_install_sigterm", lambda: None)
        monkeypatch.setattr(sglang_plugin.atexit, "register", lambda *a, **k: None)
        monkeypatch.setattr(sglang_plugin, "_rec", None)

    _fresh()
    env = {"SPECDIFF_TRACE": str(tmp_path / "s.trace")}

    def run_scheduler_process(tp_rank, dp_rank):  # the name load() looks for up the stack
        return sglang_plugin.load(env)

    assert run_scheduler_process(1, None) is False and not registered  # TP rank 1: nothing
    # an SGLang without an essential name: refused, nothing registered
    monkeypatch.delattr(EAGLEWorkerV2, "forward_batch_generation")
    with caplog.at_level("WARNING", logger="specdiff.tracer"):
        assert run_scheduler_process(0, None) is False
    assert f"tracing refused: SGLang {_sglang_version()} lacks EAGLEWorkerV2.forward_batch_generation" in caplog.text
    assert not registered
    monkeypatch.undo()
    _fresh()
    # an SGLang without one non-essential hook target: the others are registered, that one is named
    monkeypatch.delattr(EagleDraftWorker, "_draft_extend_for_prefill")
    caplog.clear()
    with caplog.at_level("WARNING", logger="specdiff.tracer"):
        assert run_scheduler_process(0, 2) is True
    gone = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill"
    assert set(registered) == set(sglang_plugin.HOOKS) - {gone}
    lines = [r.getMessage() for r in caplog.records if "has no" in r.getMessage()]
    assert len(lines) == 1 and "EagleDraftWorker._draft_extend_for_prefill" in lines[0] and "draft.topk" in lines[0]
    assert sglang_plugin._rec.opts.path == str(tmp_path / "s.trace" / "dp2")  # one store per DP replica


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
