"""A watch's poll of a live serving trace: a full ``open_trace`` vs ``TraceFollower.poll``, side by side.

``specdiff watch`` polls the serving trace a traced server writes about once a second for as long as
the server runs. The trace grows by a request at a time; this writes a serving-like trace (per
request: its sequence entry re-journalled as it grows, one record per decode step for each of a
few tensors, as the recorders do) without closing it, and after each batch of new requests times,
in alternating order, a full ``open_trace`` and a ``TraceFollower.poll`` of the same trace. A full
open decodes the whole journal each time, so its cost grows with the trace; the follower decodes
only what is new. Prints both times per batch and the ratio (follower / full open).

    python benchmarks/watch_poll.py [--requests 2000] [--batch 250] [--steps 32] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np
import torch

from specdiff.tracer.store import TraceFollower, TraceWriter, open_trace

H = 256  # tiny rows: the poll's cost is the journal, not the tensor bytes


def _request(w: TraceWriter, rid: int, steps: int) -> None:
    tokens = list(range(16))
    sid = w.add_sequence(tokens, prompt_len=16, rid=f"r{rid}")
    for step in range(steps):
        tokens.append(step)
        w.add_sequence(tokens, prompt_len=16, rid=f"r{rid}", seq_id=sid)
        pos = np.arange(len(tokens) - 1, len(tokens))
        for name in ("target.aux.0", "draft.hidden_out", "draft.fc_in"):
            w.append(name, torch.zeros(1, H, dtype=torch.bfloat16), seq=sid, pos=pos)
        w.append("draft.topk", torch.zeros(1, 4, dtype=torch.int32), seq=sid, pos=pos)


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=250, help="requests written between two polls")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per request")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(dir=args.dir, prefix="specdiff-watch-poll-")
    try:
        path = f"{root}/serve.trace"
        w = TraceWriter(path, side="serve", contract={"engine": "sglang"})
        follow = TraceFollower(path)
        follow.poll()
        print(f"{'requests':>9} {'records':>9} {'full open s':>12} {'follow s':>9} {'ratio':>7}")
        for start in range(0, args.requests, args.batch):
            for rid in range(start, min(start + args.batch, args.requests)):
                _request(w, rid, args.steps)
            w.flush()
            order = (0, 1) if (start // args.batch) % 2 == 0 else (1, 0)
            times = {}
            for which in order:
                times[which], trace = _timed(lambda which=which: open_trace(path) if which == 0 else follow.poll())
                assert len(trace.sequences) == min(start + args.batch, args.requests)
            print(f"{len(trace.sequences):9d} {trace.records:9d} {times[0]:12.3f} {times[1]:9.3f} "
                  f"{times[1] / times[0]:7.3f}")
        print(f"full opens by the follower: {follow.full_opens} (the first poll)")
        w.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
