"""A two-layer EAGLE-3 draft (``traces/models/draft2l``) served by a real vLLM 0.32.0 CPU server against its
training side recorded by the reference forward, and the same draft served with layer 1's weights missing
(the SGLang half: test_multilayer_server.py). One server start per served draft.

vLLM builds ``num_hidden_layers`` draft layers (model_executor/models/llama_eagle3.py:198-208) and chains them
as SGLang does but for one norm: a layer i >= 1 normalises its input with ``input_layernorm``
(:131-138), SGLang 0.5.23 and the reference with ``hidden_norm`` (srt/models/llama_eagle3.py:97-105).
``save_draft`` writes a later layer's trained ``hidden_norm`` into its ``input_layernorm`` too (SGLang never
reads that one), so draft2l serves on both engines as written; an SGLang-only file holds the ones SGLang
allocates there, and vLLM then computes another layer 1 (measured: exit 1 at ``draft.logits_topk.ids``,
draft.hidden_out 0.042 of rel 0.05, 'no known cause' before the contract read each side's norm). The copy vLLM
is given here has the aux ids in vLLM's key and numbering (top-level ids [0, 3, 6], as test_vllm_recorder.py
serves the one-layer draft). The recorder
needs nothing for two layers: ``draft.hidden_out`` is the draft forward's pre-norm output after the last
layer (:283-288), the window fact reads every layer.

- served whole: diff exit 0 against ``record train --replay`` (the reference, and ``--trainer speculators``),
  every depth recorded, vLLM's counters show
  real drafting; against a training side cut to layer 0 the diff stops at ``draft.hidden_out``;
- draft2l as an SGLang-only exporter writes it (the unused ones in ``layers.1.input_layernorm``): named by the contract's
  ``draft_layer_input_norms`` (each side's later layers' input norm, read by that side's rule);
- layer 1's ``layers.1.*`` removed, config still 2 layers: vLLM serves it. ``Eagle3LlamaForCausalLM.
  load_weights`` returns None (llama_eagle3.py:420-469), so ``DefaultModelLoader.load_weights`` skips its
  check for parameters the checkpoint did not initialise (model_loader/default_loader.py:505-518, the
  raise at :562-567): layer 1 keeps what it was built with, ``torch.empty`` linears
  (model_executor/layers/linear.py:193) and ones norms (layers/layernorm.py:63). The contract's
  ``draft_unloaded`` names the 7 parameters and the diff stops at ``draft.hidden_out`` naming them. (SGLang
  0.5.23 serves such a draft too: its ``load_weights`` skips what the file lacks, srt/models/llama_eagle3.py
  :325-378, and its loader checks nothing after, srt/model_loader/loader.py:1028-1030, :1063;
  tests/tracer/engines/test_sglang_live_facts.py serves that case.)

Starts are kept short (measured on 2 cores: 57-61 s warm, 103-145 s cold on a loaded machine; eager 31 s): the
correct pair is served as users serve it, torch.compiled, its draft at a fixed path under the compile cache
(``.cache/vllm``; the inductor cache is keyed by the whole engine config, the draft path included; vLLM 0.32's
own AOT artifact fails to load on this CPU and is compiled again); the missing-weights draft is served with
``--enforce-eager``, which leaves the load path the test is about unchanged. The trace is written by the
recorder's writer thread (no writer process to start).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from builders import draft_copy, first_layer_only, train_and_diff

from specdiff.demo.run import REPO_MODELS, demo_prompts

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
SITE = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"), None) if VLLM_PY.exists() else None
CACHE = ROOT / ".cache" / "vllm"
DRAFT2L = REPO_MODELS / "draft2l"

pytestmark = [pytest.mark.skipif(SITE is None, reason="no vLLM venv at .venv-vllm (build it with `make vllm-venv`; "
                                                      "`make test` does)"),
              pytest.mark.skipif(not (DRAFT2L / "config.json").exists(),
                                 reason="the two-layer demo draft is not built (traces/models/draft2l)")]

#: layer 1's parameters as vLLM builds them (qkv and gate/up stacked), the names ``draft_unloaded`` holds
LAYER1 = sorted(f"model.layers.1.{p}.weight" for p in (
    "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "input_layernorm",
    "post_attention_layernorm", "hidden_norm"))


def _for_vllm(out: Path, *, drop: tuple[str, ...] = (), sglang_only: bool = False) -> Path:
    """draft2l as vLLM is given it (module doc), written to ``out``: the aux ids in vLLM's key and numbering;
    ``sglang_only``: each later layer's ``input_layernorm`` the ones SGLang builds and never reads; then the
    ``drop`` prefixes removed."""
    from specdiff.demo.scenarios import scenario_ids
    from specdiff.eagle3.config_keys import set_config_value

    cfg = json.loads((DRAFT2L / "config.json").read_text())
    ids = scenario_ids(engine="vllm")
    set_config_value(cfg, ids.key, list(ids.correct))
    ones = tuple(f"layers.{i}.input_layernorm.weight" for i in range(1, cfg["num_hidden_layers"])) if sglang_only else ()
    return draft_copy(DRAFT2L, out, config=cfg, ones=ones, drop=drop)


def _serve(draft: Path, tmp_path: Path, server_env, *args: str) -> tuple[Path, dict]:
    """Serve ``draft`` traced on vLLM (``args``: more ``vllm serve`` options), the demo prompts sent together
    (16 tokens each); returns the trace and vLLM's spec-decode counters."""
    from specdiff.tracer.engines.vllm.cpu import VLLMServerProcess, spec_decode_stats

    trace = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(trace), SPECDIFF_WRITER="thread")
    t0 = time.monotonic()
    with VLLMServerProcess(REPO_MODELS / "target", draft_model_path=draft, python=str(VLLM_PY), env=env,
                           cache_root=str(CACHE), log_path=str(tmp_path / "server.log"), extra_args=list(args)) as server:
        server.generate(input_ids=demo_prompts(REPO_MODELS, 2), max_new_tokens=16)
        stats = spec_decode_stats(server.metrics())
    print(f"vLLM served {draft.name}: start {server.startup_s:.0f} s, in all {time.monotonic() - t0:.0f} s")
    return trace, stats


