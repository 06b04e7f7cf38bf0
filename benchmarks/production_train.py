"""`record train` at a production width: the target-forward path vs the draft forward on given hidden
states (what ``--features`` computes), side by side in one run, and the peak RSS of the command.

    python benchmarks/production_train.py                              # Llama-3-8B shape, 3 layers
    python benchmarks/production_train.py --shape kimi-k2 --layers 3   # Kimi-K2 shape (MLA + MoE, 4 experts)
    python benchmarks/production_train.py --rss                        # and record train's peak RSS
    python benchmarks/production_train.py --rss --rss-noise-floor      # the RSS with the noise floor too
    python benchmarks/production_train.py --shape kimi-k2 --no-timing --rss-features --rss-noise-floor
    python benchmarks/production_train.py --hidden 2048 --rss --rss-noise-floor   # narrowed: a 24 GiB machine

Models: a random target of the shape (``demo_models.production``: Llama-3-8B H 4096, vocab 128,256;
Kimi-K2 H 7168, vocab 163,840, DeepSeek-V3 MLA + MoE) with ``--layers`` decoder layers, and a random
one-layer EAGLE-3 draft of its width with a 32,000 vocabulary, built once into ``--models`` (kept: a
2-layer Llama-3-8B shape takes ~3.5 min to draw on 2 cores, 3 GB on disk) and reused.

In this process, ``--seqs`` random sequences of ``--len`` tokens, batch by batch, each batch timed
three ways in turn (so a busy machine slows all alike): the target forward with hidden states
(``capture_target``, transformers), the draft's TTT forward on those hidden states
(``Eagle3Draft.ttt_forward``), and the rows appended to a trace (``TrainReplayer.write``). The
target-forward path of ``record train`` is all three; the features path (``record train --features``:
no target) is the last two plus reading the stored hidden states (not timed: it is a file read of
3 x H x 2 bytes a token). Prints seconds per 1,000 tokens of each and their ratio.

With ``--rss``, ``specdiff record train`` itself, in a fresh process, on ``--rss-seqs`` of those sequences given as
``--prompts`` input ids (the forward and models of ``--replay``; a serving trace only supplies the
sequences): its peak RSS (ru_maxrss) against the bytes of the two checkpoints, with ``--no-noise-floor``; not run
where the machine has less available than twice those bytes. ``--rss-features``: the same for ``record train
--features`` on those sequences stored as speculators' ``hs_{i}.safetensors`` (random bf16 states at the draft's
aux layers): no target is loaded, only its embedding, lm_head and final norm. ``--rss-noise-floor`` adds, per
path, the noise floor (record train's default: the forward re-run at the other precision with the tensors cast
in place, replay/model/other_precision.py) with the floor's casts of before alternated with now's: before, every
embedding table was cast and a target holding its states (stored features) cast whole; now a table read only by
its lookup keeps its dtype (its rows are cast) and such a target is not cast. Each line says whether the floor
was measured (it is not where the cast tensors exceed half the free memory). ``--rss-rounds`` repeats the runs.
``--hidden`` narrows the Llama shape (vocabularies kept) for a machine without the memory of the full width.

Measured 2026-12-07 18:50-19:20 UTC on the 2-core, 24 GiB machine shared with other jobs (load 7-13; 3-20 GiB
available), side by side in one run each (docs/performance.md "At production width"). Llama-3-8B shape, 3 layers,
3.97 GiB of checkpoints, target-forward path: 5.98 GiB without the floor; with it 11.61 GiB with the casts of
before, 9.64 GiB now (-1.97 GiB: the draft's 128,256 x 4096 table at float32), the floor measured in both.
Kimi-K2 shape, 3 layers, 7.97 GiB of checkpoints, features path (no target loaded): 11.48 GiB without the floor
(10.80 GiB in a second run); with the casts of before 11.38 GiB, the floor not measured (16.7 GiB more, over half
the free memory); now 13.51 GiB, the floor measured (its draft stages). The Kimi-K2 target-forward ``record
train`` was not run (12.1 GiB available, under twice its checkpoints); the timing process, which holds target
and draft, peaked at 13.2-14.8 GiB (3 runs). Earlier the same day: Llama-3-8B 7.45 GiB without the floor,
11.64-11.67 GiB with it; at 2048 wide, 7.34 GiB with the floor on float32 copies, 5.60 GiB cast in place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

#: one ``specdiff record train`` in a fresh interpreter; prints its exit code and peak RSS (KiB)
PROBE = """
import json, os, resource, sys
from specdiff.tui.cli import cli
if os.environ.get("SPECDIFF_BENCH_CAST_ALL") == "1":  # the floor's casts before: every table, a states target
    import torch
    import specdiff.replay.model.other_precision as op
    import specdiff.replay.record.noise_floor as nf
    op.lookup_tables = lambda module: []
    nf._holds_states = lambda target: False
    nf._by_module = lambda target: isinstance(target, torch.nn.Module) and not hasattr(target, "capture_batch")
