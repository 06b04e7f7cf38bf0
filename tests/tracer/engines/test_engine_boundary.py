"""The engine boundary's shared pieces (tracer/engines/names.py, options.py, server.py) and the contract
facts every engine writes, without any engine installed."""

from __future__ import annotations

import pytest

from specdiff.tracer.contract import UNKNOWN, unobservable_engine, validate_contract
from specdiff.tracer.contract_fields import CONTRACT_FIELDS
from specdiff.tracer.engines.names import MISSING, EngineAdapter, EngineName


class _Obj:
    present = None


def _table():
    return (EngineName(key="Obj.present", owner="builtins.object", attr="present", kind="instance",
                       source="fake.py:1", used_for="a fact", facts=("draft_class",)),
            EngineName(key="Obj.absent", owner="builtins.object", attr="absent", kind="instance",
                       source="fake.py:2", used_for="rows", tensors=("draft.fc_in",), facts=("draft_num_aux",)))


@pytest.mark.parametrize("adapter_path,engine,title", [
    ("specdiff.tracer.engines.sglang.adapter:SGLangAdapter", "sglang", "SGLang"),
    ("specdiff.tracer.engines.vllm.adapter:VLLMAdapter", "vllm", "vLLM"),
])
def test_each_engines_unobservable_entries_read_back_the_same_way(adapter_path, engine, title):
    """Both adapters are the shared EngineAdapter: one warning per missing name in the engine's words,
    None stays a value, and the contract entry names the engine it came from."""
    import pkgutil

    cls = pkgutil.resolve_name(adapter_path)
    lines: list[str] = []
    a = cls("1.2.3", names=_table(), log=lines.append)
    assert isinstance(a, EngineAdapter) and a.engine == engine
    obj = _Obj()
    assert a.get(obj, "Obj.present") is None and a.fact(obj, "Obj.absent") == UNKNOWN
    assert a.get(obj, "Obj.absent") is MISSING and len(lines) == 1  # logged once
    assert lines[0].startswith(f"specdiff: {title} 1.2.3 has no Obj.absent (fake.py:2; _Obj object has no attribute")
    assert lines[0].endswith("now unobservable: tensors draft.fc_in; contract facts draft_num_aux")
    [entry] = a.unobservable()
    assert entry[engine] == "builtins.object.absent" and entry[f"{engine}_version"] == "1.2.3"
    assert unobservable_engine(entry) == (engine, "1.2.3")
    assert unobservable_engine({"name": "x", "why": "gone"}) is None


def test_vllm_facts_are_declared_with_their_meaning_and_type_checked():
    """engine_runner / aux_ids_source / aux_id_rule / d2t_rule / draft_class / draft_num_aux (vLLM's
    contract reader writes them) are known fields: a wrong type is refused when a trace is written."""
    from specdiff.tracer.errors import TraceError

    facts = {"engine_runner": "v1 vllm.v1.worker.cpu_model_runner.CPUModelRunner",
             "aux_ids_source": "top-level eagle_aux_hidden_state_layer_ids", "aux_id_rule": "id k = HF k",
             "d2t_rule": "scatter", "draft_class": "m.Eagle3LlamaForCausalLM", "draft_num_aux": 3}
    for name in facts:
        assert name in CONTRACT_FIELDS and len(CONTRACT_FIELDS[name][1]) > 20, name
    assert validate_contract(dict(facts), where="t") == facts
    with pytest.raises(TraceError, match="draft_num_aux"):
        validate_contract({"draft_num_aux": "three"}, where="t")


def test_the_default_fallback_source_is_spelled_as_the_contract_declares():
    from specdiff.tracer.contract import AUX_IDS_DEFAULT_PREFIX
    from specdiff.tracer.engines.vllm.contract import SOURCE_DEFAULT, SOURCE_NESTED, SOURCE_TOP

    assert SOURCE_DEFAULT.startswith(AUX_IDS_DEFAULT_PREFIX)
    assert not SOURCE_TOP.startswith(AUX_IDS_DEFAULT_PREFIX) and not SOURCE_NESTED.startswith(AUX_IDS_DEFAULT_PREFIX)


def test_every_engines_id_keys_are_registered_and_read_first_is_the_fix_key():
    from specdiff.eagle3.engines import ENGINES, engine_spec

    for name in ENGINES:
        spec = engine_spec(name)
        assert spec.aux_ids_key and spec.aux_id_words.startswith(spec.title)
        assert spec.aux_ids_read[0] == spec.aux_ids_key, name  # the fix writes the key the engine reads first


def test_an_engine_server_without_a_command_says_so():
    from specdiff.tracer.engines.server import EngineServer

    with pytest.raises(NotImplementedError, match="EngineServer does not say how to start engine"):
        EngineServer("m").start()


def test_an_engine_plugin_closes_its_trace_on_sigterm_and_the_process_still_terminates(tmp_path):
    import signal
    import subprocess
    import sys

    marker = tmp_path / "closed"
    code = ("import os, signal, time\n"
            "from specdiff.tracer.engines.lifecycle import close_on_sigterm\n"
            f"close_on_sigterm(lambda: open({str(marker)!r}, 'w').write('x'))\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    r = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert r.returncode == -signal.SIGTERM  # the default action still ran after the close
    assert marker.read_text() == "x"
