"""Build the tiny demo model pair offline, deterministically, with one command.

    python -m specdiff.demo_models.tiny_models --out traces/models

builds into ``OUT``:

- ``target/``: a byte-level BPE tokenizer (vocab 4096, trained on the Python stdlib sources)
  and a tiny Llama target (8 layers, hidden 256, 4 heads, MLP 512) trained as a language model
  on the same text for a fixed number of steps; saved in bfloat16 as safetensors so SGLang
  serves it.
- ``data/sequences.safetensors``: self-distilled sequences, each a short stdlib prompt (with
  BOS) followed by the target's greedy continuation generated in bfloat16 (as SGLang serves
  it). Flat int32 ``tokens``, int64 ``offsets`` [N+1], int32 ``prompt_lens`` [N], int8
  ``split`` [N] (0 = train, 1 = held out). No pickle.
- ``draft/``: an EAGLE-3 draft in SpecForge/SGLang format, trained by
  :mod:`specdiff.demo_models.train_draft` on the train split.

Every step is skipped when its output already exists (delete a folder, or pass ``--force``, to
rebuild it). Seeds are fixed; the target trains for a fixed number of steps (not a time budget)
so a rebuild on the same machine gives the same weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from specdiff.demo.data import DATA_FILE
from specdiff.demo_models import train_draft
from specdiff.demo_models.recipe import (
    BOS,
    CONTINUATION_LEN_RANGE,
    EOS,
    N_HELDOUT_SEQS,
    N_TRAIN_SEQS,
    NUM_THREADS,
    PAD,
    PROMPT_LEN_RANGE,
    SEED,
    SPECIAL_TOKENS,
    TARGET_BATCH,
    TARGET_DIMS,
    TARGET_LR,
    TARGET_SEQ_LEN,
    TARGET_STEPS,
    VAL_EVERY_NTH_FILE,
    VOCAB_SIZE,
)
from specdiff.replay.model.target_capture import greedy_generate


# ---- corpus ---------------------------------------------------------------------------------
def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """Sorted list of the top-level ``*.py`` files of a Python standard library folder.

    Args:
        root: the stdlib folder; defaults to the running interpreter's (``sysconfig`` "stdlib").
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no *.py files under {root}")
    return files


def read_texts(files: list[Path]) -> list[str]:
    """Read each file as UTF-8 (undecodable bytes replaced), in the given order."""
    return [p.read_bytes().decode("utf-8", errors="replace") for p in files]


def split_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """Deterministic train/validation split of a sorted file list (every 20th file is val)."""
    train = [f for i, f in enumerate(files) if i % VAL_EVERY_NTH_FILE != 0]
    val = [f for i, f in enumerate(files) if i % VAL_EVERY_NTH_FILE == 0]
    return train, val