try:
    cli.main(args=sys.argv[1:], prog_name="specdiff")
    rc = 0
except SystemExit as e:
    rc = e.code or 0
print(json.dumps({"rc": rc, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def narrowed(shape: str, hidden: int | None) -> str:
    """``shape``, or a Llama-3-8B shape narrowed to ``hidden`` (a machine without the memory for the full
    width): heads of the same head_dim, the MLP scaled with the width, the vocabularies kept. Registered in
    ``demo_models.production.SHAPES`` under ``<shape>-h<hidden>`` for this process; returns that name."""
    from specdiff.demo_models.production import SHAPES

    s = SHAPES[shape]
    if hidden is None or hidden == s["hidden"]:
        return shape
    if s["arch"] != "llama" or hidden % s["head_dim"] or (hidden // s["head_dim"]) % s["kv_heads"]:
        raise SystemExit(f"--hidden {hidden}: only a Llama shape narrows, to a multiple of head_dim x kv_heads "
                         f"({s['head_dim'] * s['kv_heads']})")
    name = f"{shape}-h{hidden}"
    SHAPES[name] = {**s, "hidden": hidden, "heads": hidden // s["head_dim"],
                    "intermediate": s["intermediate"] * hidden // s["hidden"]}
    return name


def ensure_models(root: Path, shape: str, layers: int, experts: int) -> tuple[Path, Path]:
    """The shape's target and draft under ``root/<shape>-L<layers>`` (built when absent)."""
    from specdiff.demo_models.production import SHAPES, build_production_draft, build_production_target
    from specdiff.eagle3.aux_layers import native_aux_ids

    d = root / (f"{shape}-L{layers}" + ("" if SHAPES[shape]["arch"] == "llama" else f"-E{experts}"))
    target, draft = d / "target", d / "draft"
    if not (d / "READY").is_file():
        t0 = time.time()
        build_production_target(shape, target, layers=layers, experts=experts)
        arch = json.loads((target / "config.json").read_text())["architectures"][0]
        hf = [0, layers // 2, layers - 1]  # the embedding output, a middle and a late layer's output (HF index)
        build_production_draft(shape, draft, aux_ids=native_aux_ids(hf, "sglang", num_layers=layers, architecture=arch))
        (d / "READY").write_text(f"built in {time.time() - t0:.0f} s\n")
        print(f"models: built {d} in {time.time() - t0:.0f} s")
    else:
        print(f"models: {d} (built earlier)")
    return target, draft


def _bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.safetensors"))


def time_paths(target_dir: Path, draft_dir: Path, *, seqs: int, length: int, batch: int, steps: int) -> dict:
    """Seconds of the target forward, the draft TTT forward and the row appends over ``seqs``
    random sequences, interleaved batch by batch."""
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.model.target_capture import (
        capture_target,
        load_target,
        target_embedding,
        target_lm_head,
    )
    from specdiff.replay.record.replayer import LOGITS_TOPK, TrainReplayer
    from specdiff.replay.record.sequences import TrainSequence
    from specdiff.replay.record.train_aux import resolve_train_aux
    from specdiff.tracer.store import TraceWriter

    target = load_target(target_dir, dtype=torch.bfloat16)
    loaded = load_draft(draft_dir, dtype=torch.bfloat16, target_embedding=target_embedding(target),
                        target_lm_head=target_lm_head(target))
    L = int(target.config.num_hidden_layers)
    aux = resolve_train_aux(loaded, L, architecture=target.config.architectures[0])
    rep = TrainReplayer(target, loaded.model, aux, steps=steps, capture="default", probe_positions=0)
    rng = np.random.default_rng(0)
    V = int(target.config.vocab_size)
    data = [TrainSequence(rng.integers(3, V, length), 16, f"s{i}", i) for i in range(seqs)]
    batches = [data[i:i + batch] for i in range(0, len(data), batch)]
    rep.forward(*TrainReplayer.pad(batches[0][:1]))  # warm-up
    tmp = Path(tempfile.mkdtemp(prefix="specdiff-prodtrain-"))
    w = TraceWriter(str(tmp / "t.trace"), side="train", contract={"engine": "specdiff-reference"})
    for s in data:
        w.add_sequence(s.tokens, prompt_len=s.prompt_len, rid=s.rid, seq_id=s.seq_id)
    t = {"target": 0.0, "draft": 0.0, "rows": 0.0}
    dev_draft = loaded.model
    try:
        for b in batches:
            ids, lengths = TrainReplayer.pad(b)
            t0 = time.perf_counter()
            cap = capture_target(target, ids, aux.hf_indices, lengths=lengths, top_logits=LOGITS_TOPK)
            t1 = time.perf_counter()
            out = dev_draft.ttt_forward(cap.aux_cat, ids, steps, lengths=lengths, pad_id=0)
            t2 = time.perf_counter()
            rep.write(w, [s.seq_id for s in b], cap, out)
            t3 = time.perf_counter()
            t["target"] += t1 - t0
            t["draft"] += t2 - t1
            t["rows"] += t3 - t2
        w.close()
        t["trace_bytes"] = sum(f.stat().st_size for f in (tmp / "t.trace").rglob("*") if f.is_file())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t["tokens"] = seqs * length
    t["layer_active"], t["head"] = active_params(target)
    return t


def active_params(target) -> tuple[float, int]:
    """(parameters one token multiplies through in a decoder layer, averaged over the layers; the
    lm_head's): a MoE layer's routed experts count ``num_experts_per_tok / n_routed_experts``."""
    cfg = target.config
    routed, k = getattr(cfg, "n_routed_experts", None), getattr(cfg, "num_experts_per_tok", None)
    total = 0.0
    for layer in target.model.layers:
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        n_exp = sum(p.numel() for p in experts.parameters()) if experts is not None else 0
        n_all = sum(p.numel() for p in layer.parameters())
        total += n_all - n_exp + (n_exp * k / routed if experts is not None and routed else 0)
    return total / len(target.model.layers), target.lm_head.weight.numel()


def write_features(out: Path, V: int, H: int, slots: int, *, seqs: int, length: int) -> Path:
    """``seqs`` random sequences of ``length`` tokens as speculators' offline data (``hs_{i}.safetensors``:
    ``hidden_states`` bf16 [T, slots + 1, H] N(0, 1), ``token_ids`` [T]; replay/record/feature_files.py)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    rng, g = np.random.default_rng(1), torch.Generator().manual_seed(1)
    for i in range(seqs):
        save_file({"hidden_states": torch.randn(length, slots + 1, H, generator=g).to(torch.bfloat16),
                   "token_ids": torch.as_tensor(rng.integers(3, V, length), dtype=torch.int64)},
                  str(out / f"hs_{i}.safetensors"))
    return out


def rss_of_record_train(target: Path, draft: Path, *, seqs: int, length: int, noise_floor: bool,
                        features: bool = False, cast_all: bool = False) -> dict:
    """Peak RSS (KiB), wall seconds and the noise floor (its method, or why it went unmeasured) of
    ``specdiff record train`` in a fresh process: on ``seqs`` random sequences of ``length`` tokens given as
    ``--prompts`` (the target forward), or with ``features`` as stored features (``--features``, speculators'
    files at the draft's aux layers: no target loaded); ``cast_all``: with the floor's casts before
    replay/model/other_precision.py kept embedding tables and targets holding their states uncast."""
    tmp = Path(tempfile.mkdtemp(prefix="specdiff-prodrss-"))
    try:
        cfg = json.loads((target / "config.json").read_text())
        V, H = cfg["vocab_size"], cfg["hidden_size"]
        if features:
            dc = json.loads((draft / "config.json").read_text())  # SpecForge: the ids under eagle_config
            aux = dc.get("eagle_config", dc)["eagle_aux_hidden_state_layer_ids"]
            data = write_features(tmp / "features", V, H, len(aux), seqs=seqs, length=length)
            given = ["--features", str(data), "--aux-layers", ",".join(map(str, aux)), "--aux-convention", "sglang"]
        else:
            rng = np.random.default_rng(1)
            prompts = tmp / "p.jsonl"
            prompts.write_text("".join(json.dumps({"input_ids": rng.integers(3, V, length).tolist()}) + "\n"
                                       for _ in range(seqs)))
            given = ["--prompts", str(prompts)]
        argv = ["record", "train", "--target", str(target), "--draft", str(draft), *given,
                "-o", str(tmp / "o.trace"), "--batch-size", "2", "--noise-floor" if noise_floor else "--no-noise-floor"]
        env = {**os.environ, "SPECDIFF_BENCH_CAST_ALL": "1" if cast_all else "0"}
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "{}"
        got = json.loads(last) if last.startswith("{") else {}
        if got.get("rc") != 0:
            raise SystemExit(f"record train failed (rc {got.get('rc')}): {p.stderr[-2000:]}")
        from specdiff.tracer.store import open_trace

        floor = open_trace(str(tmp / "o.trace")).contract.get("noise_floor") or {}
        return {**got, "wall_s": wall, "floor": floor.get("method") or f"not measured: {floor.get('unmeasured')}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def available_bytes() -> int:
    """The machine's available memory now (``MemAvailable``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def main(argv=None) -> int:
    from specdiff.demo_models.production import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=3, help="decoder layers (>= 3: three aux slots of distinct layers)")
    ap.add_argument("--experts", type=int, default=4, help="Kimi-K2: routed experts per layer (of 384)")
    ap.add_argument("--hidden", type=int, default=None, help="Llama shape: narrow the width to this (vocabularies "
                    "kept; for a machine without the memory of the full width)")
    ap.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "specdiff-production"),
                    help="where the random models are built once and kept")
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rss-seqs", type=int, default=2)
    ap.add_argument("--rss-noise-floor", action="store_true", help="also the RSS with the noise floor, the floor's "
                    "casts of before (every embedding table, a target holding its states) and now alternated")
    ap.add_argument("--rss", action="store_true", help="also run `specdiff record train` for its peak RSS (Llama-3-8B "
                    "shape, 3 layers: 7.5 GiB); skipped when the machine has less available than twice the "
                    "checkpoints")
    ap.add_argument("--rss-features", action="store_true", help="also the peak RSS of `record train --features` on "
                    "stored features of those sequences (no target loaded)")
    ap.add_argument("--rss-rounds", type=int, default=1, help="rounds of the RSS runs, alternated")
    ap.add_argument("--no-timing", action="store_true", help="only the RSS runs (the timing loads target and draft)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.shape = narrowed(args.shape, args.hidden)
    s = SHAPES[args.shape]
    target, draft = ensure_models(Path(args.models), args.shape, args.layers, args.experts)
    wbytes = _bytes(target) + _bytes(draft)
    print(f"{args.shape}: H {s['hidden']}, vocab {s['vocab']}, draft vocab {s['draft_vocab']}, {args.layers} of "
          f"{s['layers_full']} layers; weights {wbytes / 2**30:.2f} GiB (target + draft, bf16)")
    if not args.no_timing:
        report_times(args, s, target, draft)
    paths = [p for p, on in (("target forward", args.rss), ("features", args.rss_features)) if on]
    floors = [(False, False), (True, True), (True, False)] if args.rss_noise_floor else [(False, False)]
    for _round in range(args.rss_rounds):
        for path in paths:
            if path == "target forward" and available_bytes() < 2 * wbytes:
                print(f"record train (target forward): not run, {available_bytes() / 2**30:.1f} GiB available, "
                      f"less than twice the checkpoints' {wbytes / 2**30:.2f} GiB")
                continue
            for nf, cast_all in floors:
                r = rss_of_record_train(target, draft, seqs=args.rss_seqs, length=args.len, noise_floor=nf,
                                        features=path == "features", cast_all=cast_all)
                rss = r["maxrss_kib"] * 1024
                how = ("noise floor, casts before" if cast_all else "noise floor") if nf else "--no-noise-floor"
                print(f"record train ({path}, {how}): peak RSS {rss / 2**30:.2f} GiB = {rss / wbytes:.2f}x the "
                      f"checkpoints' {wbytes / 2**30:.2f} GiB   ({r['wall_s']:.0f} s, {args.rss_seqs} x {args.len} "
                      f"tokens; {available_bytes() / 2**30:.1f} GiB available after; floor: {r['floor']})")
    return 0


def report_times(args, s: dict, target: Path, draft: Path) -> None:
    """Print the two paths' seconds per 1,000 tokens (``time_paths``), their ratio, and both projected to the
    full depth."""
    t = time_paths(target, draft, seqs=args.seqs, length=args.len, batch=args.batch, steps=args.steps)
    k = 1000 / t["tokens"]
    full = (t["target"] + t["draft"] + t["rows"]) * k
    feat = (t["draft"] + t["rows"]) * k
    print(f"{args.seqs} x {args.len} tokens, batch {args.batch}, {args.steps} TTT steps, {args.threads} threads")
    print(f"per 1,000 tokens: target forward {t['target'] * k:7.2f} s   draft TTT {t['draft'] * k:6.2f} s   "
          f"rows {t['rows'] * k:5.2f} s   (trace {t['trace_bytes'] * k / 2**20:.1f} MiB)")
    print(f"record train, target forward path {full:7.2f} s / 1,000 tokens")
    print(f"record train, features path       {feat:7.2f} s / 1,000 tokens   ratio features / target path "
          f"{feat / full:.3f}  [measured side by side, batch by batch]")
    # the target forward's time scaled by the parameters a token multiplies through (decoder layers +
    # lm_head; a MoE layer's experts at k / n_routed. Kimi-K2 with E < 8 experts here runs all E, the real
    # model 8 of 384: the projection then undercounts its layers' experts by (8 - E) x 44M a layer)
    la, head = t["layer_active"], t["head"]
    scale = (s["layers_full"] * la + head) / (args.layers * la + head)
    print(f"projected to {s['layers_full']} layers (target forward x {scale:.2f}: active parameters a token, "
          f"{s['layers_full']} x {la / 1e6:.0f}M + lm_head {head / 1e6:.0f}M over {args.layers} x ...): target path "
          f"{t['target'] * k * scale + feat:.0f} s, features path {feat:.0f} s / 1,000 tokens, ratio "
          f"{feat / (t['target'] * k * scale + feat):.3f}")


if __name__ == "__main__":
    sys.exit(main())
