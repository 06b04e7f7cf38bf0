"""Random targets and EAGLE-3 drafts of production shapes, a few layers deep (benchmarks only).

``SHAPES`` holds two real models' published dimensions:

- ``llama3-8b``: Llama-3-8B (``meta-llama/Meta-Llama-3-8B`` config.json: hidden 4096, MLP 14336, 32
  heads / 8 KV heads, head_dim 128, vocab 128,256, 32 layers, rope theta 500,000) with a draft of the
  same width whose vocabulary is 32,000 (SpecForge's Llama-3 EAGLE-3 recipe, ``draft_vocab_size``).
- ``kimi-k2``: Kimi-K2 (``moonshotai/Kimi-K2-Instruct`` config.json, a DeepseekV3ForCausalLM: hidden
  7168, MLA with q_lora_rank 1536, kv_lora_rank 512, qk_nope/rope head dims 128/64, v_head_dim 128, 64
  heads, vocab 163,840, 61 layers, 384 routed experts of width 2048 plus 1 shared, 8 per token, yarn
  rope factor 32 over 4096 positions) with a 7168-wide draft, vocabulary 32,000.

``build_production_target(shape, out, layers=2)`` writes a random bf16 target of that shape with
``layers`` decoder layers (Kimi-K2: ``experts`` routed experts, ``min(8, experts)`` per token, every
layer MoE, so two layers fit a small machine's memory: their weights are mostly the two
vocabulary matrices, 2 x 163,840 x 7168 x 2 bytes = 4.4 GiB). ``build_production_draft(shape, out,
aux_ids)`` writes a random one-layer EAGLE-3 draft of the shape's width (SpecForge format). Both
initialise directly in bf16: a float32 model of the Kimi-K2 shape would need twice the memory.
The DeepSeek-V3 config keys SGLang reads come from ``families`` (the tiny family targets' builder).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: name -> the real model's dimensions; ``layers_full``: its decoder layers (projections scale to it)
SHAPES = {
    "llama3-8b": dict(arch="llama", hidden=4096, vocab=128256, draft_vocab=32000, layers_full=32,
                      intermediate=14336, heads=32, kv_heads=8, head_dim=128, rope_theta=500000.0),
    "kimi-k2": dict(arch="deepseek_v3", hidden=7168, vocab=163840, draft_vocab=32000, layers_full=61,
                    intermediate=18432, moe_intermediate=2048, heads=64, kv_heads=64, head_dim=128,
                    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                    v_head_dim=128, experts_full=384, experts_per_tok=8, rope_theta=50000.0),
}


def _check(shape: str) -> dict:
    if shape not in SHAPES:
        raise ValueError(f"unknown production shape {shape!r}; known: {', '.join(SHAPES)}")
    return SHAPES[shape]


def production_config(shape: str, *, layers: int = 2, experts: int = 4):
    """The transformers config of ``shape`` with ``layers`` decoder layers (Kimi-K2: ``experts``
    routed experts, every layer MoE).

    Raises:
        ValueError: unknown ``shape``.
    """
    s = _check(shape)
    ids = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False, rms_norm_eps=1e-5)
    if s["arch"] == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                           num_hidden_layers=layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                           head_dim=s["head_dim"], max_position_embeddings=8192,
                           rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]}, **ids)
    from transformers import DeepseekV3Config

    yarn = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": s["rope_theta"]}
    return DeepseekV3Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                            moe_intermediate_size=s["moe_intermediate"], num_hidden_layers=layers,
                            num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                            q_lora_rank=s["q_lora_rank"], kv_lora_rank=s["kv_lora_rank"],
                            qk_nope_head_dim=s["qk_nope_head_dim"], qk_rope_head_dim=s["qk_rope_head_dim"],
                            v_head_dim=s["v_head_dim"], n_routed_experts=experts, n_shared_experts=1,
                            num_experts_per_tok=min(s["experts_per_tok"], experts), n_group=1, topk_group=1,
                            first_k_dense_replace=0, norm_topk_prob=True, routed_scaling_factor=2.827,
                            max_position_embeddings=131072, rope_parameters=yarn, rope_interleave=True, **ids)


def build_production_target(shape: str, out_dir: str | Path, *, layers: int = 2, experts: int = 4,
                            seed: int = 0) -> Path:
    """Write a random bf16 target of ``shape`` (``production_config``) into ``out_dir`` with the
    demo tokenizer (``families.save_family_target``: config keys SGLang reads, ``architectures``).
    Weights are N(0, 0.02) (transformers' init), drawn in bf16. Returns ``out_dir``.

    Raises:
        ValueError: unknown ``shape``.
    """
    from transformers import AutoModelForCausalLM

    from specdiff.demo_models.families import save_family_target

    s = _check(shape)
    cfg = production_config(shape, layers=layers, experts=experts)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    out = save_family_target(model, s["arch"], out_dir)
    if s["arch"] == "deepseek_v3":  # families' extra keys carry the tiny targets' rope: this shape's instead
        path = out / "config.json"
        c = json.loads(path.read_text())
        rope = dict(cfg.rope_parameters)
        c["rope_theta"] = rope.pop("rope_theta")
        c["rope_scaling"] = {**{k: v for k, v in rope.items() if k != "rope_type"}, "type": "yarn"}
        path.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    return out


def build_production_draft(shape: str, out_dir: str | Path, *, aux_ids: list[int], seed: int = 1) -> Path:
    """Write a random one-layer EAGLE-3 draft of ``shape``'s width into ``out_dir`` (SpecForge
    format, bf16): hidden = the target's, MLP and heads of a Llama layer of that width (Kimi-K2:
    56 heads of 128, 8 KV heads, MLP 18432), vocabulary ``draft_vocab`` (target ids 3..Vd+2: d2t
    offsets of 3). ``aux_ids``: ``eagle_aux_hidden_state_layer_ids`` in SGLang's numbering.

    Raises:
        ValueError: unknown ``shape``.
    """
    from specdiff.eagle3.norms import NORMS_OFF
    from specdiff.replay.model.checkpoint import save_draft
    from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig

    s = _check(shape)
    h, vd = s["hidden"], s["draft_vocab"]
    cfg = Eagle3DraftConfig(hidden_size=h, intermediate_size=s["intermediate"], num_attention_heads=h // 128,
                            num_key_value_heads=8, head_dim=128, vocab_size=s["vocab"], draft_vocab_size=vd,
                            num_aux=3, target_hidden_size=h, rms_norm_eps=1e-5, rope_theta=s["rope_theta"],
                            rope_scaling=None, **NORMS_OFF, eagle_aux_hidden_state_layer_ids=list(aux_ids),
                            aux_convention="sglang", max_position_embeddings=8192)
    torch.manual_seed(seed)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # drawn in bf16: no float32 copy of the draft at any time
    try:
        draft = Eagle3Draft(cfg)
    finally:
        torch.set_default_dtype(saved)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
        draft.d2t.copy_(torch.full_like(draft.d2t, 3))
        draft.t2d.zero_()
        draft.t2d[3:vd + 3] = True
    save_draft(draft, out_dir, "specforge", dtype=torch.bfloat16)
    return Path(out_dir)


__all__ = ["SHAPES", "build_production_draft", "build_production_target", "production_config"]
