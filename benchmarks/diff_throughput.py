"""Diff throughput: ``diff_traces`` on two ~1 GiB traces vs a plain read of the same arrays.

Each trace holds hidden-state rows (H=4096) as a serving recorder writes them: ``target.aux.0..2``
[rows, 4096] and ``target.aux_cat`` [rows, 12288] in bf16, plus ``tokens`` and the token
sequences, so the two traces align row for row. Trace B is trace A with bf16-sized noise (every
tensor within tolerance: the diff does all its work and finds no divergence).

In the same run, each in a fresh subprocess (page cache warmed by one untimed read first), in
``--rounds`` alternating rounds (the median round's ratio is the result):

- **read**: every data array of both traces, chunk by chunk via zarr, decompressed, no compare;
- **diff**: ``specdiff.replay.diff.pipeline.diff_traces`` (align, compare, first divergence, contract,
  explain, acceptance);

and prints both times, the ratio (goal <= 1.3x) and the diff's peak RSS (goal < 1 GiB).
``--threads 1`` runs the diff on one block thread (what the diff cost before its thread pool).
``--workers N`` also runs the diff with its blocks on a local Dask cluster of N single-threaded
worker processes (``specdiff diff --workers N``) and prints its time beside the local one (the
cluster's start-up is timed apart); ``--scaling`` runs 1, 2 and 4 workers.

    python benchmarks/diff_throughput.py [--gib 1.0] [--rounds 3] [--dir /tmp] [--keep] [--profile]
                                         [--workers N | --scaling]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

H, K, POS = 4096, 3, 256  # hidden size, aux slots, positions per sequence
ROW_BYTES = (K * H + K * H) * 2  # aux.0..2 + aux_cat, bf16


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (round to nearest even) as uint16."""
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def build(path: str, rows: int, *, noise: float, seed: int) -> None:
    import torch

    from specdiff.tracer.store import TraceWriter
    rng = np.random.default_rng(0)  # same values on both sides...
    nrng = np.random.default_rng(seed)  # ...plus per-side noise
    nseq = -(-rows // POS)
    contract = {"hidden_size": H, "dtype": "bfloat16", "draft_num_aux": K}
    with TraceWriter(path, side="serve" if seed else "train", contract=contract, overwrite=True) as w:
        for s in range(nseq):
            w.add_sequence(np.arange(s, s + POS, dtype=np.int64) % 32000, prompt_len=POS // 4, seq_id=s)
        base = rng.standard_normal((POS, K * H), dtype=np.float32)
        for s in range(nseq):
            n = min(POS, rows - s * POS)
            x = np.roll(base, s, axis=0)[:n]
            if noise:
                x = x * (1 + noise * nrng.standard_normal((1, K * H), dtype=np.float32))
            bits = torch.from_numpy(_bf16(x).view(np.int16)).view(torch.bfloat16)
            pos = np.arange(n, dtype=np.int32)
            w.append("tokens", np.arange(s + 1, s + 1 + n, dtype=np.int64) % 32000, seq=s, pos=pos)
            for j in range(K):
                w.append(f"target.aux.{j}", bits[:, j * H:(j + 1) * H], seq=s, pos=pos)
            w.append("target.aux_cat", bits, seq=s, pos=pos)


def plain_read(paths: list[str]) -> dict:
    """Every data array of each trace, chunk by chunk via zarr: bytes read, nothing compared."""
    import zarr
    t0 = time.perf_counter()
    nbytes = 0
    for p in paths:
        tensors = zarr.open_group(store=p, mode="r")["tensors"]
        for name in sorted(tensors.group_keys()):
            arr = tensors[name]["data"]
            step = arr.chunks[0]
            for a in range(0, arr.shape[0], step):
                nbytes += arr[a:a + step].nbytes
    return {"seconds": time.perf_counter() - t0, "bytes": nbytes}


def _status_kib(field: str) -> int:
    """VmRSS / VmHWM of this process from /proc (ru_maxrss would carry the parent's peak over exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_diff(paths: list[str], profile: bool, workers: int | None = None) -> dict:
    from contextlib import nullcontext

    from specdiff.replay.diff.pipeline import diff_traces
    imports = _status_kib("VmRSS") * 1024
    t_start = time.perf_counter()
    if workers:
        from specdiff.tui.dask_blocks import dask_blocks

        where = dask_blocks(workers=workers)
    else:
        where = nullcontext(None)
    with where as runner:
        started = time.perf_counter() - t_start
        res = _timed_diff(diff_traces, paths, profile, runner)
    return {**res, "imports_rss_bytes": imports, "cluster_start_s": started}


def _timed_diff(diff_traces, paths: list[str], profile: bool, runner) -> dict:
    t0 = time.perf_counter()
    if profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
    first: list = []
    report = diff_traces(paths[0], paths[1], on_first=lambda e: first.append(time.perf_counter() - t0),
                         runner=runner)
    secs = time.perf_counter() - t0
    if profile:
        pr.disable()
        pstats.Stats(pr, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    return {"seconds": secs, "verdict": report.verdict(), "first_s": first[0] if first else None,
            "rows": {n: c.stats["rows"] for n, c in report.comparisons.items()}}


def _child(mode: str, paths: list[str], profile: bool, threads: int | None = None,
           workers: int | None = None) -> dict:
    """Run ``mode`` in a fresh interpreter; its result plus its peak RSS (this process only: Dask
    workers are processes of their own)."""
    env = dict(os.environ, **({"SPECDIFF_DIFF_THREADS": str(threads)} if threads else {}))
    out = subprocess.run([sys.executable, __file__, "--child", mode, *(["--profile"] if profile else []),
                          *(["--workers", str(workers)] if workers else []), *paths],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{mode} child failed:\n{out.stderr}")
    if out.stderr.strip():
        print(out.stderr, file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="size of EACH trace's hidden rows (GiB)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--keep", action="store_true", help="keep the traces (printed path)")
    ap.add_argument("--rounds", type=int, default=3, help="read/diff rounds, alternating (the median counts)")
    ap.add_argument("--profile", action="store_true", help="cProfile the diff (top 25 to stderr)")
    ap.add_argument("--threads", type=int, default=None, help="block threads of the diff (default: every core)")
    ap.add_argument("--workers", type=int, default=None,
                    help="also diff on a local Dask cluster of N worker processes, side by side")
    ap.add_argument("--scaling", action="store_true", help="also diff on 1, 2 and 4 Dask workers")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        res = plain_read(args.paths) if args.child == "read" else run_diff(args.paths, args.profile, args.workers)
        res["maxrss_bytes"] = _status_kib("VmHWM") * 1024
        print(json.dumps(res))
        return

    rows = int(args.gib * (1 << 30)) // ROW_BYTES
    work = tempfile.mkdtemp(dir=args.dir, prefix="specdiff-diffbench-")
    paths = [os.path.join(work, "a.trace"), os.path.join(work, "b.trace")]
    try:
        t0 = time.perf_counter()
        build(paths[0], rows, noise=0.0, seed=0)
        build(paths[1], rows, noise=1e-3, seed=1)
        print(f"built 2 traces x {rows} rows x {ROW_BYTES // 1024} KiB = {rows * ROW_BYTES / (1 << 30):.2f} GiB "
              f"of bf16 hidden rows each in {time.perf_counter() - t0:.1f} s "
              f"({sum(_du(p) for p in paths) / (1 << 30):.2f} GiB on disk)")
        _child("read", paths, False)  # warm the page cache: every timed run reads from memory
        # Rounds alternate read and diff, so a noisy neighbour costs both alike; the median round counts.
        rounds = []
        for _ in range(args.rounds):
            read = _child("read", paths, False)
            diff = _child("diff", paths, args.profile, args.threads)
            rounds.append((diff["seconds"] / read["seconds"], read, diff))
            print(f"round {len(rounds)}: read {read['seconds']:.2f} s, diff {diff['seconds']:.2f} s, "
                  f"ratio {rounds[-1][0]:.2f}x")
        ratio, read, diff = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
        print(f"plain read : {read['seconds']:7.2f} s  ({read['bytes'] / read['seconds'] / 1e6:.0f} MB/s decompressed,"
              f" peak RSS {read['maxrss_bytes'] / (1 << 20):.0f} MiB)")
        print(f"diff       : {diff['seconds']:7.2f} s  (peak RSS {diff['maxrss_bytes'] / (1 << 20):.0f} MiB, of which "
              f"{diff['imports_rss_bytes'] / (1 << 20):.0f} MiB is the process after imports)")
        print(f"ratio      : {ratio:.2f}x, the median round  (goal <= 1.3x: {'met' if ratio <= 1.3 else 'NOT met'}); peak memory "
              f"goal < 1 GiB: {'met' if diff['maxrss_bytes'] < (1 << 30) else 'NOT met'}")
        print(f"verdict    : {diff['verdict']}")
        for w in [1, 2, 4] if args.scaling else [args.workers] if args.workers else []:
            d = _child("diff", paths, False, workers=w)
            same = "same verdict" if d["verdict"] == diff["verdict"] else f"VERDICT DIFFERS: {d['verdict']}"
            print(f"dask x{w:<3d}: {d['seconds']:7.2f} s  ({d['seconds'] / diff['seconds']:.2f}x the local diff, "
                  f"{d['seconds'] / read['seconds']:.2f}x the read; cluster start {d['cluster_start_s']:.1f} s "
                  f"apart; client peak RSS {d['maxrss_bytes'] / (1 << 20):.0f} MiB; {same})")
    finally:
        if args.keep:
            print(f"traces kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


if __name__ == "__main__":
    main()
