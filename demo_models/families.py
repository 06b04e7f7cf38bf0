"""Tiny targets of every family EAGLE-3 is served on, built offline and deterministically.

API: ``build_family_target(family, out_dir, *, trained=True) -> Path`` and
``build_family_pair(family, out_dir) -> manifest`` (target/, data/, draft/); the first writes a HF model folder
(config.json with ``architectures``, bf16 ``model.safetensors``, the demo tokenizer) for each
name in ``FAMILIES``; ``family_config(family)`` is the transformers config it uses.

Every target has 8 decoder layers, hidden 256 and the demo's byte-level BPE vocabulary of 4096
(the tokenizer is copied from ``traces/models/target``, or built by
:func:`specdiff.demo_models.tiny_models.build_tokenizer` when that folder is absent). Expert and
MLP sizes are small so a CPU trains each in a few minutes. What each family exercises:

- ``llama``: ``LlamaForCausalLM``, the demo target's dimensions (``recipe.TARGET_DIMS``).
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
``build_family_pair(family, out_dir)`` also writes self-distilled data and an EAGLE-3 draft
trained on HF [0, 3, 6], saved with the SGLang ids that capture them on that family
(:func:`sglang_serve_ids`, from the rules of ``eagle3.aux_layers``); ``python -m specdiff.demo_models.families
--out DIR`` builds every family's pair.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specdiff.demo.scenarios import DEMO_FAMILIES as ARCHITECTURES  # the demo's one list
from specdiff.demo_models.recipe import TARGET_DIMS, VOCAB_SIZE

FAMILIES = tuple(ARCHITECTURES)

NUM_LAYERS = TARGET_DIMS["num_hidden_layers"]   # 8
HIDDEN = TARGET_DIMS["hidden_size"]             # 256
MAX_POSITIONS = TARGET_DIMS["max_position_embeddings"]
ROPE_THETA = TARGET_DIMS["rope_theta"]
SLIDING_WINDOW = 32
SEEDS = {f: 1234 + i for i, f in enumerate(FAMILIES)}  # one fixed seed per family

# the demo tokenizer's ids (recipe.SPECIAL_TOKENS)
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
        gen = torch.Generator().manual_seed(SEEDS[family] if seed is None else seed)
        for layer in model.model.layers[cfg.first_k_dense_replace:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(0.05 * torch.randn(bias.shape, generator=gen))
    model.eval()
    return model


def demo_tokenizer_dir() -> Path | None:
    """``traces/models/target`` when it holds the demo tokenizer, else None."""
    from specdiff.demo.run import REPO_MODELS

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


def build_family_target(family: str, out_dir: str | Path, *, trained: bool = True, log=print,
                        seed: int | None = None) -> Path:
    """Build ``family``'s tiny target into ``out_dir`` (created; existing files overwritten).

    Args:
        family: one of ``FAMILIES``.
        out_dir: the HF model folder to write.
        trained: train as a language model on the stdlib text (:func:`train_family_target`);
            False keeps the seeded random weights.
        log: progress lines (training only).
        seed: the random initialisation's seed (``SEEDS[family]`` when None); untrained targets only.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: unknown ``family``.
    """
    _check_family(family)
    if trained:
        model, _ = train_family_target(family, log=log)
    else:
        model = init_family_model(family, seed)
    return save_family_target(model, family, out_dir)


# ---- the trained recipe (fixed step counts, not time budgets) -------------------------------------
TEXT_FILES = 20             # the first 20 training files of the stdlib split: ~170K tokens
VAL_FILES = 4
LM_STEPS = 60
#: families that need more LM steps before their greedy continuations stop looping: the 60-step
#: Qwen3 target continued every held-out prompt with one repeated token (2 ids over 16 prompts; its
#: draft was 100 % right), at 200 steps 12 ids over 8 prompts (measured, lr 3e-3; lr 1e-3 learned no
#: faster). ~1 s a step on 2 idle cores. DeepSeek-V3 at 60 steps: 18 ids, median 8 per prompt.
#: Qwen3-MoE at 60 steps looped the same way (3 ids over 16 prompts, 1-2 per continuation, val
#: loss 7.05; its draft 99 % right), so it gets Qwen3's 200.
LM_STEPS_BY_FAMILY = {"qwen3": 200, "qwen3_moe": 200}
LM_BATCH = 8
LM_SEQ_LEN = 64
LM_LR = 3e-3
DATA_TRAIN_SEQS = 128
DATA_HELDOUT_SEQS = 16
DATA_PROMPT_LENS = (16, 23)         # 8 prompt lengths: generation runs in 8 unpadded groups
DATA_CONTINUATION_LENS = (32, 40)
DRAFT_STEPS = 80
DRAFT_BATCH = 16
NUM_THREADS = 2             # float reductions depend on the thread count: fixed for determinism


def _texts():
    from specdiff.demo_models.tiny_models import read_texts, split_files, stdlib_files

    train, val = split_files(stdlib_files())
    return read_texts(train[:TEXT_FILES]), read_texts(val[:VAL_FILES])


class _reproducible:
    """Run a block on ``n`` torch threads with deterministic algorithms, then restore both.

    Without ``torch.use_deterministic_algorithms`` two 2-thread trainings of the GPT-OSS target
    differ in the last bits after 2 steps (measured, torch 2.14 CPU; the expert scatter in the
    backward pass); with it they are bitwise equal."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
        torch.set_num_threads(self.n)
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved[0])
        torch.use_deterministic_algorithms(self.saved[1])


