"""Tiny targets of every family EAGLE-3 is served on (issue 20), built offline and deterministically.

API: ``build_family_target(family, out_dir, *, trained=True) -> Path`` writes a HF model folder
(config.json with ``architectures``, bf16 ``model.safetensors``, the demo tokenizer) for each
name in ``FAMILIES``; ``family_config(family)`` is the transformers config it uses.

Every target has 8 decoder layers, hidden 256 and the demo's byte-level BPE vocabulary of 4096
(the tokenizer is copied from ``traces/models/target``, or built by
:func:`specdiff.demo_models.tiny_models.build_tokenizer` when that folder is absent). Expert and
MLP sizes are small so a CPU trains each in a few minutes. What each family exercises:

- ``llama``: ``LlamaForCausalLM``, the demo target's dimensions (``tiny_models.TARGET_DIMS``).
- ``qwen3``: ``Qwen3ForCausalLM`` (per-head q/k RMSNorm, GQA 4:2, head_dim 64).
- ``qwen3_moe``: ``Qwen3MoeForCausalLM``, 4 experts, top-2, normalised top-k weights (as
  Qwen3-30B-A3B's ``norm_topk_prob``), every layer sparse.
- ``deepseek_v3``: ``DeepseekV3ForCausalLM`` (the Kimi-K2 architecture): MLA with
  ``q_lora_rank`` 64, ``kv_lora_rank`` 64, ``qk_nope_head_dim`` 32, ``qk_rope_head_dim`` 16,
  ``v_head_dim`` 32, yarn rope (factor 4 over 512 positions); 4 routed + 1 shared expert, top-2,
  sigmoid scores with the ``noaux_tc`` correction bias, 2 groups of 2 experts of which
  ``topk_group`` 1 is kept (so grouped top-k routing removes candidates), layer 0 dense
  (``first_k_dense_replace`` 1).
- ``gpt_oss``: ``GptOssForCausalLM``: 4 experts, top-2, alternating sliding (window 32) / full
  attention, learned attention sinks, biased attention, clamped SwiGLU.

``trained=False`` keeps the seeded random initialisation (seconds). ``trained=True`` trains the
target briefly as a language model on the stdlib text (:func:`train_family_target`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specdiff.demo_models.tiny_models import TARGET_DIMS, VOCAB_SIZE

FAMILIES = ("llama", "qwen3", "qwen3_moe", "deepseek_v3", "gpt_oss")

#: HF architecture name of each family's target (``config.json`` ``architectures[0]``).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}

NUM_LAYERS = TARGET_DIMS["num_hidden_layers"]   # 8
HIDDEN = TARGET_DIMS["hidden_size"]             # 256
MAX_POSITIONS = TARGET_DIMS["max_position_embeddings"]
ROPE_THETA = TARGET_DIMS["rope_theta"]
SLIDING_WINDOW = 32
SEEDS = {f: 1234 + i for i, f in enumerate(FAMILIES)}  # one fixed seed per family

# the demo tokenizer's ids (tiny_models.SPECIAL_TOKENS)
_IDS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
_COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=NUM_LAYERS,
               max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, tie_word_embeddings=False,
               **_IDS)

# DeepSeek-V3's yarn rope, scaled down: factor 4 over 512 original positions -> 2048
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
         "rope_theta": ROPE_THETA}

#: keys a DeepSeek-V3 checkpoint's config.json carries that transformers 5 does not model but
#: SGLang 0.5.23 reads (srt/models/deepseek_v2.py: ``config.scoring_func``, ``topk_method``,
#: ``moe_layer_freq``; ``rope_scaling``/``rope_theta`` for readers that predate rope_parameters).
_DEEPSEEK_EXTRA = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
                   "rope_theta": ROPE_THETA,
                   "rope_scaling": {**{k: v for k, v in _YARN.items() if k not in ("rope_type", "rope_theta")},
                                    "type": "yarn"}}


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown target family {family!r}; known: {', '.join(FAMILIES)}")


def family_config(family: str):
    """The transformers 5.19 config of ``family``'s tiny target (8 layers, hidden 256, vocab 4096).

    Raises:
        ValueError: ``family`` is not one of ``FAMILIES``.
    """
    _check_family(family)
    rope = {"rope_type": "default", "rope_theta": ROPE_THETA}
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**TARGET_DIMS, **_IDS)
    if family == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**_COMMON, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, rope_parameters=rope, max_window_layers=NUM_LAYERS)
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(**_COMMON, intermediate_size=512, moe_intermediate_size=256,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                              num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                              decoder_sparse_step=1, mlp_only_layers=[], rope_parameters=rope)
    if family == "deepseek_v3":
        from transformers import DeepseekV3Config

        return DeepseekV3Config(**_COMMON, intermediate_size=512, moe_intermediate_size=128,
                                num_attention_heads=4, num_key_value_heads=4,
                                q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                v_head_dim=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
                                routed_scaling_factor=2.5, rope_parameters=dict(_YARN), rope_interleave=True)
    from transformers import GptOssConfig

    return GptOssConfig(**_COMMON, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, num_local_experts=4, num_experts_per_tok=2,
                        sliding_window=SLIDING_WINDOW,
                        layer_types=["sliding_attention", "full_attention"] * (NUM_LAYERS // 2),
                        rope_parameters=rope)


def init_family_model(family: str, seed: int | None = None):
    """A fp32 ``*ForCausalLM`` of ``family`` with seeded random weights (``SEEDS[family]`` default).

    transformers initialises every weight from torch's global generator, so the seed fixes them.
    """
    from transformers import AutoModelForCausalLM

    cfg = family_config(family)
    torch.manual_seed(SEEDS[family] if seed is None else seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if family == "deepseek_v3":
        # HF leaves the noaux_tc correction bias at zero; a seeded non-zero bias makes the
        # biased group/top-k selection differ from the unbiased weights, as in a real checkpoint
        gen = torch.Generator().manual_seed(SEEDS[family])
        for layer in model.model.layers[cfg.first_k_dense_replace:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(0.05 * torch.randn(bias.shape, generator=gen))
    model.eval()
    return model


def demo_tokenizer_dir() -> Path | None:
    """``traces/models/target`` when it holds the demo tokenizer, else None."""
    from specdiff.tui.demo import REPO_MODELS

    d = REPO_MODELS / "target"
    return d if (d / "tokenizer.json").is_file() else None


def write_tokenizer(out_dir: str | Path) -> None:
    """Put the demo tokenizer (vocab 4096, BOS/EOS/PAD = 0/1/2) into ``out_dir``.

    Copied from ``traces/models/target``; trained from the stdlib with
    :func:`tiny_models.build_tokenizer` (deterministic) when the demo models are not built.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = demo_tokenizer_dir()
    if src is None:
        from specdiff.demo_models.tiny_models import build_tokenizer, split_files, stdlib_files

        build_tokenizer(split_files(stdlib_files())[0], out_dir)
        return
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out_dir / name)


