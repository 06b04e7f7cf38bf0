"""The SGLang adapter: every name the recorder touches is declared, checked and reported once.

Unit tests against fake modules and fake worker objects (no server), plus the check of the
installed SGLang's own names. The real-server test of a removed attribute is in
tests/tracer/engines/test_sglang_recorder.py (``test_a_renamed_sglang_attribute_...``).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdiff.eagle3.engines import SGLANG
from specdiff.tracer.contract import UNKNOWN, sha256_array, tokenizer_hashes, unknown_fields, weight_sha256
from specdiff.tracer.engines.names import MISSING, EngineName, version_in_range
from specdiff.tracer.engines.sglang.adapter import NAMES, SGLangAdapter

MODELS = Path(__file__).resolve().parents[3] / "traces" / "models"


def _adapter(names=NAMES, version="0.5.23"):
    lines: list[str] = []
    return SGLangAdapter(version, names=names, log=lines.append), lines


@pytest.fixture(autouse=True)
def _start_method_set(monkeypatch):
    """SGLang's scheduler process has its multiprocessing start method set when the contract reads it
    (``engine_process_start``); this test process has one only if an earlier test set it: the facts
    must not depend on which tests ran before (alone, 2 tests here saw it unknown)."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "fork")


# ---- fake modules: each kind of name, present and missing ----------------------------------------
@pytest.fixture
def fakesg(monkeypatch):
    mod = types.ModuleType("fakesg")

    @dataclasses.dataclass
    class Batch:
        reqs: list  # a field without a default: not a class attribute, still declared
        forward_iter: int | None = None

    class Worker:
        def forward(self):
            return 1

    def select(i, topk_p, topk_index):
        return i

    mod.Batch, mod.Worker, mod.select = Batch, Worker, select
    monkeypatch.setitem(sys.modules, "fakesg", mod)
    return mod


def _name(key, owner, kind, attr=None, **kw):
    return EngineName(key=key, owner=owner, attr=attr or key.rsplit(".", 1)[1], kind=kind, source="fake.py:1",
                      used_for="test", **kw)


def test_static_check_finds_each_missing_kind_of_name(fakesg):
    names = (
        _name("Worker.forward", "fakesg.Worker", "hook", hook=("AFTER", "f"), tensors=("draft.topk",)),
        _name("Worker.renamed", "fakesg.Worker", "hook", hook=("AFTER", "g"), tensors=("draft.logits",)),
        _name("Batch.reqs", "fakesg.Batch", "field"),
        _name("Batch.forward_iter", "fakesg.Batch", "field"),
        _name("Batch.seq_lens", "fakesg.Batch", "field", tensors=("verify.accept_length",)),
        _name("select.topk_index", "fakesg.select", "param"),
        _name("select.scores", "fakesg.select", "param", facts=("spec_topk",)),
        _name("gone.f", "fakesg_gone", "method", attr="f"),
        _name("Worker.hot", "fakesg.Worker", "instance", facts=("d2t_sha256",)),
    )
    a, lines = _adapter(names)
    bad = [n.key for n in a.check_static()]
    assert bad == ["Worker.renamed", "Batch.seq_lens", "select.scores", "gone.f"]
    assert len(lines) == 4  # one line per missing name; the instance attribute waits for its object
    assert "SGLang 0.5.23 has no Worker.renamed (fake.py:1;" in lines[0] and "tensors draft.logits" in lines[0]
    assert "contract facts spec_topk" in lines[2] and "has no parameter 'scores'" in lines[2]
    assert "cannot import fakesg_gone" in lines[3]
    a.check_static()
    assert len(lines) == 4, "a name already reported is not reported again"


