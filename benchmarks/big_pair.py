"""A synthetic production-size trace pair: time to first divergence and the full diff vs a plain read.

Generates, chunk by chunk (never more than one sequence of rows in memory), a training/serving
pair of bf16 aux hidden states with H=4096 (``--hidden``: Kimi-K2's 7168) and three slots (8 KiB a slot-row at 4096) as the recorders
write them, ``--gib`` GiB of raw rows per side (the production-size goal is 20 GiB; default 2 so it
fits a small machine's disk: check ``df -h`` first; on-disk size is ~0.8x raw):

- ``--kind seed`` (default): serving's slot j holds training's slot j+1 (the seed bug: every row
  of target.aux.0 diverges);
- ``--kind equal``: serving = training plus bf16-sized noise (no divergence: the diff does all
  its work).

Then, each in a fresh subprocess, in one run: a plain read of every data array of both traces
(zarr, chunk by chunk), and ``diff_traces`` (narrowing off) timing the first divergence
(``on_first``) and the full report; prints both, their ratios to the read, and peak RSS.

    python benchmarks/big_pair.py --gib 2 --dir /tmp            # build, measure, delete
    python benchmarks/big_pair.py --gib 20 --dir /big --keep    # the 20 GiB pair of docs/performance.md
    python benchmarks/big_pair.py --pair /big/specdiff-bigpair-XXXX  # measure a kept pair again
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

import numpy as np
from diff_throughput import _bf16, _du, _status_kib, plain_read

H, K, SEQ_LEN = 4096, 3, 512
ROW_BYTES = K * H * 2  # one position: three bf16 slots


def build(root: str, *, gib: float, kind: str, hidden: int = H) -> tuple[str, str]:
    """Write the pair under ``root`` with aux rows ``hidden`` wide; memory: one sequence of rows per
    side at a time."""
    import torch

    from specdiff.tracer.schema import aux_name
    from specdiff.tracer.store import TraceWriter

    positions = max(int(gib * (1 << 30)) // (K * hidden * 2), SEQ_LEN)
    n_seqs = -(-positions // SEQ_LEN)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((K + 1, SEQ_LEN, hidden), dtype=np.float32)  # layers, rolled per sequence
    noise = 1 + 1e-3 * rng.standard_normal((1, hidden), dtype=np.float32)
    paths = (os.path.join(root, "train.trace"), os.path.join(root, "serve.trace"))
    contract = {"num_layers": 8, "hidden_size": hidden, "dtype": "bfloat16", "spec_steps": 3}
    hf = ([0, 3, 6], [3, 6, 7] if kind == "seed" else [0, 3, 6])
    writers = [TraceWriter(p, side=side, contract={**contract, "aux_hf_indices": ids}, overwrite=True)
               for p, side, ids in zip(paths, ("train", "serve"), hf)]
    for s in range(n_seqs):
        n = min(SEQ_LEN, positions - s * SEQ_LEN)
        toks = (np.arange(s, s + n + 1) * 7919) % 32000
        layers = np.roll(base, s, axis=1)[:, :n]
        pos = np.arange(n)
        for side, w in enumerate(writers):
            sid = w.add_sequence(toks, prompt_len=16, rid=f"{w.side}-{s}")
            shift = 1 if side and kind == "seed" else 0
            for j in range(K):
                x = layers[j + shift] * noise if side and kind == "equal" else layers[j + shift]
                bits = torch.from_numpy(_bf16(x).view(np.int16)).view(torch.bfloat16)
                w.append(aux_name(j), bits, seq=sid, pos=pos)
            w.append("tokens", toks[1:n + 1].astype(np.int64), seq=sid, pos=pos)
    for w in writers:
        w.close()
    return paths


def run_diff(paths: list[str]) -> dict:
    from specdiff.replay.diff.pipeline import diff_traces

    t0 = time.perf_counter()
    first: list = []
    report = diff_traces(paths[0], paths[1], narrow=False,
                         on_first=lambda e: first.append((time.perf_counter() - t0, e.verdict())))
    return {"seconds": time.perf_counter() - t0, "first_s": first[0][0] if first else None,
            "early": first[0][1] if first else None, "verdict": report.verdict()}


def _child(mode: str, paths: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, *paths], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0,
                    help="raw GiB of aux rows per trace (production size: 20)")
    ap.add_argument("--kind", choices=["seed", "equal"], default="seed")
    ap.add_argument("--hidden", type=int, default=H, help="aux row width (Llama-3-8B 4096, Kimi-K2 7168)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the pair")
    ap.add_argument("--keep", action="store_true", help="keep the traces (printed path)")
    ap.add_argument("--pair", default=None, metavar="DIR",
                    help="measure a pair kept by an earlier --keep run (train.trace, serve.trace) instead of building one")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = plain_read(args.paths) if args.child == "read" else run_diff(args.paths)
        res["maxrss_bytes"] = _status_kib("VmHWM") * 1024
        print(json.dumps(res))
        return

    work = args.pair or tempfile.mkdtemp(dir=args.dir, prefix="specdiff-bigpair-")
    try:
        if args.pair:
            paths = (os.path.join(work, "train.trace"), os.path.join(work, "serve.trace"))
            print(f"the pair in {work}: {sum(_du(p) for p in paths) / (1 << 30):.2f} GiB on disk")
        else:
            t0 = time.perf_counter()
            paths = build(work, gib=args.gib, kind=args.kind, hidden=args.hidden)
            print(f"built a {args.kind} pair of 2 x {args.gib:g} GiB raw bf16 aux rows (H={args.hidden}, {K} slots) in "
                  f"{time.perf_counter() - t0:.0f} s: {sum(_du(p) for p in paths) / (1 << 30):.2f} GiB on disk")
        read = _child("read", paths)
        diff = _child("diff", paths)
        r = read["seconds"]
        print(f"plain read      : {r:7.2f} s  ({read['bytes'] / r / 1e6:.0f} MB/s)")
        if diff["first_s"] is not None:
            print(f"first divergence: {diff['first_s']:7.2f} s  ({diff['first_s'] / r:.3f}x the read; goal < 3 s "
                  f"at 20 GiB) -> {diff['early']}")
        print(f"full diff       : {diff['seconds']:7.2f} s  ({diff['seconds'] / r:.2f}x the read; peak RSS "
              f"{diff['maxrss_bytes'] / (1 << 20):.0f} MiB, goal < 1024)")
        print(f"verdict         : {diff['verdict']}")
    finally:
        if args.keep or args.pair:
            print(f"traces kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
