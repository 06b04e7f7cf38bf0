"""Store throughput: bf16/fp16 hidden-state rows through the trace store vs plain numpy, side by side.

Rows are aux hidden states (H=4096, 3 aux layers -> target.aux_cat [row, 12288]), appended in
batches of 64 rows as a recorder would. Each round writes the same rows with ``numpy`` (an
``.npy`` written through ``np.lib.format.open_memmap``, what ``numpy.save`` writes, then synced)
and through ``TraceWriter`` (zarr chunks + the journal and its spill files, then synced), and
reads both back cold; the order alternates between rounds so a busy disk or CPU costs both paths
alike. Prints each round's ratios and their median, and the CPU seconds each write spent in this
process (all threads; the kernel's writeback threads are not counted, the same for both): a
ratio read on a box that others load is noisy, the CPU cost much less so.
Goals: store write >= 0.8x numpy (the trace's bytes reach the disk once: the journal keeps a
payload only until its chunk is committed), read >= 0.8x.

    python benchmarks/store_throughput.py [--gib 1.0] [--rounds 3] [--dir /tmp] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch

from specdiff.tracer.store import TraceWriter, open_trace

H, K, BATCH = 4096, 3, 64


def _drop_caches() -> None:
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null")


def _timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn(*args)``."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0, time.process_time() - c0


def _numpy_write(path: str, batches: list, rows: int) -> None:
    plain = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(rows, K * H))
    for i in range(rows // BATCH):
        plain[i * BATCH:(i + 1) * BATCH] = batches[i % len(batches)].view(torch.int16).numpy().view(np.uint16)
    plain.flush()
    del plain
    os.sync()


def _store_write(path: str, batches: list, rows: int) -> None:
    with TraceWriter(path, side="serve") as w:
        for i in range(rows // BATCH):
            w.append("target.aux_cat", batches[i % len(batches)], seq=i, pos=np.arange(BATCH))
    os.sync()


def _numpy_read(path: str, rows: int) -> float:
    _drop_caches()
    t0 = time.perf_counter()
    arr = np.load(path, mmap_mode="r")
    for start in range(0, rows, 4096):
        np.asarray(arr[start:start + 4096]).copy()
    return time.perf_counter() - t0


def _store_read(path: str) -> float:
    _drop_caches()
    t0 = time.perf_counter()
    trace = open_trace(path)
    for a, b in trace.chunks("target.aux_cat"):
        trace.read_torch("target.aux_cat", a, b)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    row_bytes = K * H * 2
    rows = int(args.gib * (1 << 30)) // row_bytes // BATCH * BATCH
    mb = rows * row_bytes / 1e6
    gen = torch.Generator().manual_seed(0)
    # Realistic hidden states: normal values in the compute dtype (compress poorly, like real ones).
    batches = [torch.randn(BATCH, K * H, generator=gen).to(dtype) for _ in range(16)]
    print(f"{rows} rows x {K * H} {args.dtype} = {mb:.0f} MB per write; {args.rounds} rounds, order alternating")
    write_ratios, read_ratios = [], []
    for r in range(args.rounds):
        work = tempfile.mkdtemp(dir=args.dir, prefix="specdiff-bench-")
        try:
            npy, trace_path = os.path.join(work, "plain.npy"), os.path.join(work, "trace")
            if r % 2 == 0:
                (t_np_w, c_np), (t_st_w, c_st) = _timed(_numpy_write, npy, batches, rows), \
                    _timed(_store_write, trace_path, batches, rows)
                t_np_r, t_st_r = _numpy_read(npy, rows), _store_read(trace_path)
            else:
                t_st_w, c_st = _timed(_store_write, trace_path, batches, rows)
                t_np_w, c_np = _timed(_numpy_write, npy, batches, rows)
                t_st_r, t_np_r = _store_read(trace_path), _numpy_read(npy, rows)
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(trace_path) for f in fs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_ratios.append(t_np_w / t_st_w)
        read_ratios.append(t_np_r / t_st_r)
        print(f"round {r}: write numpy {mb / t_np_w:6.0f} MB/s store {mb / t_st_w:6.0f} MB/s ratio {write_ratios[-1]:.2f} | "
              f"read numpy {mb / t_np_r:6.0f} MB/s store {mb / t_st_r:6.0f} MB/s ratio {read_ratios[-1]:.2f} | "
              f"trace on disk {size / 1e6:.0f} MB | write CPU numpy {c_np:.2f} s store {c_st:.2f} s | "
              f"load {os.getloadavg()[0]:.1f}")
    print(f"median write ratio {statistics.median(write_ratios):.2f} (goal >= 0.8)   "
          f"median read ratio {statistics.median(read_ratios):.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