def test_instance_attributes_are_checked_where_first_seen_and_read_as_missing_not_none(fakesg):
    names = (_name("Worker.hot", "fakesg.Worker", "instance", facts=("d2t_sha256",)),
             _name("Worker.cold", "fakesg.Worker", "instance", facts=("fc_norm",)))
    a, lines = _adapter(names)
    w = fakesg.Worker()
    w.hot = None  # present and None: a fact (e.g. no d2t)
    assert a.check_instance(w, "Worker.hot", "Worker.cold") == ["Worker.cold"]
    assert a.get(w, "Worker.hot") is None and a.get(w, "Worker.cold") is MISSING
    assert a.fact(w, "Worker.cold") == UNKNOWN and a.fact(w, "Worker.hot", bool) is False
    assert len(lines) == 1 and "Worker.cold" in lines[0] and "contract facts fc_norm" in lines[0]
    assert [u["name"] for u in a.unobservable()] == ["Worker.cold"]
    u = a.unobservable()[0]
    assert u["facts"] == ["fc_norm"] and u["sglang_version"] == "0.5.23" and "no attribute 'cold'" in u["why"]


def test_every_declared_name_resolves_in_the_installed_sglang():
    pytest.importorskip("sglang")
    a, lines = _adapter(version=SGLangAdapter.for_running().version)
    assert a.check_version() and not lines, "the installed SGLang is inside the tested range: quiet"
    assert a.check_static(eager_draft=True) == [] and lines == []
    keys = [n.key for n in NAMES]
    assert len(keys) == len(set(keys)) and len(keys) >= 45
    for n in NAMES:
        assert n.source.startswith("srt/") and n.used_for, n.key
        assert n.kind != "hook" or n.hook is not None, n.key


def test_a_renamed_private_method_of_the_installed_sglang_is_one_warning(monkeypatch):
    pytest.importorskip("sglang")
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    monkeypatch.delattr(EagleDraftWorker, "_draft_extend_for_decode")
    a, lines = _adapter()
    bad = [n.key for n in a.check_static()]
    # the hook target and the argument layout read from it
    assert bad == ["EagleDraftWorker._draft_extend_for_decode", "_draft_extend_for_decode(batch, batch_result)"]
    assert lines[0].startswith("specdiff: SGLang 0.5.23 has no EagleDraftWorker._draft_extend_for_decode "
                               "(srt/speculative/eagle_worker_v2.py:1110;")
    assert lines[0].endswith("now unobservable: tensors draft.topk") and len(lines) == 2


def test_version_outside_the_tested_range_warns_once_with_the_range():
    r = SGLANG.tested_range
    assert version_in_range("0.5.23", r) and version_in_range("0.5.23.post1", r) and version_in_range("0.5.19", r)
    assert version_in_range("0.5.18", r) is False and version_in_range("0.6.0", r) is False
    assert version_in_range("not a version", r) is None
    a, lines = _adapter(version="0.5.18")
    assert a.check_version() is False
    assert lines == [f"specdiff: SGLang 0.5.18 is outside the tested range {r[0]}..{r[1]}; "
                     "every SGLang name the recorder uses is checked, and what it cannot read is recorded as unknown"]


# ---- contract from a live worker (fake objects with SGLang's attribute names) ------------------
class _Config(SimpleNamespace):
    def to_dict(self):
        return dict(vars(self))


def _live(cls_name: str, **attrs):
    """A stand-in for a live SGLang object of class ``cls_name`` (the adapter looks layouts up by
    the live class name)."""
    return type(cls_name, (SimpleNamespace,), {})(**attrs)


