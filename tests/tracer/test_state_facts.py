"""The state facts besides the parameters (tracer/state_facts.py, replay/record/train_state.py): every
registered buffer fingerprinted as live after loading, and each decoder layer's rope table in one layout.

The training side's facts are read off the committed demo target (transformers' Llama) and the reference
draft as ``record train`` loads them; an SGLang-style rotary (one ``cos_sin_cache`` buffer shared by the
layers that asked ``get_rope`` for the same setting) is a stand-in module here; the real server's are
compared with training's in tests/tracer/engines/test_draft_stages.py.
"""

from __future__ import annotations

import pytest
import torch

from specdiff.demo.run import REPO_MODELS
from specdiff.tracer.state_facts import (
    META,
    buffer_fingerprints,
    cos_sin_cache_fingerprint,
    rope_table_fingerprint,
    shared_rotaries,
)

needs_models = pytest.mark.skipif(not (REPO_MODELS / "draft" / "config.json").exists(),
                                  reason="the demo models are not built (traces/models)")


@pytest.fixture(scope="module")
def demo():
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.model.target_capture import load_target, target_embedding, target_lm_head

    target = load_target(REPO_MODELS / "target", dtype=torch.bfloat16)
    draft = load_draft(REPO_MODELS / "draft", dtype=torch.bfloat16, target_embedding=target_embedding(target).float(),
                       target_lm_head=target_lm_head(target).float())
    return target, draft


class _Rotary(torch.nn.Module):
    """SGLang's layout: ``cos_sin_cache`` [max_position, rotary_dim] = cat(cos, sin), non-persistent."""

    def __init__(self, positions: int = 64, dim: int = 8):
        super().__init__()
        inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        freqs = torch.arange(positions, dtype=torch.float)[:, None] * inv
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], -1), persistent=False)


class _Layer(torch.nn.Module):
    def __init__(self, rotary):
        super().__init__()
        self.self_attn = torch.nn.Module()
        self.self_attn.rotary_emb = rotary
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("scale", torch.ones(4))


def test_a_shared_rotary_cache_zeroed_after_load_changes_exactly_its_fingerprints():
    shared = _Rotary()
    target = torch.nn.ModuleList([_Layer(shared), _Layer(shared)])
    draft = torch.nn.ModuleList([_Layer(shared)])
    before = buffer_fingerprints(target)
    # the one cache under each layer that holds it; persistent or not, every registered buffer
    assert set(before) == {"0.self_attn.rotary_emb.cos_sin_cache", "1.self_attn.rotary_emb.cos_sin_cache",
                           "0.scale", "1.scale"}
    assert shared_rotaries(draft, target, target_prefix="layers") == {"layers.0": "layers.0"}
    table = cos_sin_cache_fingerprint(shared)
    with torch.no_grad():
        shared.cos_sin_cache.zero_()  # lost after load, no parameter touched
    after = buffer_fingerprints(target)
    assert {k for k in before if before[k] != after[k]} == {"0.self_attn.rotary_emb.cos_sin_cache",
                                                            "1.self_attn.rotary_emb.cos_sin_cache"}
    assert cos_sin_cache_fingerprint(shared) != table
    # the draft reads the same object: its loss shows in the target, and the reverse
    assert buffer_fingerprints(draft)["0.self_attn.rotary_emb.cos_sin_cache"] == after["0.self_attn.rotary_emb.cos_sin_cache"]
    assert shared_rotaries(torch.nn.ModuleList([_Layer(_Rotary())]), target, target_prefix="layers") == {}


def test_a_buffer_without_storage_is_meta_and_a_cache_of_another_layout_unknown():
    rot = _Rotary()
    rot.cos_sin_cache = torch.empty(64, 8, device="meta")
    assert buffer_fingerprints(rot) == {"cos_sin_cache": META} and cos_sin_cache_fingerprint(rot) == META
    other = _Rotary()
    other.position_start = 5  # row 0 is not position 0: not the canonical table, not guessed
    assert cos_sin_cache_fingerprint(other) == "unknown"
    assert cos_sin_cache_fingerprint(torch.nn.Module()) == "unknown"


