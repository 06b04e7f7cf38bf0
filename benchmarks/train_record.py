"""Benchmark: `record train` vs the bare teacher-forced forward, in one run.

    python benchmarks/train_record.py [--seqs 64] [--len 512] [--batch 8] [--dtype bfloat16]

Uses the demo pair in traces/models when it is built, else random models of the same
dimensions (target: Llama 8 layers, H 256, MLP 512, V 4096; draft: H 256, MLP 1024, Vd 1024) —
the timing depends on the shapes, not the weights. Each batch runs twice, interleaved:
the bare ``TrainReplayer.forward`` (target with all hidden states + the draft's TTT forward),
then the same forward plus every canonical append (default capture, 64 probe positions) to a
trace in a temporary folder, synchronously (record_train overlaps appends with the next batch on
a thread, so this is an upper bound). Goal: recording adds <= 30 % over the bare forward.
Last, the noise floor record_train measures once per trace, timed against the whole record.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def _models(tmp: Path, draft_dtype: torch.dtype):
    from specdiff.eagle3.norms import NORMS_OFF
    from specdiff.replay.model.checkpoint import load_draft, save_draft
    from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig
    from specdiff.replay.model.loading import quiet_transformers
    from specdiff.replay.model.target_capture import load_target, target_embedding, target_lm_head

    quiet_transformers()
    demo = ROOT / "traces" / "models"
    tdir, ddir = demo / "target", demo / "draft"
    if not ((tdir / "model.safetensors").is_file() and (ddir / "config.json").is_file()):
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048)
        tdir, ddir = tmp / "target", tmp / "draft"
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(tdir))
        d = Eagle3Draft(Eagle3DraftConfig(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                                          num_key_value_heads=4, head_dim=64, vocab_size=4096,
                                          draft_vocab_size=1024, num_aux=3, target_hidden_size=256,
                                          rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, **NORMS_OFF,
                                          eagle_aux_hidden_state_layer_ids=[-1, 2, 5]))
        with torch.no_grad():
            for p in d.parameters():
                p.normal_(0, 0.05)
            d.d2t.copy_(torch.arange(1024) * 3)
        save_draft(d, ddir, "specforge")
        print("models: random, demo dimensions (traces/models not built)")
    else:
        print(f"models: {tdir.parent}")
    target = load_target(tdir, dtype=torch.bfloat16)
    loaded = load_draft(ddir, dtype=draft_dtype, target_embedding=target_embedding(target).float(),
                        target_lm_head=target_lm_head(target).float())
    return target, loaded


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--probe-positions", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specdiff.replay.model.loading import DTYPES
    from specdiff.replay.record.record_train import TrainReplayer, TrainSequence, resolve_train_aux
    from specdiff.tracer.engines.writer.thread import AsyncTraceWriter
    from specdiff.tracer.store import TraceWriter

    tmp = Path(tempfile.mkdtemp(prefix="specdiff-bench-"))
    try:
        target, loaded = _models(tmp, DTYPES[args.dtype])
        L = int(target.config.num_hidden_layers)
        aux = resolve_train_aux(loaded, L)
        rng = np.random.default_rng(0)
        V = int(target.config.vocab_size)
        seqs = [TrainSequence(rng.integers(3, V, args.len), 16, f"s{i}", i) for i in range(args.seqs)]
        rep = TrainReplayer(target, loaded.model, aux, steps=args.steps, capture="default",
                            probe_positions=args.probe_positions)
        batches = [seqs[i:i + args.batch] for i in range(0, len(seqs), args.batch)]
        ids0, len0 = TrainReplayer.pad(batches[0][:2])
        rep.forward(ids0, len0)  # warm-up

        # Paired and interleaved, batch by batch (bare forward, then the same batch recorded), so
        # load changes on a shared machine hit both sides alike. Appends are synchronous here: an
        # upper bound (record_train also overlaps them with the next forward on a thread).
        path = tmp / "train.trace"
        w = TraceWriter(str(path), side="train", contract={"engine": "specdiff-reference"})
        for s in seqs:
            w.add_sequence(s.tokens, prompt_len=s.prompt_len, rid=s.rid, seq_id=s.seq_id)
        rep.write_d2t(w)
        bare = rec = 0.0
        ratios = []
        for b in batches:
            ids, lengths = TrainReplayer.pad(b)
            t0 = time.perf_counter()
            rep.forward(ids, lengths)
            t1 = time.perf_counter()
            cap, out = rep.forward(ids, lengths)
            rep.write(w, [s.seq_id for s in b], cap, out)
            t2 = time.perf_counter()
            bare += t1 - t0
            rec += t2 - t1
            ratios.append((t2 - t1) / (t1 - t0))
        t0 = time.perf_counter()
        w.close()
        rec += time.perf_counter() - t0
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path)

        # As record_train runs: appends on a background thread overlap the next batch's forward.
        def bare_pass() -> float:
            t0 = time.perf_counter()
            for b in batches:
                rep.forward(*TrainReplayer.pad(b))
            return time.perf_counter() - t0

        o_bare1 = bare_pass()
        t0 = time.perf_counter()
        w = TraceWriter(str(path), side="train", contract={"engine": "specdiff-reference"})
        bg = AsyncTraceWriter(w, lambda tw, rows: rows.flush(tw), max_items=2, lossless=True)
        for b in batches:
            cap, out = rep.forward(*TrainReplayer.pad(b))
            bg.submit(rep.rows([s.seq_id for s in b], cap, out))
        bg.close(timeout_s=None)
        o_rec = time.perf_counter() - t0
        o_bare = (o_bare1 + bare_pass()) / 2
        # The noise floor record_train measures once at the end (replay/record/noise_floor.py): float32 copies
        # of both models and one batch of <= FLOOR_TOKENS tokens forward at each precision.
        from specdiff.replay.record.noise_floor import measure_noise_floor

        t0 = time.perf_counter()
        floor = measure_noise_floor(rep, seqs, [s.seq_id for s in seqs])
        o_floor = time.perf_counter() - t0
        tokens = args.seqs * args.len
        print(f"{args.seqs} sequences x {args.len} tokens, {args.steps} TTT steps, draft {args.dtype}, "
              f"{args.threads} threads, batch {args.batch}")
        print(f"bare forward      {bare:7.2f} s   {tokens / bare:8.0f} tokens/s")
        print(f"record train      {rec:7.2f} s   {tokens / rec:8.0f} tokens/s   trace {size / 2**20:.0f} MiB")
        print(f"ratio             {rec / bare:7.2f}x   (recording adds {100 * (rec / bare - 1):.0f} %, goal <= 30 %; "
              f"median per batch {np.median(ratios):.2f}x)  [paired, synchronous appends]")
        print(f"overlapped        bare {o_bare:.2f} s (mean of passes before/after), record {o_rec:.2f} s, "
              f"ratio {o_rec / o_bare:.2f}x  [as record_train runs: appends on a background thread]")
        print(f"noise floor       {o_floor:7.2f} s once per trace = {100 * o_floor / o_rec:.1f} % of this record "
              f"({floor.get('method') or floor.get('unmeasured')}, {len(floor.get('tensors', {}))} tensors)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