def _worker(*, ltc=(3, 5, 6), ids=(2, 4, 5), L=8, drop_ltc=False, hot=True, target_class="LlamaForCausalLM",
            inner_class="LlamaModel"):
    tcfg = _Config(num_hidden_layers=L, hidden_size=256, vocab_size=4096, architectures=[target_class])
    dcfg = SimpleNamespace(hidden_size=256, vocab_size=4096, draft_vocab_size=1024,
                           eagle_config={"eagle_aux_hidden_state_layer_ids": list(ids)})
    tembed = SimpleNamespace(weight=torch.randn(4096, 256))
    tinner = _live(inner_class, start_layer=0, end_layer=L, embed_tokens=tembed)
    if not drop_ltc:
        tinner.layers_to_capture = list(ltc)
    d2t = torch.arange(1024, dtype=torch.int64) * 3
    # class name SimpleNamespace: not SGLang's; rotary_dim / head_size: a partial rope of 0.5
    rot = SimpleNamespace(base=10000.0, is_neox_style=True, rotary_dim=32, head_size=64)
    # RadixAttention.sliding_window_size -1: no window (srt/layers/radix_attention.py:90)
    layer = SimpleNamespace(self_attn=SimpleNamespace(rotary_emb=rot, attn=SimpleNamespace(sliding_window_size=-1)))
    dinner = SimpleNamespace(fc=torch.nn.Linear(768, 256), norm_before_fc=False, fc_norm=None, norm_output=False,
                             embed_tokens=tembed, layers=[layer])  # the target's embedding, shared
    dmodel = SimpleNamespace(model=dinner, hot_token_id=None, lm_head=SimpleNamespace(weight=torch.randn(1024, 256)))
    tmodel = _live(target_class, model=tinner, lm_head=SimpleNamespace(weight=torch.randn(4096, 256)),
                   capture_aux_hidden_states=True, config=tcfg)
    trunner = SimpleNamespace(model=tmodel,
                              model_config=SimpleNamespace(hf_config=tcfg, dtype=torch.bfloat16))
    # an EagleDraftWorker after alloc_memory_pool (SGLang 0.5.23 eagle_worker_v2.py:177-260)
    dw = SimpleNamespace(draft_runner=SimpleNamespace(model=dmodel, model_config=SimpleNamespace(hf_config=dcfg)),
                         hot_token_id=(d2t + torch.arange(1024)) if hot else None,
                         cuda_graph_runner=None, cuda_graph_runner_for_draft_extend=None,
                         target_worker=SimpleNamespace(model_runner=trunner),
                         speculative_num_steps=3, topk=1, speculative_num_draft_tokens=4,
                         speculative_algorithm=SimpleNamespace(name="EAGLE3"),
                         server_args=SimpleNamespace(model_path="/t", speculative_draft_model_path="/d", port=1))
    return dw, d2t


def _contract(worker):
    """The contract a trace holds once start-up is over: alloc_memory_pool, then _capture_cuda_graphs."""
    from specdiff.tracer.engines.options import Options
    from specdiff.tracer.engines.sglang.contract import (
        aux_capture_facts,
        contract_from_worker,
        graph_hidden_stages,
    )

    a, lines = _adapter()
    serving = SimpleNamespace(tokenizer_path=str(MODELS / "target"), chat_template=None)
    c = contract_from_worker(worker, Options(path="/x"), a, serving=serving)
    assert (c["aux_hf_indices"], c["graph_hidden_stages"]) == (UNKNOWN, UNKNOWN)  # not settled at alloc time
    c.update(aux_capture_facts(a, worker), graph_hidden_stages=graph_hidden_stages(worker, a))
    c["unobservable"] = a.unobservable()
    return c, lines


def test_contract_reads_the_capture_sglang_really_does():
    w, d2t = _worker()
    c, lines = _contract(w)
    assert not lines and c["unobservable"] == [] and unknown_fields(c) == []
    assert c["aux_native_ids"] == [2, 4, 5] and c["aux_hf_indices"] == [3, 5, 6] and c["aux_dropped_ids"] == []
    assert c["d2t_sha256"] == sha256_array(d2t) and c["draft_vocab_size"] == 1024
    assert (c["spec_steps"], c["spec_topk"], c["spec_draft_tokens"], c["dtype"]) == (3, 1, 4, "bfloat16")
    assert (c["norm_before_fc"], c["fc_norm"], c["model_name"], c["draft_name"]) == (False, False, "/t", "/d")
    assert (c["spec_algorithm"], c["aux_concat_order"], c["norm_output"]) == ("EAGLE3", [3, 5, 6], False)
    assert (c["embed_source"], c["lm_head_source"]) == ("target", "draft")
    assert c["embed_sha256"] == weight_sha256(w.draft_runner.model.model.embed_tokens.weight)
    assert c["lm_head_sha256"] == weight_sha256(w.draft_runner.model.lm_head.weight)
    assert (c["rope_theta"], c["rope_style"], c["partial_rotary_factor"]) == (10000.0, "neox", 0.5)
    assert c["rope_scaling"] == {"type": "sglang SimpleNamespace"}  # an unknown rope class is named, not guessed
    assert (c["tokenizer_sha256"], c["chat_template_sha256"]) == tokenizer_hashes(MODELS / "target")


