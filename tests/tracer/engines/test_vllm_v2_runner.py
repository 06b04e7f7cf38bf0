"""vLLM's V2 model runner (the GPU default in vLLM 0.32) is not hooked: the plugin must say so once,
with the switch, and leave a trace whose contract says why it holds no rows. Simulated without vLLM:
the V2 runner's module is put in ``sys.modules`` before the plugin loads, as when a worker built it."""

from __future__ import annotations

import logging
import sys
import types

import pytest


@pytest.fixture
def plugin(monkeypatch):
    """The vLLM plugin module with fresh process state (restored after the test)."""
    from specdiff.tracer.engines.vllm import plugin as p

    monkeypatch.setattr(p, "_adapter", None)
    monkeypatch.setattr(p, "_rec", None)
    monkeypatch.setattr(p, "_patched", set())
    monkeypatch.setattr(p._Finder, "opts", None)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # load() inserts its import hook
    return p


def _v2_module(plugin, monkeypatch):
    mod = types.ModuleType(plugin._V2_RUNNER)

    class GPUModelRunner:
        def __init__(self, vllm_config, device):
            self.device = device

    GPUModelRunner.__module__ = plugin._V2_RUNNER
    mod.GPUModelRunner = GPUModelRunner
    monkeypatch.setitem(sys.modules, plugin._V2_RUNNER, mod)
    return mod


def test_v2_runner_selected_at_load_warns_once_and_the_trace_says_nothing_was_recorded(
        plugin, monkeypatch, tmp_path, caplog):
    from specdiff.tracer.store import open_trace

    mod = _v2_module(plugin, monkeypatch)
    path = tmp_path / "v2.trace"
    with caplog.at_level(logging.WARNING, logger="specdiff.tracer"):
        assert plugin.load({"SPECDIFF_TRACE": str(path)}) is True
        plugin._on_import(plugin._V2_RUNNER)  # a second import notice: no second warning
    said = [r.getMessage() for r in caplog.records if "V2 model runner" in r.getMessage()]
    assert len(said) == 1, said
    assert "hooks only the V1 runner" in said[0] and "VLLM_USE_V2_MODEL_RUNNER=0" in said[0]
    assert not path.exists()  # nothing written before a runner is built

    # the V2 CPU runner subclasses the V2 GPUModelRunner (v1/worker/cpu/model_runner.py:10)
    cpu_runner = type("CPUModelRunner", (mod.GPUModelRunner,), {"__module__": "vllm.v1.worker.cpu.model_runner"})
    runner = cpu_runner(None, "cpu")
    assert runner.device == "cpu"  # vLLM's own __init__ ran
    t = open_trace(str(path))
    c = t.contract
    assert c["engine"] == "vllm" and c["engine_runner"] == "v2 vllm.v1.worker.cpu.model_runner.CPUModelRunner"
    assert {"tokens", "target.aux.{j}", "draft.fc_in", "verify.accept_length"} <= set(c["unrecorded_stages"])
    assert all("VLLM_USE_V2_MODEL_RUNNER=0" in why for why in c["unrecorded_stages"].values())
    assert t.closed and len(t.sequences) == 0
    # V2's declared names are checked against what is importable (here: nothing): listed, not guessed
    assert {u["name"] for u in c["unobservable"]} >= {"V2.GPUModelRunner.sample_tokens"}
    cpu_runner(None, "cpu")  # a second V2 runner in the process (another TP rank's) does not rewrite it


def test_a_v1_runner_is_named_v1_and_a_v2_subclass_v2():
    from specdiff.tracer.engines.vllm.adapter import runner_version

    v1 = type("CPUModelRunner", (), {"__module__": "vllm.v1.worker.cpu_model_runner"})
    v2 = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})
    sub = type("CPUModelRunner", (v2,), {"__module__": "vllm.v1.worker.cpu.model_runner"})
    assert [runner_version(k()) for k in (v1, v2, sub)] == ["v1", "v2", "v2"]
