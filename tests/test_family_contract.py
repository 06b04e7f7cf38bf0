"""The live contract of every target family EAGLE-3 is served on (issue 20), from real CPU servers.

One traced SGLang server per family (tiny target built offline: 8 layers, hidden 256, vocab 4096,
``specdiff.demo_models.families.build_family_target``; random EAGLE-3 draft of
``specdiff.demo_models.bringup.build_draft`` with aux ids chosen so that each family's own rule
matters). The contract is written at start-up, before any request; one short request then shows
that the aux slots the trace holds are the HF hidden states the contract names (nearest HF layer of
every row; GPT-OSS's index L is the last layer's output before the final norm, ``aux_prenorm_indices``).

Expected capture indices are read off SGLang 0.5.23's ``set_eagle3_layers_to_capture`` of each file:
qwen3.py:778 and qwen3_moe.py:1128 capture ``[id + 1]``; deepseek_v2.py:3458 captures the ids
literally unless ``ids[0] == 1``; gpt_oss.py:1337 keeps them literally when ``max(ids) == L`` and
captures index L at the final norm (gpt_oss.py:731).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch


@dataclass(frozen=True)
class Case:
    ids: list[int]              # the draft's eagle_aux_hidden_state_layer_ids
    hf: list[int]               # what SGLang 0.5.23 captures from them (read off the model file)
    architecture: str
    rule_file: str              # the file whose set_eagle3_layers_to_capture runs
    experts: int | None         # routed experts / experts per token of the tiny target
    per_token: int | None


CASES = {
    "qwen3": Case([1, 3, 4], [2, 4, 5], "Qwen3ForCausalLM", "srt/models/qwen3.py", None, None),
    "qwen3_moe": Case([1, 3, 4], [2, 4, 5], "Qwen3MoeForCausalLM", "srt/models/qwen3_moe.py", 4, 2),
    # max(ids) == L: kept literally; index 8 is the last layer's output before the final norm, which HF
    # hidden_states[8] (after the norm) is not: the contract lists it in aux_prenorm_indices
    "gpt_oss": Case([0, 3, 8], [0, 3, 8], "GptOssForCausalLM", "srt/models/gpt_oss.py", 4, 2),
    # the motivating family: ids[0] != 1, so the ids are captured literally (not id + 1)
    "deepseek_v3": Case([0, 3, 6], [0, 3, 6], "DeepseekV3ForCausalLM", "srt/models/deepseek_v2.py", 4, 2),
}

PROMPT = "def add(a, b):\n    return"


def _wait_contract(path: Path, timeout_s: float = 60.0) -> dict:
    """The trace's contract once start-up facts are in (refresh after _capture_cuda_graphs is
    written by the recorder's writer thread, shortly after the server reports ready)."""
    from specdiff.tracer.store import open_trace

    deadline = time.monotonic() + timeout_s
    while True:
        c = open_trace(str(path)).contract
        if c.get("aux_hf_indices") != "unknown" or time.monotonic() > deadline:
            return c
        time.sleep(0.2)


@pytest.fixture(scope="module", params=list(CASES))
def family_server(request, tmp_path_factory, server_env):
    """(family, case, target dir, trace path, contract) of a traced server of that family; one at a
    time (module-scoped params run in order), stopped by PID before the next starts."""
    pytest.importorskip("sglang")
    families = pytest.importorskip("specdiff.demo_models.families")
    from specdiff.demo_models.bringup import build_draft
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    family, case = request.param, CASES[request.param]
    root = tmp_path_factory.mktemp(family)
    target = families.build_family_target(family, root / "target", trained=False)
    build_draft(root / "draft", aux_layer_ids=case.ids)
    trace = root / "serve.trace"
    srv = ServerProcess(target, draft_model_path=root / "draft", spec=SpecSettings(num_steps=2, topk=1, num_draft_tokens=3),
                        extra_args=["--dtype", "bfloat16"], env=server_env(SPECDIFF_TRACE=str(trace)))
    srv.start()
    try:
        contract = _wait_contract(trace)  # written at start-up, before any request
        srv.generate(PROMPT, max_new_tokens=4)
    finally:
        pid = srv.pid
        srv.stop()
        assert srv.proc.poll() is not None, f"server {pid} still running after stop()"
    return family, case, Path(target), trace, contract


