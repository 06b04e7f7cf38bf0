"""``specdiff watch`` attached to live traced SGLang 0.5.23 servers on this CPU (it alerts when serving drifts from training).

Two servers, both the demo pair (``traces/models``) traced with ``SPECDIFF_TRACE``; the watch
always replays the draft as trained:

- served with the correct ids: a live watch (subprocess, ``--json``, Prometheus on) replays each
  request as it finishes, without an alert; it is SIGKILLed, more requests are served, and a
  ``--once`` run resumes: it replays only the new requests. No alert over all of them.
- served with the seed's mistake (``demo/scenarios.py`` scenario ``seed``): a live watch prints one
  ALERT line naming ``target.aux.*`` after the first request, before a second one is sent; a
  ``--once --json`` run over every request exits 1 with the alert and its minimal-repro slice.

The tests before them need no server (a hand-written serving trace that grows, the rolling
window, a refused watch folder).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.tracer.store import TraceWriter, open_trace

MAX_NEW = 24
SETTLE = "2"


# ---- no server ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "says"), [("{", "unreadable watch state"),
                                             ('{"format": 99}', "not a specdiff watch state of format 1")])
def test_a_damaged_or_foreign_state_file_is_one_error_saying_what_to_do(tmp_path, text, says):
    from specdiff.replay.watch.state import STATE_NAME, WatchState, WatchStateError

    (tmp_path / STATE_NAME).write_text(text)
    with pytest.raises(WatchStateError, match=says):
        WatchState(tmp_path, str(tmp_path / "serve.trace"))


def test_a_training_trace_given_as_serve_is_one_error(tmp_path):
    from specdiff.replay.watch.follow import FinishedRequests
    from specdiff.tracer.errors import TraceError

    path = str(tmp_path / "train.trace")
    TraceWriter(path, side="train").close()
    with pytest.raises(TraceError, match="a train trace; --serve takes the trace a traced server writes"):
        FinishedRequests(path).poll()


def test_a_request_counts_as_finished_once_its_tokens_stop_growing_or_the_trace_closes(tmp_path):
    from specdiff.replay.watch.follow import FinishedRequests

    now = [0.0]
    path = str(tmp_path / "serve.trace")
    w = TraceWriter(path, side="serve", contract={"sampled_requests": {"r1": "fraction", "r0": "marked"},
                                                  "dropped_requests": ["r0"]})
    w.add_sequence([1, 2, 3], prompt_len=3, rid="r0")  # prompt only: not finished however long it waits
    w.add_sequence([1, 2, 3, 4], prompt_len=3, rid="r1")
    follow = FinishedRequests(path, settle_s=2.0, clock=lambda: now[0])
    assert follow.poll()[1] == []  # first sight: nothing has been seen unchanged yet
    now[0] = 1.0
    w.add_sequence([1, 2, 3, 4, 5], prompt_len=3, rid="r1", seq_id=1)  # r1 still decoding
    assert follow.poll()[1] == []
    now[0] = 2.5
    assert follow.poll()[1] == []  # r1 changed at t=1: 1.5 s unchanged < settle
    now[0] = 3.5
    done = follow.poll()[1]
    assert [(r.key, r.seq_id, r.tokens.tolist(), r.reason, r.dropped) for r in done] == [
        ("r1", 1, [1, 2, 3, 4, 5], "fraction", False)]
    now[0] = 10.0
    assert follow.poll()[1] == [] and follow.pending() == 1  # said once; r0 has no generated token
    w.close()
    trace, done = follow.poll()
    assert trace.closed and [(r.key, r.dropped) for r in done] == [("r0", True)] and follow.pending() == 0


def test_requests_with_nothing_to_replay_are_reported_and_kept_as_done_without_loading_models(tmp_path):
    from specdiff.replay.watch.watcher import Watcher

    path = str(tmp_path / "serve.trace")
    with TraceWriter(path, side="serve", contract={"dropped_requests": ["gone"]}) as w:
        w.add_sequence([5], prompt_len=1, rid="short")
        w.add_sequence([1, 2, 3, 4], prompt_len=2, rid="gone")

    def load_side(contract):
        raise AssertionError("no request needs the models")

    events = []
    watcher = Watcher(path, tmp_path / "watch", load_side=load_side, on_event=events.append, settle_s=0)
    assert watcher.run(once=True) == 0
    skipped = {e.data["key"]: e.data["why"] for e in events if e.kind == "skipped"}
    assert skipped == {"short": "fewer than 2 tokens: no draft row",
                       "gone": "dropped by the recorder (its writer fell behind): rows missing"}
    assert [e.kind for e in events] == ["start", "skipped", "skipped", "end"]
    again = []
    Watcher(path, tmp_path / "watch", load_side=load_side, on_event=again.append).run(once=True)
    assert [e.kind for e in again] == ["start", "end"] and again[0].data["resumed"] == 2


def test_rolling_acceptance_pools_the_last_requests_by_their_samples():
    from specdiff.replay.watch.rolling import RollingAcceptance

    roll = RollingAcceptance(window=2)
    roll.add("serve", {"per_depth": [1.0, 0.0], "mean_accept_length": 2.0, "samples": 1})
    roll.add("serve", {"per_depth": [0.5, 0.5], "mean_accept_length": 2.0, "samples": 3})
    roll.add("serve", {"per_depth": None, "mean_accept_length": None, "samples": 0})  # nothing recorded: kept out
    assert roll.summary("serve") == {"per_depth": [0.625, 0.375], "mean_accept_length": 2.0, "requests": 2}
    roll.add("serve", {"per_depth": [0.0, 0.0], "mean_accept_length": 1.0, "samples": 1})  # the first one leaves
    s = roll.summary("serve")
    assert s["per_depth"] == [0.375, 0.375] and s["mean_accept_length"] == 1.75 and s["requests"] == 2
    assert roll.summary("train")["requests"] == 0


def test_a_watch_folder_of_another_serving_trace_is_refused_in_one_line(tmp_path, run_cli):
    out = tmp_path / "watch"
    out.mkdir()
    (out / "watch-state.json").write_text(json.dumps({"format": 1, "serve": "/elsewhere/serve.trace",
                                                      "segments": [], "requests": {}}))
    res = run_cli("watch", "--serve", tmp_path / "serve.trace", "--draft", tmp_path, "--target", tmp_path,
                  "--out", out, "--once")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"specdiff: error: {out}: holds the watch of /elsewhere/serve.trace, not {tmp_path / 'serve.trace'}; "
        "give another --out"]


# ---- real servers ---------------------------------------------------------------------------------
def _served(tmp_path: Path, scenario: str) -> Path:
    from specdiff.demo.scenarios import write_served_draft

    return write_served_draft(scenario, REPO_MODELS / "draft", tmp_path / f"served-{scenario}")


def _server(server_env, draft: Path, trace: Path, log: Path):
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    return ServerProcess(REPO_MODELS / "target", draft_model_path=draft, spec=SpecSettings(), log_path=log,
                         env=server_env(SPECDIFF_TRACE=str(trace)))


def _watch_cmd(serve: Path, out: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "specdiff.tui", "watch", "--serve", str(serve), "--draft",
            str(REPO_MODELS / "draft"), "--target", str(REPO_MODELS / "target"), "--out", str(out),
            "--settle", SETTLE, "--poll", "0.3", *map(str, extra)]


class _Lines:
    """Reads a subprocess's stdout line by line with a deadline (no fixed sleeps)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.sel = selectors.DefaultSelector()
        self.sel.register(proc.stdout, selectors.EVENT_READ)
        self.seen: list[str] = []

    def until(self, predicate, *, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sel.select(timeout=1.0):
                assert self.proc.poll() is None, f"watch exited {self.proc.returncode}: {self.seen[-5:]}"
                continue
            line = self.proc.stdout.readline()
            assert line, f"watch closed its stdout (exit {self.proc.poll()}); lines: {self.seen[-5:]}"
            self.seen.append(line.rstrip("\n"))
            if predicate(self.seen[-1]):
                return self.seen[-1]
        raise AssertionError(f"no such line within {timeout}s; lines so far: {self.seen[-5:]}")


def _events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _scrape(port: int) -> dict[str, float]:
    import requests

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.server
@pytest.mark.slow
def test_watch_replays_each_request_of_a_correct_server_without_alert_and_resumes_after_a_kill(
        tmp_path, server_env, run_cli):
    pytest.importorskip("sglang")
    pytest.importorskip("prometheus_client")
    from specdiff.tracer.engines.server import free_port

    serve, out = tmp_path / "serve.trace", tmp_path / "watch"
    prompts = demo_prompts(REPO_MODELS, 4)
    with _server(server_env, _served(tmp_path, "correct"), serve, tmp_path / "server.log") as server:
        port = free_port()
        proc = subprocess.Popen(_watch_cmd(serve, out, "--json", "--prometheus-port", port),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        try:
            lines = _Lines(proc)
            first_rids = []
            for ids in prompts[:2]:  # each request is replayed while the server keeps serving
                first_rids.append(server.generate(input_ids=ids, max_new_tokens=MAX_NEW)["meta_info"]["id"])
                lines.until(lambda s, rid=first_rids[-1]: f'"key": "{rid}"' in s)
            live = _events("\n".join(lines.seen))
            metrics = _scrape(port)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # no chance to close anything
            proc.wait(timeout=30)
        later_rids = [server.generate(input_ids=ids, max_new_tokens=MAX_NEW)["meta_info"]["id"]
                      for ids in prompts[2:]]
        res = run_cli(*_watch_cmd(serve, out, "--once", "--json")[3:])

    requests_live = [e for e in live if e["event"] == "request"]
    assert [e["key"] for e in requests_live] == first_rids
    assert not [e for e in live if e["event"] == "alert"]
    for e in requests_live:
        assert not e["diverged"] and e["first"] is None, e["verdict"]
        assert len(e["acceptance"]["serve"]["per_depth"]) == len(e["acceptance"]["train"]["per_depth"]) == 3
    assert metrics["specdiff_watch_requests_total"] == 2.0 and metrics["specdiff_watch_diverged"] == 0.0
    roll = requests_live[-1]["rolling"]["serve"]
    assert metrics['specdiff_watch_acceptance{depth="1",side="serve"}'] == pytest.approx(roll["per_depth"][0])

    # resumed: only the two requests served after the kill are replayed
    assert res.exit_code == 0, res.output[-3000:]
    events = _events(res.stdout)
    assert events[0]["event"] == "start" and events[0]["resumed"] == 2
    assert [e["key"] for e in events if e["event"] == "request"] == later_rids
    assert not [e for e in events if e["event"] == "alert"]
    assert events[-1] == {**events[-1], "event": "end", "replayed": 2, "already_done": 2, "diverged": 0}
    assert events[-1]["rolling"]["serve"]["requests"] == events[-1]["rolling"]["train"]["requests"] == 4
    state = json.loads((out / "watch-state.json").read_text())
    assert list(state["requests"]) == first_rids + later_rids
    assert state["segments"] == ["train-0000.trace", "train-0001.trace"]
    killed, resumed = (open_trace(str(out / name)) for name in state["segments"])
    assert not killed.closed and resumed.closed  # the SIGKILLed run's training trace still opens
    assert [s.rid for s in killed.sequences] == first_rids and [s.rid for s in resumed.sequences] == later_rids


@pytest.mark.server
@pytest.mark.slow
def test_watch_alerts_on_the_first_request_of_a_server_with_the_seeds_mistake(tmp_path, server_env, run_cli):
    pytest.importorskip("sglang")
    serve = tmp_path / "serve.trace"
    prompts = demo_prompts(REPO_MODELS, 3)
    with _server(server_env, _served(tmp_path, "seed"), serve, tmp_path / "server.log") as server:
        proc = subprocess.Popen(_watch_cmd(serve, tmp_path / "live"), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            server.generate(input_ids=prompts[0], max_new_tokens=MAX_NEW)
            alert = _Lines(proc).until(lambda s: s.startswith("ALERT"))  # before a second request exists
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            code = proc.wait(timeout=60)
        for ids in prompts[1:]:
            server.generate(input_ids=ids, max_new_tokens=MAX_NEW)
    # after the server stopped: its trace is closed, so every request counts as finished; on a live
    # trace --once leaves out the last request until it has settled (replay/watch/follow.py settle_s)
    res = run_cli(*_watch_cmd(serve, tmp_path / "once", "--once", "--json")[3:])

    assert "first divergence target.aux.0 pos 0" in alert and "layer ids shifted" in alert, alert
    assert code == 1  # SIGTERM: the run closes its training trace and says a request diverged
    assert res.exit_code == 1, res.output[-3000:]
    events = _events(res.stdout)
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["start", "request", "alert"]  # said after the first request, before the rest
    assert kinds.count("request") == 3 and kinds.count("alert") == 1  # one alert per (tensor, cause)
    a = events[2]
    assert a["tensor"].startswith("target.aux.") and a["cause"] == "aux_layer_shift", a
    assert a["request_index"] == 1 and a["first_divergence"]["tensor"] == a["tensor"]
    assert all(e["diverged"] and e["first"] == a["tensor"] for e in events if e["event"] == "request")
    # the slice: both sides' rows of the diverging tensor for that request, diffable on their own
    sl = Path(a["slice"])
    sides = [open_trace(str(sl / f)) for f in ("a.trace", "b.trace")]
    assert [t.side for t in sides] == ["train", "serve"] and all(a["tensor"] in t.names for t in sides)
    assert np.array_equal(sides[0].sequences[0].tokens, sides[1].sequences[0].tokens)
    assert json.loads((sl / "metrics.json").read_text())["tensor"] == a["tensor"]