def test_the_canonical_table_is_the_cache_layout():
    rot = _Rotary(positions=16, dim=8)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    freqs = torch.arange(16, dtype=torch.float)[:, None] * inv
    assert rope_table_fingerprint(freqs.cos(), freqs.sin()) == cos_sin_cache_fingerprint(rot)


@needs_models
def test_training_side_buffers_and_rope_tables_change_exactly_where_a_buffer_changed(demo):
    from specdiff.replay.record.train_state import train_state_facts

    target, draft = demo
    before = train_state_facts(target, draft)
    buffers = buffer_fingerprints(target)  # the target's every buffer: the rotary's, which target_rope covers
    assert set(buffers) == {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    assert set(buffer_fingerprints(draft.model)) == {"d2t", "t2d"}  # covered by d2t_sha256 / t2d_sha256
    assert "target_buffers" not in before and "draft_rope_shared" not in before  # engine names: serving's facts
    assert set(before["target_rope"]) == {f"layers.{i}" for i in range(8)}
    # one rope setting (theta 1e4, head 64, 2048 positions): the HF target's and the reference draft's
    # tables, computed by two forwards, are one table
    assert set(before["target_rope"].values()) == {before["draft_rope"]["layers.0"]} != {"unknown"}
    assert before["target_config_overrides"] == before["draft_config_overrides"] == {}
    inv = target.model.rotary_emb.inv_freq
    saved = inv.clone()
    try:
        with torch.no_grad():
            inv.zero_()
        after = train_state_facts(target, draft)
        after_buffers = buffer_fingerprints(target)
    finally:
        with torch.no_grad():
            inv.copy_(saved)
    assert {k for k in buffers if buffers[k] != after_buffers[k]} == {"model.rotary_emb.inv_freq"}
    assert all(after["target_rope"][k] != v for k, v in before["target_rope"].items())
    assert after["draft_rope"] == before["draft_rope"]
    assert train_state_facts(target, draft) == before


def test_a_deepseek_yarn_table_fingerprints_alike_from_transformers_and_sglangs_cache(repo_models):
    # the correct DeepSeek-V3 pair's target_rope differed on every layer (2026-12-07): SGLang 0.5.23 builds its
    # DeepSeek YaRN rotary for the original 512 positions and caches 512 x factor rows; the fingerprint took
    # 512 rows there and transformers' 2048 (the config's max_position_embeddings). The cache as SGLang computes
    # it (rope_variant.py DeepseekScalingRotaryEmbedding._compute_cos_sin_cache, its __init__'s mscale), against
    # the committed DeepSeek-V3 target's own rotary.
    import json
    import types

    pytest.importorskip("sglang")
    from sglang.srt.layers.rotary_embedding.rope_variant import (
        DeepseekScalingRotaryEmbedding,
        yarn_get_mscale,
    )

    from specdiff.replay.model.target_capture import load_target
    from specdiff.replay.record.train_state import hf_rope_tables

    folder = repo_models.parent / "families" / "deepseek_v3" / "target"
    cfg = json.loads((folder / "config.json").read_text())
    rs = cfg["rope_scaling"]
    rot = DeepseekScalingRotaryEmbedding.__new__(DeepseekScalingRotaryEmbedding)  # its __init__ needs a GPU
    rot.head_size = rot.rotary_dim = cfg["qk_rope_head_dim"]
    rot.max_position_embeddings = rs["original_max_position_embeddings"]
    rot.base, rot.is_neox_style, rot.dtype, rot.device = cfg.get("rope_theta", 10000), False, torch.float32, "cpu"
    rot.scaling_factor, rot.extrapolation_factor, rot.attn_factor = rs["factor"], 1, 1
    rot.beta_fast, rot.beta_slow = rs["beta_fast"], rs["beta_slow"]
    rot.mscale = float(yarn_get_mscale(rs["factor"], float(rs["mscale"])) /
                       yarn_get_mscale(rs["factor"], float(rs["mscale_all_dim"])))
    cache = rot._compute_cos_sin_cache()
    assert cache.shape[0] == rs["original_max_position_embeddings"] * rs["factor"]  # more rows than it was built for
    served = cos_sin_cache_fingerprint(types.SimpleNamespace(cos_sin_cache=cache, position_start=0))
    trained = hf_rope_tables(load_target(folder))
    assert set(trained.values()) == {served}


#: GPT-OSS's own rope (gpt-oss-20b/120b config.json: YaRN, factor 32, beta 32/1, not truncated), over fewer
#: original positions so SGLang's cache (original x factor rows) stays small
_GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 256, "rope_theta": 150000.0}


