"""The live contract of each served family (tests/support/family_servers.py's servers): written at
start-up, before any request, it names what the family's SGLang model file captures, and every
recorded aux slot is nearest the HF hidden state the contract names (GPT-OSS's index L is the last
layer's output before the final norm, ``aux_prenorm_indices``). Expected capture indices are read off
SGLang 0.5.23's ``set_eagle3_layers_to_capture``: qwen3.py:778 and qwen3_moe.py:1128 capture
``[id + 1]``; deepseek_v2.py:3458 captures the ids literally unless ``ids[0] == 1``; gpt_oss.py:1337
keeps them literally when ``max(ids) == L`` and captures index L at the final norm (gpt_oss.py:731).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sglang")

from support.family_servers import FAMILIES, SPEC_MODES  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.mark.parametrize("mode", SPEC_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_contract_names_what_the_family_really_captures(family_servers, family, mode):
    run = family_servers(family, mode)
    case, c = run.case, run.contract
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


@pytest.mark.parametrize("family", FAMILIES)
def test_target_identity_facts_match_what_training_computes_from_the_checkpoint(family_servers, family):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from specdiff.tracer.contract import target_identity_facts

    run = family_servers(family, "chain")
    c, target = run.contract, run.target
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    train = target_identity_facts(AutoConfig.from_pretrained(str(target), local_files_only=True), embed.float())
    for fact in ("target_architecture", "target_config_sha256", "target_num_experts", "target_experts_per_token",
                 "target_weights_fingerprint"):
        assert c[fact] == train[fact], fact


@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_aux_slots_are_the_hf_hidden_states_the_contract_names(family_servers, family):
    """Each recorded slot j is nearest to HF hidden_states[aux_hf_indices[j]] among all L+1 HF
    states of the same prompt rows: the contract is what the engine captured, not a rule's guess."""
    from specdiff.replay.model.target_capture import load_target
    from specdiff.tracer.store import open_trace

    run = family_servers(family, "chain")
    trace, c = open_trace(str(run.trace)), run.contract
    model = load_target(run.target, dtype=torch.float32)
    L = model.config.num_hidden_layers
    seq = trace.sequences[0]  # the first prompt: prefilled with no cached prefix
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


# ---- correct pairs: training replay vs serving ------------------------------------------------------