def test_an_aux_id_one_past_the_last_layer_is_recorded_as_dropped_not_captured():
    # SGLang id L-1 = 7 -> capture index 8, which no layer of 0..7 reaches (llama.py)
    c, _ = _contract(_worker(ltc=(0, 3, 8), ids=(-1, 2, 7))[0])
    assert c["aux_hf_indices"] == [0, 3] and c["aux_dropped_ids"] == [7]


def test_a_missing_layers_to_capture_is_unknown_never_the_configured_ids():
    c, lines = _contract(_worker(drop_ltc=True)[0])
    assert c["aux_hf_indices"] == UNKNOWN and c["aux_dropped_ids"] == UNKNOWN
    assert c["aux_native_ids"] == [2, 4, 5]  # what the config says stays what the config says
    assert len(lines) == 1 and "LlamaModel.layers_to_capture" in lines[0] and "aux_hf_indices" in lines[0]
    assert [u["name"] for u in c["unobservable"]] == ["LlamaModel.layers_to_capture"]
    assert unknown_fields(c) == ["aux_concat_order", "aux_dropped_ids", "aux_hf_indices", "aux_prenorm_indices"]


def test_a_missing_draft_worker_attribute_makes_its_facts_unknown():
    w, _ = _worker()
    del w.hot_token_id
    c, lines = _contract(w)
    assert (c["d2t_sha256"], c["hot_token_id_sha256"], c["draft_vocab_size"]) == (UNKNOWN, UNKNOWN, UNKNOWN)
    assert len(lines) == 1 and "EagleDraftWorker.hot_token_id" in lines[0]
    w2, _ = _worker()
    del w2.server_args
    c2, _ = _contract(w2)
    assert c2["model_name"] == UNKNOWN and c2["draft_name"] == UNKNOWN


def test_no_d2t_is_a_fact_not_unknown():
    c, lines = _contract(_worker(hot=False)[0])
    assert c["d2t_sha256"] is None and c["draft_vocab_size"] == 1024 and not lines


def test_an_unknown_fact_passes_contract_validation_and_survives_the_store(tmp_path):
    from specdiff.tracer.store import TraceWriter, open_trace

    c, _ = _contract(_worker(drop_ltc=True)[0])
    c.pop("bos_token_id")  # Recorder.start turns it into bos_added at close
    with TraceWriter(str(tmp_path / "u.trace"), side="serve", contract=c):
        pass
    t = open_trace(str(tmp_path / "u.trace"))
    assert t.contract["aux_hf_indices"] == UNKNOWN and t.contract["unobservable"][0]["name"] == "LlamaModel.layers_to_capture"


# ---- recorder options from the environment -----------------------------------------------------
# A bad value is refused, not replaced: tests/tracer/engines/test_sglang_plugin.py::test_a_bad_environment_value_*
def test_good_recorder_variables_are_quiet(caplog):
    from specdiff.tracer.engines.options import Options

    with caplog.at_level(logging.WARNING, logger="specdiff.tracer"):
        o = Options.from_env({"SPECDIFF_TRACE": "/x", "SPECDIFF_LOGITS_TOPK": " 4 ", "SPECDIFF_EAGER_DRAFT": "0"})
    assert (o.logits_topk, o.eager_draft) == (4, False) and not caplog.records