def _files_digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# ---- tokenizer ------------------------------------------------------------------------------
def build_tokenizer(files: list[Path], out_dir: str | Path):
    """Train a byte-level BPE tokenizer (vocab 4096) on ``files`` and save it as a HF tokenizer.

    The tokenizer prepends ``<|bos|>`` to every encoded text (a template post-processor), so
    SGLang and ``AutoTokenizer`` add BOS the same way. Writes ``tokenizer.json`` and
    ``tokenizer_config.json`` (plus ``special_tokens_map.json``) into ``out_dir``.

    Returns:
        the transformers fast tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(read_texts(files), trainer=trainer, length=len(files))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        model_max_length=TARGET_DIMS["max_position_embeddings"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    _portable_tokenizer_config(out_dir)
    return fast


def _portable_tokenizer_config(out_dir: Path) -> None:
    """Name the generic fast-tokenizer class so transformers 4.x and 5.x both load it."""
    p = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    cfg["add_bos_token"] = True   # informative: the post-processor adds BOS
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_tokenizer(path: str | Path):
    """Load the saved tokenizer with ``AutoTokenizer`` (offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def encode_files(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Encode each text as one document: ``[BOS] tokens [EOS]`` (int32)."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    docs = []
    for t in texts:
        ids = tokenizer(t, add_special_tokens=True)["input_ids"]
        docs.append(np.asarray(ids + [eos], dtype=np.int32))
    return docs


# ---- target ---------------------------------------------------------------------------------
def target_config():
    """The tiny Llama target's ``LlamaConfig`` (ids of BOS/EOS/PAD = 0/1/2)."""
    from transformers import LlamaConfig

    return LlamaConfig(**TARGET_DIMS, bos_token_id=0, eos_token_id=1, pad_token_id=2)


@torch.no_grad()
def eval_loss(model, stream: np.ndarray, seq_len: int = TARGET_SEQ_LEN, max_windows: int = 32,
              batch: int = 16) -> float:
    """Mean next-token cross entropy of ``model`` over consecutive windows of ``stream``."""
    model.eval()
    n = min((len(stream) - 1) // seq_len, max_windows)
    x = torch.from_numpy(stream[: n * seq_len].astype(np.int64)).view(n, seq_len)
    losses = []
    for i in range(0, n, batch):
        xb = x[i:i + batch]
        losses.append(model(input_ids=xb, labels=xb).loss.float().item() * len(xb))
    return float(sum(losses) / n)


def train_target(train_stream: np.ndarray, val_stream: np.ndarray, *, steps: int = TARGET_STEPS,
                 seed: int = SEED, model=None, batch: int = TARGET_BATCH, seq_len: int = TARGET_SEQ_LEN,
                 lr: float = TARGET_LR, log_every: int = 40, log=print):
    """Train a causal LM (the tiny Llama target by default) on a token stream (fp32, AdamW).

    Batches are ``batch`` random ``seq_len`` windows of the int token stream, drawn with a
    generator seeded by ``seed``; the learning rate warms up for 10 steps and decays by cosine to
    10 % of ``lr``.

    Args:
        model: a fp32 ``*ForCausalLM`` to train in place (any family); None builds the demo's
            Llama from :func:`target_config` after ``torch.manual_seed(seed)``.

    Returns:
        ``(model, stats)`` with the fp32 model and a dict of losses and timings.
    """
    if model is None:
        from transformers import LlamaForCausalLM

        torch.manual_seed(seed)
        model = LlamaForCausalLM(target_config())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    data = torch.from_numpy(train_stream.astype(np.int64))
    max_start = len(data) - seq_len - 1
    warmup = 10

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        p = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    t0 = time.time()
    loss_val = float("nan")
    for step in range(steps):
        starts = torch.randint(0, max_start, (batch,), generator=gen)
        xb = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=xb, labels=xb).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = loss.item()
        if step % log_every == 0 or step == steps - 1:
            log(f"target step {step:4d}/{steps} loss {loss_val:.3f} ({time.time() - t0:.0f}s)")
    train_s = time.time() - t0
    val = eval_loss(model, val_stream, seq_len)
    model.train(False)
    log(f"target trained in {train_s:.0f}s; last train loss {loss_val:.3f}, val loss {val:.3f}")
    return model, {"train_seconds": round(train_s, 1), "final_train_loss": round(loss_val, 4),
                   "val_loss": round(val, 4), "steps": steps}


def save_target(model, out_dir: str | Path) -> None:
    """Save the target in bfloat16 safetensors with ``torch_dtype``/``dtype`` "bfloat16"."""
    out_dir = Path(out_dir)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(out_dir), safe_serialization=True)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"   # older readers (and SGLang's checks) look at this key
    cfg["dtype"] = "bfloat16"
    cfg.setdefault("rope_theta", TARGET_DIMS["rope_theta"])  # readers that predate rope_parameters
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_target(path: str | Path, dtype: torch.dtype = torch.bfloat16):
    """Load the saved target with transformers (eval mode, eager-free sdpa attention)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    model.eval()
    return model


# ---- self-distilled data --------------------------------------------------------------------
def build_data(model, docs: list[np.ndarray], out_path: str | Path, *, seed: int = SEED,
               n_train: int = N_TRAIN_SEQS, n_heldout: int = N_HELDOUT_SEQS,
               prompt_len_range: tuple[int, int] = PROMPT_LEN_RANGE,
               continuation_len_range: tuple[int, int] = CONTINUATION_LEN_RANGE, log=print) -> dict:
    """Make self-distilled sequences: ``[BOS] + stdlib window`` + the target's greedy tokens.

    Prompts are random windows of random length in ``prompt_len_range`` (inclusive) from the
    documents; generation runs in the model's dtype (bfloat16, as served), batched by prompt
    length so no padding is involved; each sequence keeps a random ``continuation_len_range``
    number of generated tokens. The last ``n_heldout`` sequences are the held-out split. Works
    for any ``*ForCausalLM`` that ``model.generate`` drives.

    Returns:
        stats dict (counts, timing).
    """
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    n = n_train + n_heldout
    bos = 0
    lens = np.array([len(d) for d in docs])
    prompts, cont_lens = [], []
    for _ in range(n):
        plen = int(rng.integers(prompt_len_range[0], prompt_len_range[1] + 1))
        di = int(rng.choice(len(docs), p=lens / lens.sum()))
        # skip the doc's own BOS; keep off its trailing EOS
        s = int(rng.integers(1, max(2, len(docs[di]) - plen - 1)))
        prompts.append(np.concatenate([[bos], docs[di][s:s + plen]]).astype(np.int64))
        cont_lens.append(int(rng.integers(continuation_len_range[0], continuation_len_range[1] + 1)))
    max_new = continuation_len_range[1]
    conts: list[np.ndarray | None] = [None] * n
    t0 = time.time()
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for k, plen in enumerate(sorted(by_len)):
        idx = by_len[plen]
        for j in range(0, len(idx), 64):
            chunk = idx[j:j + 64]
            x = torch.from_numpy(np.stack([prompts[i] for i in chunk]))
            g = greedy_generate(model, x, max_new).numpy()
            for r, i in enumerate(chunk):
                conts[i] = g[r, : cont_lens[i]]
        if k % 8 == 0:
            log(f"data: prompt length {plen} done ({time.time() - t0:.0f}s)")
    seqs = [np.concatenate([p, c]).astype(np.int32) for p, c in zip(prompts, conts)]
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    split = np.zeros(n, dtype=np.int8)
    split[n_train:] = 1
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_file({
        "tokens": np.concatenate(seqs),
        "offsets": offsets,
        "prompt_lens": np.array([len(p) for p in prompts], dtype=np.int32),
        "split": split,
    }, str(out_path), metadata={
        "format": "specdiff-tiny-sequences/1",
        "description": "BOS + stdlib prompt + target greedy continuation (bf16)",
        "generation_dtype": "bfloat16",
    })
    gen_s = time.time() - t0
    log(f"data: {n} sequences ({offsets[-1]} tokens) in {gen_s:.0f}s -> {out_path}")
    return {"sequences": n, "train": n_train, "heldout": n_heldout,
            "tokens": int(offsets[-1]), "generate_seconds": round(gen_s, 1)}


# ---- driver ---------------------------------------------------------------------------------
def _write_manifest(path: Path, manifest: dict) -> None:
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _exists(path: Path, *names: str) -> bool:
    return all((path / n).exists() for n in names)


def build_all(out: str | Path, *, stdlib: str | Path | None = None, force: bool = False,
              target_steps: int = TARGET_STEPS, draft_steps: int | None = None,
              log=print) -> dict:
    """Build tokenizer + target, data and draft into ``out`` (``target/``, ``data/``, ``draft/``).

    Steps whose outputs exist are skipped unless ``force``. Writes ``out/manifest.json`` with
    the recipe, timings and metrics of the steps that ran (merged with earlier runs).

    Returns:
        the manifest dict.
    """
    torch.set_num_threads(NUM_THREADS)  # float reductions depend on the thread count
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tdir, ddir, rdir = out / "target", out / "data", out / "draft"
    man_path = out / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {}
    files = stdlib_files(stdlib)
    train_files, val_files = split_files(files)

    if force or not _exists(tdir, "tokenizer.json", "tokenizer_config.json"):
        t0 = time.time()
        build_tokenizer(train_files, tdir)
        manifest["tokenizer"] = {
            "vocab_size": VOCAB_SIZE, "special_tokens": SPECIAL_TOKENS,
            "stdlib_files": len(files), "train_files": len(train_files),
            "stdlib_digest": _files_digest(files), "seconds": round(time.time() - t0, 1)}
        _write_manifest(man_path, manifest)
        log(f"tokenizer trained on {len(train_files)} files in {time.time() - t0:.1f}s")
    tok = load_tokenizer(tdir)

    need_target = force or not _exists(tdir, "config.json", "model.safetensors")
    need_data = force or need_target or not _exists(ddir, DATA_FILE)
    if need_target or need_data:
        train_docs = encode_files(tok, read_texts(train_files))
    if need_target:
        val_docs = encode_files(tok, read_texts(val_files))
        model, stats = train_target(np.concatenate(train_docs), np.concatenate(val_docs),
                                    steps=target_steps, log=log)
        save_target(model, tdir)
        manifest["target"] = {**stats, "dims": TARGET_DIMS, "batch": TARGET_BATCH,
                              "seq_len": TARGET_SEQ_LEN, "lr": TARGET_LR, "seed": SEED}
        _write_manifest(man_path, manifest)
    if need_data:
        model = load_target(tdir, torch.bfloat16)
        # one thread: single-token decode steps are too small to share, and two threads on a
        # busy machine wait on each other (measured 15x slower)
        torch.set_num_threads(1)
        manifest["data"] = build_data(model, train_docs, ddir / DATA_FILE, log=log)
        torch.set_num_threads(NUM_THREADS)
        _write_manifest(man_path, manifest)

    if force or need_data or not _exists(rdir, "config.json", "model.safetensors"):
        kw = {} if draft_steps is None else {"steps": draft_steps}
        manifest["draft"] = train_draft.build_draft(tdir, ddir, rdir, log=log, **kw)
    _write_manifest(man_path, manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m specdiff.demo_models.tiny_models --out DIR [--force] [--stdlib PATH]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (target/, data/, draft/)")
    ap.add_argument("--stdlib", default=None, help="Python stdlib folder (default: this interpreter's)")
    ap.add_argument("--force", action="store_true", help="rebuild every step")
    ap.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    ap.add_argument("--draft-steps", type=int, default=None)
    args = ap.parse_args(argv)
    build_all(args.out, stdlib=args.stdlib, force=args.force, target_steps=args.target_steps,
              draft_steps=args.draft_steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