def save_family_target(model, family: str, out_dir: str | Path) -> Path:
    """Save ``model`` as ``family``'s target in ``out_dir``: bf16 safetensors, config.json (with
    the extra keys SGLang reads for that family), the demo tokenizer. Returns ``out_dir``."""
    from specdiff.demo_models.tiny_models import save_target

    out_dir = Path(out_dir)
    save_target(model, out_dir)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if family == "deepseek_v3":
        cfg.update(_DEEPSEEK_EXTRA)
    cfg["architectures"] = [ARCHITECTURES[family]]
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    write_tokenizer(out_dir)
    return out_dir


def build_family_target(family: str, out_dir: str | Path, *, trained: bool = True, log=print) -> Path:
    """Build ``family``'s tiny target into ``out_dir`` (created; existing files overwritten).

    Args:
        family: one of ``FAMILIES``.
        out_dir: the HF model folder to write.
        trained: train as a language model on the stdlib text (:func:`train_family_target`);
            False keeps the seeded random weights.
        log: progress lines (training only).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: unknown ``family``.
    """
    _check_family(family)
    if trained:
        model, _ = train_family_target(family, log=log)
    else:
        model = init_family_model(family)
    return save_family_target(model, family, out_dir)


def train_family_target(family: str, *, log=print):
    """Train ``family``'s target briefly as a language model on the stdlib text.

    Returns ``(model, stats)`` (fp32 model). Raises ValueError for an unknown family.
    """
    raise NotImplementedError("trained family targets: in progress (issue 20); use trained=False")
