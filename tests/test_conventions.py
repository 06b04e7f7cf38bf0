"""Aux-layer id conventions -> HF hidden_states indices (DESIGN.md "Aux layer ids")."""

from __future__ import annotations

import pytest

from specdiff.eagle3.aux_layers import CONVENTIONS, ConventionError, default_hf_indices, resolve_aux_ids
from specdiff.replay.model.checkpoint import native_aux_ids

L = 8


def hf(ids, convention, num_layers=L):
    return list(resolve_aux_ids(ids, convention=convention, num_layers=num_layers).hf_indices)


def test_each_convention_maps_ids_to_hf_indices():
    assert hf([1, 4, 5], "hf") == [1, 4, 5]
    assert hf([1, 4, 5], "vllm") == [1, 4, 5]          # vLLM: id k = HF index k
    assert hf([1, 4, 5], "speculators") == [1, 4, 5]
    assert hf([1, 4, 5], "sglang") == [2, 5, 6]        # SGLang: captures id+1
    assert hf([1, 4, 5], "specforge") == [2, 5, 6]     # SpecForge: output of layers[id]


def test_same_numbers_mean_different_layers_in_sglang_and_vllm():
    # the seed's bug: one id list, read by two tools, one layer apart
    assert [a - b for a, b in zip(hf([2, 4, 6], "sglang"), hf([2, 4, 6], "vllm"))] == [1, 1, 1]


def test_sglang_id_minus_one_is_the_embedding_output():
    r = resolve_aux_ids([-1, 3, 5], convention="sglang", num_layers=L)
    assert r.hf_indices == (0, 4, 6) and r.dropped == ()


def test_sglang_id_last_layer_is_silently_dropped():
    r = resolve_aux_ids([1, 3, L - 1], convention="sglang", num_layers=L)
    assert r.hf_indices == (2, 4)
    assert r.dropped == (L - 1,)
    assert any("silently dropped" in n for n in r.notes)
    assert r.as_facts()["aux_dropped_ids"] == [L - 1]


def test_defaults_are_hf_2_half_lminus3():
    for conv in CONVENTIONS:
        r = resolve_aux_ids(None, convention=conv, num_layers=L)
        assert r.hf_indices == default_hf_indices(L) == (2, 4, 5)
        assert r.ids is None
    # SpecForge's own default ids [1, L//2-1, L-4] land on the same HF indices
    assert hf([1, L // 2 - 1, L - 4], "specforge") == [2, L // 2, L - 3]


def test_ascending_order_and_dedup():
    r = resolve_aux_ids([5, 1, 3], convention="vllm", num_layers=L)
    assert r.hf_indices == (1, 3, 5)
    assert any("ascending" in n for n in r.notes)
    assert hf([3, 3, 1], "hf") == [1, 3]


@pytest.mark.parametrize("conv,ids", [("sglang", [-2]), ("sglang", [L]), ("vllm", [L + 1]),
                                      ("specforge", [L]), ("specforge", [-1]), ("hf", [-1])])
def test_out_of_range_ids_are_refused(conv, ids):
    with pytest.raises(ConventionError):
        resolve_aux_ids(ids, convention=conv, num_layers=L)


def test_unknown_convention_is_refused():
    with pytest.raises(ConventionError, match="unknown aux convention"):
        resolve_aux_ids([1], convention="eagle", num_layers=L)


@pytest.mark.parametrize("conv", ["hf", "vllm", "speculators", "sglang", "specforge"])
def test_native_ids_invert_resolution(conv):
    target = (2, 4, 5) if conv != "sglang" else (0, 4, 5)
    ids = native_aux_ids(target, conv)
    assert hf(ids, conv) == list(target)
