"""Store throughput: 1 GiB of bf16/fp16 hidden-state rows through the trace store vs numpy.save/load.

Rows are aux hidden states (H=4096, 3 aux layers -> target.aux_cat [row, 12288]), appended in
batches of 64 rows as a recorder would. Prints MB/s for both paths and the ratios.
Goal (issue 2): store write >= 0.5x and read >= 0.8x of plain numpy on the same disk.

    python benchmarks/store_throughput.py [--gib 1.0] [--dir /tmp] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import torch

from specdiff.tracer.store import TraceWriter, open_trace

H, K, BATCH = 4096, 3, 64


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    row_bytes = K * H * 2
    rows = int(args.gib * (1 << 30)) // row_bytes // BATCH * BATCH
    mb = rows * row_bytes / 1e6
    work = tempfile.mkdtemp(dir=args.dir, prefix="specdiff-bench-")
    gen = torch.Generator().manual_seed(0)
    # Realistic hidden states: normal values in the compute dtype (compress poorly, like real ones).
    batches = [torch.randn(BATCH, K * H, generator=gen).to(dtype) for _ in range(16)]
    try:
        npy = os.path.join(work, "plain.npy")
        t0 = time.perf_counter()
        plain = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint16, shape=(rows, K * H))
        for i in range(rows // BATCH):
            plain[i * BATCH:(i + 1) * BATCH] = batches[i % 16].view(torch.int16).numpy().view(np.uint16)
        plain.flush()
        del plain
        os.sync()
        t_np_write = time.perf_counter() - t0

        trace_path = os.path.join(work, "trace")
        t0 = time.perf_counter()
        with TraceWriter(trace_path, side="serve") as w:
            for i in range(rows // BATCH):
                w.append("target.aux_cat", batches[i % 16], seq=i, pos=np.arange(BATCH))
        os.sync()
        t_store_write = time.perf_counter() - t0

        os.system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null")
        t0 = time.perf_counter()
        arr = np.load(npy, mmap_mode="r")
        total = 0.0
        for start in range(0, rows, 4096):
            total += float(arr[start:start + 4096, 0].sum())  # touch every row block
            np.asarray(arr[start:start + 4096]).copy()
        t_np_read = time.perf_counter() - t0

        os.system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null")
        t0 = time.perf_counter()
        trace = open_trace(trace_path)
        for a, b in trace.chunks("target.aux_cat"):
            trace.read_torch("target.aux_cat", a, b)
        t_store_read = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(trace_path) for f in fs)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{rows} rows x {K * H} {args.dtype} = {mb:.0f} MB; trace on disk {size / 1e6:.0f} MB "
          f"(zarr + write-ahead journal)")
    print(f"write  numpy {mb / t_np_write:8.0f} MB/s   store {mb / t_store_write:8.0f} MB/s   "
          f"ratio {t_np_write / t_store_write:.2f} (goal >= 0.5)")
    print(f"read   numpy {mb / t_np_read:8.0f} MB/s   store {mb / t_store_read:8.0f} MB/s   "
          f"ratio {t_np_read / t_store_read:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