def test_the_vllm_lines_this_file_relies_on_hold_what_it_says():
    """No engine: the installed wheel's lines behind the later layers' input norm and the unloaded layer (module doc)."""
    def line(path, n):
        return (SITE / path).read_text().splitlines()[n - 1].strip()

    eagle3 = "model_executor/models/llama_eagle3.py"
    assert line(eagle3, 131) == "if self.layer_idx == 0:"  # layer 0: hidden_norm via _residual_norm (:134)
    assert line(eagle3, 138) == "hidden_states, residual = self.input_layernorm(hidden_states, residual)"
    assert line(eagle3, 467) == "loader.load_weights(" and "return" not in line(eagle3, 467)  # returns None
    loader = "model_executor/model_loader/default_loader.py"
    assert line(loader, 508) == "model_config.quantization is None and loaded_weights is not None"
    assert line(loader, 565) == '"Following weights were not initialized from "'


@pytest.mark.server
@pytest.mark.slow
def test_a_two_layer_draft_served_by_vllm_matches_its_training_forward(tmp_path, server_env):
    from specdiff.tracer.store import open_trace

    served = _for_vllm(CACHE / "drafts" / "draft2l")  # a fixed path: the compile cache's key
    serve, stats = _serve(served, tmp_path, server_env)
    t = open_trace(str(serve))
    c = t.contract
    assert t.closed and "crash" not in c, (tmp_path / "server.log").read_text()[-3000:]
    assert c["draft_config"]["num_hidden_layers"] == 2 and c["draft_unloaded"] == []
    assert c["draft_attention_window"] == [None, None]  # read off each of the two live layers
    assert {p for p in LAYER1 if p in c["draft_structure"]} == set(LAYER1)
    assert set(np.unique(t.keys("draft.hidden_out")["depth"])) == {0, 1, 2}
    assert stats["mean_accept_length"] > 1.5, stats  # the draft really drafts

    proc = train_and_diff(served, serve, tmp_path / "train.trace")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["first_divergence"] is None
    assert not report["tensors"]["draft.hidden_out"]["diverged"] and report["tensors"]["draft.hidden_out"]["rows"]
    assert [m for m in report["contract_mismatches"] if m["severity"] != "info"] == [], report["contract_mismatches"]
    # the training side as speculators computes it (its own Eagle3DraftModel forward, replay/trainers): the same
    proc = train_and_diff(served, serve, tmp_path / "train-speculators.trace", "--trainer", "speculators")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert json.loads(proc.stdout)["first_divergence"] is None

    # the same serving trace against a training side without layer 1: the diff sees vLLM's second layer
    proc = train_and_diff(first_layer_only(DRAFT2L, tmp_path / "draft1l"), serve, tmp_path / "train1.trace")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    first = json.loads(proc.stdout)["first_divergence"]
    assert first["tensor"] == "draft.hidden_out", first


