"""The SGLang recorder plugin without a server: its ``SPECDIFF_*`` options read from the environment
(a bad value is one error naming the variable, the value and what is accepted), and where it
registers its hooks: only in SGLang's scheduler, TP rank 0, one store per DP replica, refusing an
SGLang that lacks an essential name. The servers it records are tests/tracer/engines/test_sglang_recorder.py's.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest

from specdiff.tracer.engines.options import Options


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
    # the installed SGLang's version: the message names it (tests also run on 0.5.19/0.5.20)
    assert f"tracing refused: SGLang {version('sglang')} lacks EAGLEWorkerV2.forward_batch_generation" in caplog.text
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