def _gpt_oss(rope: dict):
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, num_local_experts=2, num_experts_per_tok=1,
                       max_position_embeddings=8192, layer_types=["sliding_attention", "full_attention"],
                       rope_parameters=dict(rope))
    return GptOssForCausalLM(cfg)


def _sglang_cache(rope: dict, head_dim: int = 32):
    """The ``cos_sin_cache`` SGLang 0.5.23 builds for this GPT-OSS rope (``get_rope``, factory.py): the base
    rotary's (base.py ``_compute_cos_sin_cache``, as ``_Rotary``) or ``YaRNScalingRotaryEmbedding``'s, whose
    __init__ is replayed here (yarn.py:97-135: mscale from the factor, times attn_factor 1) as it needs SGLang's
    platform; the rotary is built for the original positions and caches them x factor (yarn.py:171-180)."""
    if rope["rope_type"] == "default":
        inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        freqs = torch.arange(512, dtype=torch.float)[:, None] * inv
        return torch.cat([freqs.cos(), freqs.sin()], -1)
    from sglang.srt.layers.rotary_embedding.yarn import YaRNScalingRotaryEmbedding, yarn_get_mscale_simple

    rot = YaRNScalingRotaryEmbedding.__new__(YaRNScalingRotaryEmbedding)
    rot.head_size = rot.rotary_dim = head_dim
    rot.max_position_embeddings, rot.base = rope["original_max_position_embeddings"], rope["rope_theta"]
    rot.scaling_factor, rot.extrapolation_factor, rot.attn_factor = rope["factor"], 1, 1
    rot.beta_fast, rot.beta_slow, rot.truncate = rope["beta_fast"], rope["beta_slow"], rope["truncate"]
    rot.mscale = float(yarn_get_mscale_simple(rope["factor"]))
    return rot._compute_cos_sin_cache()


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0}, _GPT_OSS_YARN],
                         ids=["default", "yarn"])
def test_a_gpt_oss_table_of_one_column_per_frequency_fingerprints_as_sglangs_cache(rope):
    # transformers' GPT-OSS rotary returns cos and sin [P, rotary_dim/2] (modeling_gpt_oss.py:186-192), not
    # cat(freqs, freqs): taking its first half fingerprinted a quarter of the frequencies, and a correct tiny
    # GPT-OSS pair's target_rope differed on every layer (2026-12-07). YaRN's attention scaling (1.35 at
    # factor 32) is in both tables.
    import types

    from specdiff.replay.record.train_state import hf_rope_tables

    if rope["rope_type"] == "yarn":
        pytest.importorskip("sglang")
    served = cos_sin_cache_fingerprint(types.SimpleNamespace(cos_sin_cache=_sglang_cache(rope), position_start=0))
    assert set(hf_rope_tables(_gpt_oss(rope)).values()) == {served}
    # a rope mistake still shows: another theta is another table
    assert set(hf_rope_tables(_gpt_oss({**rope, "rope_theta": rope["rope_theta"] * 2})).values()) != {served}


def test_a_rotary_output_of_another_width_is_unknown_not_a_table():
    from specdiff.replay.record.train_state import per_frequency

    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))  # 4 frequencies
    freqs = torch.arange(16, dtype=torch.float)[:, None] * inv
    cos, sin = freqs.cos(), freqs.sin()
    doubled = (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    for got in (per_frequency(cos, sin, inv), per_frequency(*doubled, inv), per_frequency(*doubled, None)):
        assert got is not None and torch.equal(got[0], cos) and torch.equal(got[1], sin)
    assert per_frequency(cos[:, :3], sin[:, :3], inv) is None  # neither layout's width
    assert per_frequency(cos, sin, None) is None  # one column per frequency cannot be told without inv_freq
    # twice the frequencies wide, but the halves differ: not cat(freqs, freqs)
    assert per_frequency(torch.cat([cos, cos.flip(-1)], -1), torch.cat([sin, sin.flip(-1)], -1), inv) is None