def test_graph_hidden_stages_come_from_the_draft_workers_graph_runners():
    from specdiff.tracer.engines.sglang.contract import graph_hidden_stages

    a, lines = _adapter()
    assert graph_hidden_stages(SimpleNamespace(cuda_graph_runner=None, cuda_graph_runner_for_draft_extend=None), a) == []
    hidden = graph_hidden_stages(SimpleNamespace(cuda_graph_runner=object(), cuda_graph_runner_for_draft_extend=None), a)
    assert "draft.hidden_out" in hidden and "draft.fc_out" not in hidden
    assert graph_hidden_stages(SimpleNamespace(cuda_graph_runner=None), a) == UNKNOWN
    assert len(lines) == 1 and "EagleDraftWorker.cuda_graph_runner_for_draft_extend" in lines[0]


def test_a_target_with_aux_capture_off_feeds_no_aux_states():
    # --speculative-algorithm EAGLE: set_eagle3_layers_to_capture is never called (llama.py:591)
    w, _ = _worker(ltc=())
    w.target_worker.model_runner.model.capture_aux_hidden_states = False
    c, lines = _contract(w)
    assert c["aux_hf_indices"] == [] and c["aux_dropped_ids"] == [] and not lines


# ---- the target's layout per family ------------------------------------------------------------------
def test_deepseek_layers_are_read_from_deepseeks_own_names_and_its_moe_routing_from_its_config():
    w, _ = _worker(ltc=(0, 3, 6), ids=(0, 3, 6), target_class="DeepseekV3ForCausalLM", inner_class="DeepseekV2Model")
    w.target_worker.model_runner.model.config.n_routed_experts = 4
    w.target_worker.model_runner.model.config.num_experts_per_tok = 2
    c, lines = _contract(w)
    assert not lines and c["aux_hf_indices"] == [0, 3, 6] and c["aux_dropped_ids"] == []
    assert (c["target_architecture"], c["target_num_experts"], c["target_experts_per_token"]) == (
        "DeepseekV3ForCausalLM", 4, 2)
    assert (c["embed_source"], c["lm_head_source"]) == ("target", "draft")
    del w.target_worker.model_runner.model.model.layers_to_capture
    c2, lines2 = _contract(w)
    assert c2["aux_hf_indices"] == UNKNOWN and len(lines2) == 1
    assert "DeepseekV2Model.layers_to_capture (srt/models/deepseek_v2.py:3051" in lines2[0]


def test_gpt_oss_captures_the_last_layers_output_at_index_L_other_families_drop_it():
    w, _ = _worker(ltc=(0, 3, 8), ids=(0, 3, 8), target_class="GptOssForCausalLM", inner_class="GptOssModel")
    w.target_worker.model_runner.model.config.num_local_experts = 4
    w.target_worker.model_runner.model.config.num_experts_per_tok = 2
    c, lines = _contract(w)
    assert not lines and c["aux_hf_indices"] == [0, 3, 8] and c["aux_dropped_ids"] == []  # gpt_oss.py:731
    assert c["aux_prenorm_indices"] == [8]  # the last layer's output before the norm: not HF hidden_states[8]
    assert (c["target_num_experts"], c["target_experts_per_token"]) == (4, 2)
    c2, _ = _contract(_worker(ltc=(0, 3, 8), ids=(0, 3, 8), target_class="Qwen3ForCausalLM",
                              inner_class="Qwen3Model")[0])
    assert c2["aux_hf_indices"] == [0, 3] and c2["aux_dropped_ids"] == [8] and c2["aux_prenorm_indices"] == []
    assert (c2["target_num_experts"], c2["target_experts_per_token"]) == (None, None)  # dense


