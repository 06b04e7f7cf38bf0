"""Throwaway tiny models for bringing up real SGLang on a CPU (tests and benchmarks, no network).

``build_bringup_models(root)`` writes, under ``root``:
- ``target/``: a random Llama (8 layers, hidden 256, 4 heads, MLP 512) with a byte-level BPE
  tokenizer (vocab 4096) trained offline on Python standard-library sources, saved with
  transformers in bfloat16;
- ``draft/``: a random EAGLE-3 draft in SpecForge/SGLang format: config architectures
  ``["LlamaForCausalLMEagle3"]``, ``eagle_config.eagle_aux_hidden_state_layer_ids``, weights
  ``fc.weight [H, 3H]``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight [Vd, H]``,
  ``d2t`` int64 offsets [Vd] and ``t2d`` bool [V] (no embedding: SGLang shares the target's).

The weights are random: greedy output is still deterministic, and the draft is usually
wrong, so accept lengths sit near 1. ``build_oracle_models(root)`` writes a degenerate pair
whose draft is always right (both final norms are zero, so every logit is 0 and greedy
argmax is id 0 on both sides; the draft's d2t maps draft id 0 to target id 0): a chain then
accepts every drafted token (accept length = steps + 1). These models only prove the serving path works; the
trained demo models are built by ``specdiff.demo_models.tiny_models``. Not product code: only tests
(``tests/conftest.py``) and benchmarks import it. ``python -m specdiff.demo_models.bringup DIR`` builds both pairs.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import torch

TARGET_LAYERS = 8
HIDDEN = 256
HEADS = 4
MLP = 512
VOCAB = 4096
DRAFT_VOCAB = 1024
AUX_LAYER_IDS = [1, 3, 4]  # SGLang config ids -> capture HF hidden_states [2, 4, 5]


def _stdlib_texts(max_files: int = 150, max_chars: int = 3_000_000) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py"))[:max_files]:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total > max_chars:
            break
    return texts


def build_tokenizer(out_dir: Path, vocab_size: int = VOCAB):
    """Train a byte-level BPE tokenizer on stdlib sources and save it with transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(out_dir))
    return fast


def build_target(out_dir: Path, seed: int = 0, constant_output: bool = False) -> None:
    """Random tiny Llama target + tokenizer in ``out_dir`` (bf16 safetensors).

    ``constant_output``: zero the final norm, so all logits are 0 and greedy picks id 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.05)
        if constant_output:
            model.model.norm.weight.zero_()
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build_draft(
    out_dir: Path, seed: int = 1, aux_layer_ids: list[int] | None = None, constant_output: bool = False,
    **norms: bool,
) -> None:
    """Random EAGLE-3 draft (SpecForge/SGLang checkpoint layout) in ``out_dir``; config.json is
    written by ``Eagle3DraftConfig.write``.

    ``constant_output``: zero the final norm (all draft logits 0, argmax draft id 0) and map
    draft id 0 to target id 0, so the draft always proposes target id 0.
    ``norms``: norm flags to turn on (``specdiff.eagle3.norms``), e.g. ``fc_norm=True``; the
    norms they add get random weights around 1."""
    from safetensors.torch import save_file

    from specdiff.eagle3.norms import NORMS_OFF
    from specdiff.replay.model.draft_config import Eagle3DraftConfig

    unknown = set(norms) - set(NORMS_OFF)
    if unknown:
        raise ValueError(f"unknown norm flags {sorted(unknown)}")

    out_dir.mkdir(parents=True, exist_ok=True)
    ids = list(AUX_LAYER_IDS if aux_layer_ids is None else aux_layer_ids)
    h, inter, vd, v = HIDDEN, MLP, DRAFT_VOCAB, VOCAB
    hd = h // HEADS
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    # draft vocab = target ids 0..Vd-1 shifted by 3 (skip specials): d2t holds offsets
    draft_to_target = torch.arange(vd, dtype=torch.int64) + 3
    if constant_output:
        draft_to_target[0] = 0
    d2t = draft_to_target - torch.arange(vd, dtype=torch.int64)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_to_target] = True
    tensors = {
        "fc.weight": w(h, 3 * h),
        "midlayer.self_attn.q_proj.weight": w(HEADS * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": w(HEADS * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(HEADS * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": w(h, HEADS * hd),
        "midlayer.mlp.gate_proj.weight": w(inter, h),
        "midlayer.mlp.up_proj.weight": w(inter, h),
        "midlayer.mlp.down_proj.weight": w(h, inter),
        "midlayer.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "norm.weight": (torch.zeros if constant_output else torch.ones)(h, dtype=torch.bfloat16),
        "lm_head.weight": w(vd, h),
        "d2t": d2t,
        "t2d": t2d,
    }
    for name, width in (("norm_before_fc", 3 * h), ("fc_norm", h)):
        if norms.get(name):  # random norm weights: a norm that is skipped or swapped shows in fc_in
            for key in (["input_norm.weight"] if name == "norm_before_fc" else [f"fc_norm.{j}.weight" for j in range(3)]):
                tensors[key] = (1.0 + torch.randn(width, generator=g) * 0.3).to(torch.bfloat16)
    save_file(tensors, str(out_dir / "model.safetensors"))
    config = Eagle3DraftConfig(
        hidden_size=h, intermediate_size=inter, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=hd,
        vocab_size=v, draft_vocab_size=vd, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, num_aux=3,
        target_hidden_size=h, **{**NORMS_OFF, **norms}, max_position_embeddings=2048)
    config.write(out_dir, "specforge", aux_ids=ids, torch_dtype="bfloat16")


def _build_pair(root: str | os.PathLike, *, prefix: str, marker: str, force: bool,
                constant_output: bool) -> tuple[Path, Path]:
    """Build (or reuse, when ``root/marker`` exists) a target and draft under ``root``."""
    root = Path(root)
    target, draft = root / f"{prefix}target", root / f"{prefix}draft"
    if (root / marker).exists() and not force:
        return target, draft
    build_target(target, constant_output=constant_output)
    build_draft(draft, constant_output=constant_output)
    (root / marker).write_text("ok\n")
    return target, draft


def build_bringup_models(root: str | os.PathLike, force: bool = False) -> tuple[Path, Path]:
    """Build (or reuse) the throwaway target and draft under ``root``; return their paths."""
    return _build_pair(root, prefix="", marker="READY", force=force, constant_output=False)


def build_oracle_models(root: str | os.PathLike, force: bool = False) -> tuple[Path, Path]:
    """Build (or reuse) the always-accepted pair under ``root``/oracle-{target,draft}."""
    return _build_pair(root, prefix="oracle-", marker="ORACLE_READY", force=force, constant_output=True)


if __name__ == "__main__":
    import sys

    where = sys.argv[1] if len(sys.argv) > 1 else "/tmp/specdiff-bringup"
    print(*build_bringup_models(where, force=True), *build_oracle_models(where, force=True))