def lm_steps(family: str) -> int:
    """The LM training steps of ``family``'s target: ``LM_STEPS_BY_FAMILY`` or ``LM_STEPS``."""
    return LM_STEPS_BY_FAMILY.get(family, LM_STEPS)


def train_family_target(family: str, *, log=print):
    """Train ``family``'s target briefly as a language model on the stdlib text.

    :func:`init_family_model`, then :func:`tiny_models.train_target` for :func:`lm_steps` steps of
    ``LM_BATCH`` x ``LM_SEQ_LEN`` windows of the first ``TEXT_FILES`` training files (encoded
    with the demo tokenizer), on ``NUM_THREADS`` threads.

    Returns:
        ``(model, stats)``: the fp32 model and its training stats (losses, seconds).

    Raises:
        ValueError: unknown ``family``.
    """
    import tempfile

    import numpy as np

    from specdiff.demo_models.tiny_models import encode_files, load_tokenizer, train_target

    model = init_family_model(family)
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(tmp)
        tok = load_tokenizer(tmp)
    train_texts, val_texts = _texts()
    train_stream = np.concatenate(encode_files(tok, train_texts))
    val_stream = np.concatenate(encode_files(tok, val_texts))
    with _reproducible(NUM_THREADS):
        model, stats = train_target(train_stream, val_stream, steps=lm_steps(family), seed=SEEDS[family], model=model,
                                    batch=LM_BATCH, seq_len=LM_SEQ_LEN, lr=LM_LR, log_every=25,
                                    log=lambda m: log(f"[{family}] {m}"))
    return model, {**stats, "train_tokens": len(train_stream)}


# ---- SGLang aux ids per family: the rules are eagle3/aux_layers.py's ------------------------------
def sglang_rule(family: str):
    """SGLang 0.5.23's aux-id rule for ``family``'s target (``eagle3.families.sglang_family_rule``
    of its architecture: how ``set_eagle3_layers_to_capture`` reads the draft's ids, with sources).

    Raises:
        ValueError: unknown ``family``.
    """
    from specdiff.eagle3.families import sglang_family_rule

    _check_family(family)
    return sglang_family_rule(ARCHITECTURES[family])


def sglang_serve_ids(family: str, hf_indices) -> list[int]:
    """The SGLang 0.5.23 ``eagle_aux_hidden_state_layer_ids`` that capture HF ``hf_indices`` on
    ``family``'s 8-layer target (``eagle3.aux_layers.native_aux_ids`` with its architecture),
    checked by the forward direction (``engine_capture``): every index arrives, none is dropped.

    Raises:
        ValueError: unknown ``family``.
        ConventionError: the rule has no ids for these indices (e.g. HF 8 on DeepSeek-V3).
        RuntimeError: the ids found do not capture ``hf_indices`` (the two directions disagree).
    """
    from specdiff.eagle3.aux_layers import engine_capture, native_aux_ids

    _check_family(family)
    arch, hf = ARCHITECTURES[family], [int(h) for h in hf_indices]
    ids = native_aux_ids(hf, "sglang", num_layers=NUM_LAYERS, architecture=arch)
    plan = engine_capture("sglang", ids, num_layers=NUM_LAYERS, architecture=arch)
    if list(plan.hf_indices) != sorted(hf) or plan.dropped or plan.prenorm:
        raise RuntimeError(f"{family}: SGLang ids {ids} capture HF {list(plan.hf_indices)} (dropped {list(plan.dropped)}), "
                           f"not HF {hf}")
    return ids


