"""Train the tiny EAGLE-3 demo draft: a small, readable EAGLE-3 training loop.

This is the draft half of the demo model pair (:mod:`specdiff.demo_models.tiny_models` builds the
tokenizer, the target and the self-distilled data). It is written the way a user's own
training loop looks, so it doubles as the example that specdiff's training-side recorder hooks
attach to:

1. run the frozen target (bfloat16, the serving dtype) over each token sequence and keep the
   aux hidden states at HF ``hidden_states`` indices ``TRAIN_HF_INDICES`` = [0, 3, 6] (the
   embedding output, the output of decoder layer 2 and of layer 5) and the target's argmax;
2. pick the draft vocabulary: the ``DRAFT_VOCAB`` most frequent target-argmax ids
   (``d2t`` int64 offsets, target = draft + d2t[draft]; ``t2d`` bool [V]);
3. build the draft (:class:`specdiff.replay.model.draft_model.Eagle3Draft`): embedding shared with the
   target and frozen, ``lm_head`` initialised from the target's rows of the draft vocab;
4. train with the teacher-forced TTT forward, ``TTT_STEPS`` depths, loss = sum over depth k of
   0.8^k x cross entropy against the target's argmax mapped into the draft vocab (SpecForge
   style), Adam;
5. save in SpecForge/SGLang format with the SGLang ids that capture the training layers:
   ``eagle_config.eagle_aux_hidden_state_layer_ids`` = [-1, 2, 5] (SGLang id k captures HF
   index k+1; id -1 is the embedding output).

The demo's seed bug serves this draft with ids [2, 5, 6], which SGLang resolves to HF [3, 6, 7]
(layers a, b, c instead of embedding, a, b): :func:`evaluate` measures what that costs offline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from specdiff.demo.data import load_prompt_lens, load_sequences
from specdiff.demo.scenarios import CORRECT_SGLANG_IDS, SEED_WRONG_IDS, TRAINED_HF
from specdiff.demo_models.recipe import TARGET_DIMS
from specdiff.eagle3.attention_window import KV
from specdiff.eagle3.aux_layers import default_hf_indices, resolve_aux_ids
from specdiff.eagle3.norms import NORMS_OFF
from specdiff.replay.model.checkpoint import save_draft
from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig, ttt_labels
from specdiff.replay.model.target_capture import capture_target, load_target, target_embedding, target_lm_head

# ---- recipe ---------------------------------------------------------------------------------
# The layers are defined once, in the demo's scenarios; the rest follows from the SGLang rule.
TRAIN_HF_INDICES = tuple(TRAINED_HF)  # what training feeds: [embedding, layer a, layer b]
SERVE_IDS = CORRECT_SGLANG_IDS        # SGLang ids that capture exactly TRAIN_HF_INDICES
TARGET_LAYERS = TARGET_DIMS["num_hidden_layers"]  # the demo target's L
SEED_WRONG_HF_INDICES = resolve_aux_ids(SEED_WRONG_IDS, convention="sglang", num_layers=TARGET_LAYERS).hf_indices
SGLANG_DEFAULT_HF_INDICES = default_hf_indices(TARGET_LAYERS)  # no ids in the config

DRAFT_VOCAB = 1024
DRAFT_DIMS = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                  num_key_value_heads=4, head_dim=64)
TTT_STEPS = 3
LOSS_DECAY = 0.8
SEED = 4321
DRAFT_STEPS = 400          # ~7 minutes on 2 idle CPU cores (train acc ~0.89)
BATCH = 16
LR = 3e-3
WARMUP = 10
IGNORE = -100


# ---- target features ------------------------------------------------------------------------
@dataclass
class Features:
    """Target-side inputs of the draft for a list of sequences (all tensors on CPU).

    Attributes:
        input_ids: per sequence int64 [T].
        aux_cat: per sequence [T, K*H] in the target's dtype (bfloat16).
        argmax: per sequence int64 [T], the target's greedy next token after position t.
        hf_indices: the captured HF hidden_states indices in concat order.
    """

    input_ids: list[torch.Tensor]
    aux_cat: list[torch.Tensor]
    argmax: list[torch.Tensor]
    hf_indices: tuple[int, ...]


def capture_features(target, seqs: list[torch.Tensor], hf_indices, batch: int = 32) -> Features:
    """Run the target over ``seqs`` in right-padded batches; keep aux concat and argmax per row."""
    aux, arg = [], []
    for i in range(0, len(seqs), batch):
        chunk = seqs[i:i + batch]
        lengths = torch.tensor([len(s) for s in chunk])
        ids = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.int64)
        for r, s in enumerate(chunk):
            ids[r, :len(s)] = s
        cap = capture_target(target, ids, hf_indices, lengths=lengths)
        for r, n in enumerate(lengths.tolist()):
            aux.append(cap.aux_cat[r, :n].clone())
            arg.append(cap.argmax[r, :n].clone())
    return Features(list(seqs), aux, arg, tuple(int(i) for i in hf_indices))


# ---- draft vocabulary -----------------------------------------------------------------------
def select_draft_vocab(argmaxes: list[torch.Tensor], vocab_size: int, draft_vocab: int = DRAFT_VOCAB):
    """Draft vocab = the ``draft_vocab`` most frequent target-argmax ids (ties: lower id first).

    If fewer distinct ids occur, unused ids spread evenly over the whole target vocab fill the
    rest — as a real 32K draft vocab spreads over a 128K target vocab — so that ``d2t`` is a real
    offset map (BPE gives frequent tokens low ids, and filling with the lowest unused ids would
    make d2t almost all zeros, hiding every vocab-map mistake). Returns ``(hot_ids, d2t, t2d)``:
    ``hot_ids`` int64 [Vd] ascending target ids, ``d2t`` int64 [Vd] offsets with
    ``hot_ids = arange(Vd) + d2t``, ``t2d`` bool [V].
    """
    counts = torch.bincount(torch.cat(argmaxes), minlength=vocab_size)
    seen = [i for i in sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i)) if counts[i] > 0]
    chosen = seen[:draft_vocab]
    unused = [i for i in range(vocab_size) if counts[i] == 0]
    need = draft_vocab - len(chosen)
    if need > 0:
        step = len(unused) / need
        chosen += [unused[int(k * step)] for k in range(need)]
    hot = torch.tensor(sorted(chosen), dtype=torch.int64)
    d2t = hot - torch.arange(draft_vocab, dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[hot] = True
    return hot, d2t, t2d


def target_to_draft_ids(t2d: torch.Tensor) -> torch.Tensor:
    """int64 [V]: target id -> draft id, or ``IGNORE`` for ids outside the draft vocab."""
    idx = torch.cumsum(t2d.to(torch.int64), 0) - 1
    return torch.where(t2d, idx, torch.full_like(idx, IGNORE))


# ---- model ----------------------------------------------------------------------------------
def make_draft(target, hot: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor,
               seed: int = SEED, *, serve_ids=SERVE_IDS, dims: dict = DRAFT_DIMS,
               num_layers: int = 1, window: int | None = None) -> Eagle3Draft:
    """A fresh fp32 draft: shared, frozen target embedding; lm_head = target lm_head[hot].

    ``dims``: the draft's Llama dims (``DRAFT_DIMS`` keys); ``num_layers``: its decoder layers
    (``num_hidden_layers``, chained as SGLang does, ``replay.model.draft_model``).

    ``window``: every layer attends within SGLang's draft window ``W`` (``--speculative-draft-window-size W``,
    its ``kv`` rule, eagle3/attention_window.py), None: full attention.

    ``serve_ids``: the SGLang ``eagle_aux_hidden_state_layer_ids`` written into its config, one
    per aux slot (they must capture the training layers on the target's family: the rule is the
    target model file's ``set_eagle3_layers_to_capture``, see ``families.sglang_serve_ids``).
    """
    tcfg = target.config
    cfg = Eagle3DraftConfig(
        **dims, num_hidden_layers=num_layers, vocab_size=tcfg.vocab_size, draft_vocab_size=len(hot),
        rms_norm_eps=tcfg.rms_norm_eps, rope_theta=_rope_theta(tcfg), rope_scaling=None, **NORMS_OFF,
        max_position_embeddings=tcfg.max_position_embeddings, num_aux=len(serve_ids),
        target_hidden_size=tcfg.hidden_size, eagle_aux_hidden_state_layer_ids=list(serve_ids),
        aux_convention="sglang", **({} if window is None else
                                    {"attention_windows": (window,) * num_layers, "window_distance": KV}))
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    draft.set_target_embedding(target_embedding(target).float())
    draft.embed_tokens.weight.requires_grad_(False)
    with torch.no_grad():
        draft.lm_head.weight.copy_(target_lm_head(target).float()[hot])
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    draft.lm_head_source = "target"
    return draft


def _rope_theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


# ---- one TTT step ---------------------------------------------------------------------------
def pad_batch(feats: Features, idx: list[int]):
    """Right-padded batch: ``(aux_cat fp32 [B,T,K*H], input_ids [B,T], argmax [B,T], lengths [B])``."""
    lengths = torch.tensor([len(feats.input_ids[i]) for i in idx])
    B, T = len(idx), int(lengths.max())
    W = feats.aux_cat[idx[0]].shape[-1]
    aux = torch.zeros(B, T, W)
    ids = torch.zeros(B, T, dtype=torch.int64)
    arg = torch.zeros(B, T, dtype=torch.int64)
    for r, i in enumerate(idx):
        n = int(lengths[r])
        aux[r, :n] = feats.aux_cat[i].float()
        ids[r, :n] = feats.input_ids[i]
        arg[r, :n] = feats.argmax[i]
    return aux, ids, arg, lengths


def ttt_loss(draft: Eagle3Draft, aux, ids, arg, lengths, t2d_index: torch.Tensor,
             steps: int = TTT_STEPS):
    """Teacher-forced TTT forward and SpecForge-style loss.

    Returns ``(loss, correct, valid, out)``: per depth k, ``correct[k]`` bool [B,T] is
    "draft argmax mapped through d2t == target argmax" (SpecForge ``acc``), ``valid[k]`` the rows
    that have a label.
    """
    out = draft.ttt_forward(aux, ids, steps, lengths=lengths)
    labels = ttt_labels(arg, steps, lengths, ignore_index=IGNORE)
    loss = aux.new_zeros(())
    correct, valid = [], []
    for k in range(steps):
        lab = labels[k]
        ok = lab != IGNORE
        lab_d = torch.where(ok, t2d_index[lab.clamp(min=0)], torch.full_like(lab, IGNORE))
        logits = out.logits[k]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab_d.reshape(-1),
                             ignore_index=IGNORE)
        loss = loss + (LOSS_DECAY ** k) * ce
        pred = out.topk_target(1)[k][..., 0]
        correct.append((pred == lab) & ok)
        valid.append(ok)
    return loss, correct, valid, out


# ---- training -------------------------------------------------------------------------------
def train(draft: Eagle3Draft, feats: Features, *, steps: int = DRAFT_STEPS, batch: int = BATCH,
          lr: float = LR, seed: int = SEED, log=print) -> dict:
    """Adam over shuffled batches of ``feats`` for ``steps`` steps (warmup, cosine to 10 %).

    Returns stats with per-depth training accuracy over the last epoch's worth of steps.
    """
    t2d_index = target_to_draft_ids(draft.t2d)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    n = len(feats.input_ids)
    per_epoch = math.ceil(n / batch)
    window = []   # per-step (correct counts per depth, valid counts per depth)
    order: list[int] = []
    draft.train()
    t0 = time.time()
    for step in range(steps):
        if not order:
            order = torch.randperm(n, generator=gen).tolist()
        idx, order = order[:batch], order[batch:]
        f = (step + 1) / WARMUP if step < WARMUP else \
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP)))
        for g in opt.param_groups:
            g["lr"] = lr * f
        aux, ids, arg, lengths = pad_batch(feats, idx)
        loss, correct, valid, _ = ttt_loss(draft, aux, ids, arg, lengths, t2d_index)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        window.append(([int(c.sum()) for c in correct], [int(v.sum()) for v in valid]))
        window = window[-per_epoch:]
        if step % 10 == 0 or step == steps - 1:
            acc = _window_acc(window)
            log(f"draft step {step:4d}/{steps} loss {loss.item():.3f} acc "
                + " ".join(f"{a:.3f}" for a in acc) + f" ({time.time() - t0:.0f}s)")
    draft.eval()
    return {"steps": steps, "batch": batch, "lr": lr, "train_seconds": round(time.time() - t0, 1),
            "final_loss": round(loss.item(), 4),
            "train_acc_last_epoch": [round(a, 4) for a in _window_acc(window)]}


def _window_acc(window) -> list[float]:
    c = torch.tensor([w[0] for w in window]).sum(0)
    v = torch.tensor([w[1] for w in window]).sum(0)
    return (c / v.clamp(min=1)).tolist()


# ---- evaluation -----------------------------------------------------------------------------
@torch.no_grad()
def evaluate(draft: Eagle3Draft, feats: Features, prompt_lens: list[int] | None = None,
             batch: int = 32) -> dict:
    """Offline per-depth accuracy and chain acceptance of ``draft`` on ``feats``.

    ``acc[k]``: teacher-forced accuracy at depth k over rows with a label. With ``prompt_lens``,
    the acceptance figures use only decode rows (t >= prompt_len - 1, the rows SGLang drafts
    from) that have labels for all depths: ``accept_rate[k]`` = fraction of rows whose depths
    0..k are all right (a greedy chain accepts exactly these), and ``accept_length`` =
    1 + sum_k accept_rate[k] (the bonus token included, like SGLang's ``spec_accept_length``).
    """
    draft.eval()
    t2d_index = target_to_draft_ids(draft.t2d)
    steps = TTT_STEPS
    c_all = torch.zeros(steps)
    v_all = torch.zeros(steps)
    chain = torch.zeros(steps)
    rows = 0
    n = len(feats.input_ids)
    for i in range(0, n, batch):
        idx = list(range(i, min(n, i + batch)))
        aux, ids, arg, lengths = pad_batch(feats, idx)
        _, correct, valid, _ = ttt_loss(draft, aux, ids, arg, lengths, t2d_index, steps)
        for k in range(steps):
            c_all[k] += correct[k].sum()
            v_all[k] += valid[k].sum()
        full = valid[-1].clone()
        if prompt_lens is not None:
            T = ids.shape[1]
            pl = torch.tensor([prompt_lens[j] for j in idx])
            full &= torch.arange(T)[None, :] >= (pl[:, None] - 1)
        cum = full.clone()
        for k in range(steps):
            cum &= correct[k]
            chain[k] += cum.sum()
        rows += int(full.sum())
    rate = (chain / max(rows, 1)).tolist()
    return {"aux_hf_indices": list(feats.hf_indices), "rows": rows,
            "acc": [round(a, 4) for a in (c_all / v_all.clamp(min=1)).tolist()],
            "accept_rate": [round(r, 4) for r in rate],
            "accept_length": round(1 + sum(rate), 4)}


# ---- driver ---------------------------------------------------------------------------------
def build_draft(target_dir: str | Path, data_dir: str | Path, out_dir: str | Path, *,
                steps: int = DRAFT_STEPS, batch: int = BATCH, train_hf_indices=TRAIN_HF_INDICES,
                serve_ids=SERVE_IDS, heldout_layers: dict | None = None, dims: dict = DRAFT_DIMS,
                num_layers: int = 1, window: int | None = None, log=print) -> dict:
    """Train an EAGLE-3 draft from ``target_dir`` + ``data_dir`` and save it to ``out_dir``.

    Any family of target works: the draft is trained on HF ``hidden_states`` indices
    ``train_hf_indices`` and saved with the SGLang ids ``serve_ids`` (which must capture those
    indices under the target family's rule). ``heldout_layers`` names the HF index lists to
    evaluate on the held-out sequences; by default (the Llama demo) the training layers, the
    seed's wrong layers (SGLang ids [2, 5, 6] -> HF [3, 6, 7]) and SGLang's default capture.
    ``dims`` / ``num_layers``: the draft's shape (``make_draft``; the demo draft2l is 2 layers). ``window``:
    trained within SGLang's draft window W (``make_draft``); SGLang 0.5.23 takes it from its server option alone
    (srt/models/llama_eagle3.py:286-299), so the config is saved without it and the stats say how to serve.

    Returns:
        stats dict (vocab coverage, training, held-out evaluations).
    """
    torch.manual_seed(SEED)
    t0 = time.time()
    target = load_target(target_dir, dtype=torch.bfloat16)
    train_seqs = load_sequences(data_dir, "train")
    feats = capture_features(target, train_seqs, train_hf_indices)
    log(f"draft: captured target features for {len(train_seqs)} sequences ({time.time() - t0:.0f}s)")
    hot, d2t, t2d = select_draft_vocab(feats.argmax, target.config.vocab_size)
    all_labels = torch.cat([a[1:] for a in feats.argmax])
    coverage = float(t2d[all_labels].float().mean())
    log(f"draft: vocab {len(hot)} ids cover {coverage:.4%} of the target's argmax labels")
    draft = make_draft(target, hot, d2t, t2d, serve_ids=serve_ids, dims=dims, num_layers=num_layers, window=window)
    stats = train(draft, feats, steps=steps, batch=batch, log=log)
    trained = draft.config
    draft.config = replace(trained, attention_windows=None)  # the window is a server option (docstring)
    save_draft(draft, out_dir, "specforge", dtype=torch.bfloat16)
    draft.config = trained

    held = load_sequences(data_dir, "heldout")
    plens = load_prompt_lens(data_dir, "heldout")
    evals = {}
    demo_layers = heldout_layers is None
    if demo_layers:
        heldout_layers = {"train_layers": TRAIN_HF_INDICES, "seed_wrong_layers": SEED_WRONG_HF_INDICES,
                          "sglang_default_layers": SGLANG_DEFAULT_HF_INDICES}
    for name, idx in heldout_layers.items():
        ev = evaluate(draft, capture_features(target, held, idx), plens)
        evals[name] = ev
        log(f"held-out, aux HF {list(idx)}: acc {ev['acc']} accept_rate {ev['accept_rate']} "
            f"accept_length {ev['accept_length']}")
    return {"draft_vocab": len(hot), "label_coverage": round(coverage, 6),
            "train_hf_indices": list(train_hf_indices), "serve_ids_sglang": list(serve_ids),
            **({"seed_wrong_ids_sglang": SEED_WRONG_IDS} if demo_layers else {}), "ttt_steps": TTT_STEPS,
            "dims": dims, "num_hidden_layers": num_layers, "seed": SEED, **stats, "heldout": evals,
            **({} if window is None else {"draft_window": {"window": window, "distance": KV, "serve": [
                "--speculative-draft-window-size", str(window)], "record_train": ["--draft-window", str(window)]}}),
            "total_seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m specdiff.demo_models.train_draft --target DIR --data DIR --out DIR``.

    ``--layers N --intermediate-size I`` train an N-layer draft (the shipped ``draft2l``: 2 and 512,
    under 5 MB in bf16); ``--window W`` one within SGLang's draft window (the shipped ``draftw``: 8);
    ``--stats FILE`` writes what ``build_draft`` returns as JSON.
    """
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Train the tiny EAGLE-3 demo draft")
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=DRAFT_STEPS)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--intermediate-size", type=int, default=DRAFT_DIMS["intermediate_size"])
    ap.add_argument("--window", type=int, help="train within SGLang's draft window W (serve it with "
                    "--speculative-draft-window-size W; record train --draft-window W)")
    ap.add_argument("--stats")
    args = ap.parse_args(argv)
    dims = {**DRAFT_DIMS, "intermediate_size": args.intermediate_size}
    # a non-default shape is evaluated on its training layers only (the seed-bug layers are the 1-layer demo's)
    held = None if args.layers == 1 and dims == DRAFT_DIMS and args.window is None else {
        "train_layers": TRAIN_HF_INDICES}
    stats = build_draft(args.target, args.data, args.out, steps=args.steps, dims=dims, num_layers=args.layers,
                        heldout_layers=held, window=args.window)
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