@pytest.mark.server
@pytest.mark.slow
def test_layer_1_weights_missing_on_vllm_diverge_at_hidden_out_naming_the_unloaded_layer(tmp_path, server_env):
    from specdiff.tracer.store import open_trace

    served = _for_vllm(tmp_path / "draft-no-layer1", drop=("layers.1.",))
    assert json.loads((served / "config.json").read_text())["num_hidden_layers"] == 2
    serve, _ = _serve(served, tmp_path, server_env, "--enforce-eager")
    c = open_trace(str(serve)).contract
    assert c["draft_unloaded"] == LAYER1, c["draft_unloaded"]  # vLLM served it, layer 1 as allocated

    proc = train_and_diff(_for_vllm(tmp_path / "draft"), serve, tmp_path / "train.trace")  # as trained
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    first = report["first_divergence"]
    assert first["tensor"] == "draft.hidden_out" and "draft_unloaded.model.layers.1" in first["contract_bearing"], first
    # the cause: the unloaded layer named from the contract (finite values left as allocated), or the
    # non-finite rows traced to it (memory left as allocated may hold NaN: replay/diff/explain/nonfinite.py)
    cause = report["explanations"][0]
    assert cause["cause"] in ("contract.draft_unloaded", "unloaded_params"), cause
    assert "model.layers.1." in cause["message"] and "left as allocated" in cause["message"], cause
    warned = {m["field"] for m in report["contract_mismatches"] if m["severity"] == "warn"}
    # layer 1's input norm is the ones vLLM built, not the hidden_norm training computed with: said too
    assert warned == {"draft_unloaded.model.layers.1", "draft_layer_input_norms.layers.1"}, warned


@pytest.mark.server
@pytest.mark.slow
def test_an_sglang_format_two_layer_draft_on_vllm_is_named_by_the_norm_its_later_layer_reads(tmp_path, server_env):
    """draft2l as an SGLang-only exporter writes it (``layers.1.input_layernorm`` the unused ones, the trained weight in
    ``hidden_norm``) served by vLLM, which normalises layer 1 with ``input_layernorm`` (llama_eagle3.py:136-138):
    every weight file agrees tensor by tensor, yet layer 1 computes another function. The contract's
    ``draft_layer_input_norms`` (read off each side's live layers by its own rule) names it with the fix."""
    served = _for_vllm(tmp_path / "draft-sglang-norms", sglang_only=True)
    serve, _ = _serve(served, tmp_path, server_env, "--enforce-eager")
    proc = train_and_diff(served, serve, tmp_path / "train.trace")
    report = json.loads(proc.stdout)
    named = [m for m in report["contract_mismatches"] if m["field"] == "draft_layer_input_norms.layers.1"]
    assert named and named[0]["severity"] == "warn" and "input_layernorm" in named[0]["fix"], \
        report["contract_mismatches"]
    first = report["first_divergence"]
    if first is not None:  # measured: exit 1 (draft.logits_topk.ids); the fact bears on the draft's layers on
        assert proc.returncode == 1
        assert "draft_layer_input_norms.layers.1" in first["contract_bearing"], first