def test_the_contract_names_what_the_family_really_captures(family_server):
    family, case, target, _, c = family_server
    assert c["aux_native_ids"] == case.ids
    assert c["aux_hf_indices"] == case.hf and c["aux_concat_order"] == case.hf and c["aux_dropped_ids"] == []
    assert c["target_architecture"] == case.architecture
    assert c["aux_capture_rule"].startswith(f"sglang {case.rule_file}:")
    assert c["aux_capture_rule"].endswith(".set_eagle3_layers_to_capture")
    assert (c["target_num_experts"], c["target_experts_per_token"]) == (case.experts, case.per_token)
    # the draft shares the target's embedding and keeps its own (1024-row) lm_head
    assert (c["embed_source"], c["lm_head_source"]) == ("target", "draft")
    assert c["unobservable"] == [], c["unobservable"]
    if family in ("deepseek_v3", "gpt_oss"):  # the Llama rule would have told a different story here
        assert case.hf != [i + 1 for i in case.ids]


def test_target_identity_facts_match_what_training_computes_from_the_checkpoint(family_server):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from specdiff.tracer.contract import target_identity_facts

    _, _, target, _, c = family_server
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    train = target_identity_facts(AutoConfig.from_pretrained(str(target), local_files_only=True), embed.float())
    for fact in ("target_architecture", "target_config_sha256", "target_num_experts", "target_experts_per_token",
                 "target_weights_fingerprint"):
        assert c[fact] == train[fact], fact


def test_recorded_aux_slots_are_the_hf_hidden_states_the_contract_names(family_server):
    """Each recorded slot j is nearest to HF hidden_states[aux_hf_indices[j]] among all L+1 HF
    states of the same prompt rows: the contract is what the engine captured, not a rule's guess."""
    from specdiff.replay.model.target_capture import load_target
    from specdiff.tracer.store import open_trace

    family, _, target, trace_path, c = family_server

    trace = open_trace(str(trace_path))
    model = load_target(target, dtype=torch.float32)
    L = model.config.num_hidden_layers
    (seq,) = trace.sequences
    keys = trace.keys("target.aux.0")
    pos = keys["pos"][keys["seq"] == seq.id]
    T = int(pos.max()) + 1
    last_out = []  # the last decoder layer's output before the final norm (no HF index holds it)
    hook = model.model.layers[-1].register_forward_hook(
        lambda _m, _i, o: last_out.append((o[0] if isinstance(o, tuple) else o)[0].float().numpy()))
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(seq.tokens[:T].astype(np.int64))[None], output_hidden_states=True)
    hook.remove()
    # candidates 0..L are HF hidden_states; L + 1 stands for the pre-norm output of the last layer
    cands = [h[0].float().numpy() for h in out.hidden_states] + last_out
    assert len(cands) == L + 2
    assert c["aux_prenorm_indices"] == ([L] if family == "gpt_oss" else [])
    for j, want in enumerate(c["aux_hf_indices"]):
        k = trace.keys(f"target.aux.{j}")
        sel = np.where(k["seq"] == seq.id)[0]
        got = trace.read(f"target.aux.{j}")[sel].astype(np.float32)
        p = k["pos"][sel]
        err = [np.linalg.norm(got - h[p]) / np.linalg.norm(h[p]) for h in cands]
        expect = L + 1 if want in c["aux_prenorm_indices"] else want
        assert int(np.argmin(err)) == expect, (family, j, want, [round(float(e), 3) for e in err])
        # and clearly so: bf16 serving against an fp32 reference moves a row, never to another layer's scale
        assert err[expect] < 0.5 * min(e for i, e in enumerate(err) if i != expect), (family, j, want, err)
    assert f"target.aux.{len(c['aux_hf_indices'])}" not in trace.names