# ---- a target with its draft ------------------------------------------------------------------
def build_family_pair(family: str, out_dir: str | Path, *, log=print) -> dict:
    """Build ``family``'s trained target, self-distilled data and EAGLE-3 draft into ``out_dir``.

    Writes ``target/`` (:func:`build_family_target`), ``data/`` (:func:`tiny_models.build_data`:
    ``DATA_TRAIN_SEQS`` + ``DATA_HELDOUT_SEQS`` greedy continuations in bf16), ``draft/``
    (:func:`train_draft.build_draft`: trained on HF ``demo.scenarios.TRAINED_HF`` = [0, 3, 6] for
    ``DRAFT_STEPS`` steps, saved with the SGLang ids that capture those indices on this family,
    :func:`sglang_serve_ids`) and ``manifest.json`` (recipe, timings, per-depth training accuracy).

    Returns:
        the manifest dict (``draft.train_acc_last_epoch[k]``: training accuracy at TTT step k).

    Raises:
        ValueError: unknown ``family``.
    """
    import time

    from specdiff.demo.data import DATA_FILE
    from specdiff.demo.scenarios import TRAINED_HF
    from specdiff.demo_models import train_draft
    from specdiff.demo_models.tiny_models import build_data, encode_files, load_tokenizer

    _check_family(family)
    out = Path(out_dir)
    tdir, ddir, rdir = out / "target", out / "data", out / "draft"
    t0 = time.time()
    model, lm_stats = train_family_target(family, log=log)
    save_family_target(model, family, tdir)
    del model
    log(f"[{family}] target saved ({time.time() - t0:.0f}s)")
    from specdiff.replay.model.target_capture import load_target

    target = load_target(tdir, dtype=torch.bfloat16)  # generate in the served dtype
    docs = encode_files(load_tokenizer(tdir), _texts()[0])
    with _reproducible(1):  # single-token decode steps are too small to share between threads
        data_stats = build_data(target, docs, ddir / DATA_FILE, seed=SEEDS[family], n_train=DATA_TRAIN_SEQS,
                                n_heldout=DATA_HELDOUT_SEQS, prompt_len_range=DATA_PROMPT_LENS,
                                continuation_len_range=DATA_CONTINUATION_LENS,
                                log=lambda m: log(f"[{family}] {m}"))
    del target
    hf = [int(h) for h in TRAINED_HF]
    serve_ids = sglang_serve_ids(family, hf)
    with _reproducible(NUM_THREADS):
        draft_stats = train_draft.build_draft(tdir, ddir, rdir, steps=DRAFT_STEPS, batch=DRAFT_BATCH,
                                              train_hf_indices=hf, serve_ids=serve_ids,
                                              heldout_layers={"train_layers": hf},
                                              log=lambda m: log(f"[{family}] {m}"))
    manifest = {"family": family, "architecture": ARCHITECTURES[family], "seed": SEEDS[family],
                "target": {**lm_stats, "batch": LM_BATCH, "seq_len": LM_SEQ_LEN, "lr": LM_LR,
                           "text_files": TEXT_FILES},
                "data": data_stats, "draft": {**draft_stats, "sglang_rule": sglang_rule(family).sources[0]},
                "total_seconds": round(time.time() - t0, 1)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    log(f"[{family}] pair built in {manifest['total_seconds']:.0f}s; draft train acc per TTT step "
        f"{draft_stats['train_acc_last_epoch']}, held-out accept length "
        f"{draft_stats['heldout']['train_layers']['accept_length']}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m specdiff.demo_models.families --out DIR [FAMILY ...]`` builds trained pairs
    into ``DIR/FAMILY/{target,data,draft}``; ``--pair-dir DIR FAMILY`` builds one family's pair
    into ``DIR/{target,data,draft}`` (``specdiff demo --family``)."""
    import argparse

    ap = argparse.ArgumentParser(description="Build tiny trained target + EAGLE-3 draft pairs per family")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="a folder per family under it")
    where.add_argument("--pair-dir", help="one family's pair, directly in this folder")
    ap.add_argument("families", nargs="*", default=list(FAMILIES), help=f"default: all of {FAMILIES}")
    args = ap.parse_args(argv)
    if args.pair_dir is not None:
        if len(args.families) != 1:
            ap.error("--pair-dir builds exactly one family: name it")
        build_family_pair(args.families[0], Path(args.pair_dir))
        return 0
    for f in args.families:
        build_family_pair(f, Path(args.out) / f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