def test_a_wrapper_is_followed_to_the_language_model_that_holds_the_capture():
    w, _ = _worker(ltc=(0, 3, 6), ids=(0, 3, 6), target_class="DeepseekV3ForCausalLM", inner_class="DeepseekV2Model")
    lm = w.target_worker.model_runner.model
    lm.config.n_routed_experts, lm.config.num_experts_per_tok = 8, 2
    w.target_worker.model_runner.model = _live("KimiK25ForConditionalGeneration", language_model=lm)
    c, lines = _contract(w)
    assert not lines and c["aux_hf_indices"] == [0, 3, 6] and c["embed_source"] == "target"
    assert (c["target_architecture"], c["target_num_experts"]) == ("KimiK25ForConditionalGeneration", 8)
    del w.target_worker.model_runner.model.language_model
    c2, lines2 = _contract(w)
    assert c2["aux_hf_indices"] == UNKNOWN and c2["embed_source"] == UNKNOWN and c2["target_num_experts"] == UNKNOWN
    assert len(lines2) == 1 and "KimiK25ForConditionalGeneration.language_model (srt/models/kimi_k25.py:693" in lines2[0]


def test_an_undeclared_target_class_is_read_through_llamas_names_with_one_warning():
    c, lines = _contract(_worker(target_class="MysteryForCausalLM")[0])
    assert c["aux_hf_indices"] == [3, 5, 6]  # the names exist on it, so the capture is still read
    assert (c["target_num_experts"], c["target_experts_per_token"]) == (UNKNOWN, UNKNOWN)  # never guessed
    assert len(lines) == 1 and "MysteryForCausalLM" in lines[0] and "does not declare" in lines[0]
    assert "LlamaForCausalLM's names" in lines[0]


def test_every_declared_family_rule_is_the_set_eagle3_layers_to_capture_the_installed_sglang_runs():
    """aux_capture_rule read off the live class (MRO) names the file and line TARGET_LAYOUTS declares."""
    pytest.importorskip("sglang")
    import pkgutil

    from specdiff.tracer.engines.sglang.contract import capture_rule
    from specdiff.tracer.engines.sglang.layouts import TARGET_LAYOUTS, TARGET_WRAPPERS

    for name, lay in TARGET_LAYOUTS.items():
        cls = pkgutil.resolve_name(lay.outer.rsplit(".", 1)[0] + "." + name)
        obj = cls.__new__(cls)  # only its class is read
        assert capture_rule(obj, obj, []) == f"sglang {lay.rule} {lay.outer_name}.set_eagle3_layers_to_capture", name
    wrapper = pkgutil.resolve_name(TARGET_WRAPPERS["KimiK25ForConditionalGeneration"][0])
    inner = pkgutil.resolve_name("sglang.srt.models.deepseek_v2.DeepseekV3ForCausalLM")
    rule = capture_rule(inner.__new__(inner), wrapper.__new__(wrapper), ["KimiK25ForConditionalGeneration.language_model"])
    assert rule == ("sglang srt/models/deepseek_v2.py:3458 DeepseekV2ForCausalLM.set_eagle3_layers_to_capture "
                    "via KimiK25ForConditionalGeneration.language_model")


def test_a_cuda_graph_hides_each_later_layers_output_the_taps_record():
    """A multi-layer draft's ``draft.layer_out.{i}`` hooks sit on later layers a draft CUDA graph replays
    without Python hooks, as it does the midlayer's: listed as hidden with the same reason."""
    from specdiff.tracer.engines.sglang.draft_stages import DraftStageTaps, graph_hidden

    draft = torch.nn.Module()
    draft.model = torch.nn.Module()
    draft.model.layers = torch.nn.ModuleList([torch.nn.Identity() for _ in range(3)])
    taps = DraftStageTaps(snap=lambda t: t, capturing=lambda: False, on_error=lambda *_: None)
    taps.attach(draft)
    assert taps.layer_outs == ("draft.layer_out.0", "draft.layer_out.1")
    hidden = graph_hidden(draft_decode_graph=True, draft_extend_graph=False, layer_outs=taps.layer_outs)
    assert hidden["draft.layer_out.1"] == hidden["draft.hidden_out"] and "CUDA graph" in hidden["draft.layer_out.0"]
    assert "draft.layer_out.0" not in graph_hidden(draft_decode_graph=True, draft_extend_graph=False)
