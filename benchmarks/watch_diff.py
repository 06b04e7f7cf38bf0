"""A watch's per-request diff at a small and a large trace, side by side in one run.

``specdiff watch`` diffs each finished request of a live serving trace against its replay in the
watch's own training trace (replay/watch/watcher.py ``diff_request``); both traces grow with every
request. This writes a serving-like trace (requests decoded ``--batch`` at a time, so a request's
rows interleave with its neighbours'; per decode step its sequence entry re-journalled and one row
of each of a few tensors appended, as the recorders do) and a training trace like the watch's (a
batch of requests at a time, one append per tensor and request), once with ``--small`` and once
with ``--large`` requests, both left unclosed (a live server) and opened by ``TraceFollower`` as
the watch opens them. Then, in ``--rounds`` alternating rounds, it times the diff of the last
``--per-round`` requests of each size, two ways:

- **request rows**: ``diff_request`` as the watch runs it (each side restricted to the request's rows);
- **whole-trace keys**: the same diff on the traces restricted to the request's sequences only
  (what the watch did before: row matching read every row key of both traces).

Prints the median seconds per request of each, and the ratios large / small (1.0: the cost of a
request does not grow with the trace) and whole / rows. Both ways must give the same verdict.

    python benchmarks/watch_diff.py [--small 50] [--large 1500] [--steps 24] [--rounds 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from specdiff.replay.diff.pipeline import diff_opened
from specdiff.replay.diff.types import Pair
from specdiff.replay.watch.watcher import diff_request
from specdiff.tracer.schema import aux_name
from specdiff.tracer.store import TraceFollower, TraceWriter

H = 256  # hidden size (bf16 rows); the request's rows are few, the point is what else is read
PROMPT = 16
CONTRACT = {"hidden_size": H, "dtype": "bfloat16"}
TABLE = torch.randn(97, H, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


def _rows(rid: int, pos: np.ndarray) -> torch.Tensor:
    """The hidden rows of request ``rid`` at positions ``pos`` (the same on both sides: no divergence)."""
    return TABLE[torch.as_tensor((rid * 7 + pos) % 97)]


def _write(root: str, requests: int, steps: int, batch: int) -> tuple[str, str, TraceWriter, TraceWriter]:
    """Serving and training traces of ``requests`` requests, left open; returns their paths and writers."""
    serve, train = f"{root}/serve.trace", f"{root}/train.trace"
    ws = TraceWriter(serve, side="serve", contract=CONTRACT)
    wt = TraceWriter(train, side="train", contract=CONTRACT)
    for start in range(0, requests, batch):
        group = range(start, min(start + batch, requests))
        toks = {r: list(range(r, r + PROMPT)) for r in group}
        sid = {r: ws.add_sequence(toks[r], prompt_len=PROMPT, rid=f"r{r}") for r in group}
        for _ in range(steps):  # one decode step of the whole batch
            for r in group:
                toks[r].append((r * 31 + len(toks[r])) % 1000)
                ws.add_sequence(toks[r], prompt_len=PROMPT, rid=f"r{r}", seq_id=sid[r])
                pos = np.array([len(toks[r]) - 2])
                for j in range(3):
                    ws.append(aux_name(j), _rows(r, pos), seq=sid[r], pos=pos)
                ws.append("tokens", torch.tensor([toks[r][-1]], dtype=torch.int64), seq=sid[r], pos=pos)
        for r in group:  # the watch replays the finished batch into its training trace
            tid = wt.add_sequence(toks[r], prompt_len=PROMPT, rid=f"r{r}")
            pos = np.arange(len(toks[r]) - 1)
            for j in range(3):
                wt.append(aux_name(j), _rows(r, pos), seq=tid, pos=pos)
            wt.append("tokens", torch.tensor(toks[r][1:], dtype=torch.int64), seq=tid, pos=pos)
        ws.flush()
        wt.flush()
    return serve, train, ws, wt


def _whole_keys(trace, seq: int):
    """``trace`` listing only sequence ``seq``, every row kept (the watch's diff before)."""
    view = copy.copy(trace)
    view.sequences = [s for s in trace.sequences if int(s.id) == seq]
    return view


class Size:
    """One trace pair of ``requests`` requests, followed as the watch follows them."""

    def __init__(self, root: str, requests: int, steps: int, batch: int, per_round: int):
        t0 = time.perf_counter()
        self.requests = requests
        self.serve, self.train, self.ws, self.wt = _write(root, requests, steps, batch)
        self.write_s = time.perf_counter() - t0
        self.fs, self.ft = TraceFollower(self.serve), TraceFollower(self.train)
        self.s, self.t = self.fs.poll(), self.ft.poll()
        self.s, self.t = self.fs.poll(), self.ft.poll()  # a follow poll, as the watch's later ones are
        by_rid = {s.rid: int(s.id) for s in self.t.sequences}
        last = sorted(self.s.sequences, key=lambda s: s.id)[-per_round:]
        self.pairs = [(by_rid[s.rid], int(s.id)) for s in last]
        self.rows = self.s.rows(aux_name(0)) + self.t.rows(aux_name(0))

    def time(self, way: str) -> tuple[float, list[str]]:
        """Seconds per request (mean over this round's requests) and their verdicts."""
        verdicts = []
        t0 = time.perf_counter()
        for tid, sid in self.pairs:
            if way == "rows":
                report = diff_request(self.t, self.s, tid, sid)
            else:
                report = diff_opened(Pair(_whole_keys(self.t, tid), _whole_keys(self.s, sid)), narrow=False)
            verdicts.append(report.verdict())
        return (time.perf_counter() - t0) / len(self.pairs), verdicts

    def close(self) -> None:
        self.ws.close()
        self.wt.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=50)
    ap.add_argument("--large", type=int, default=1500)
    ap.add_argument("--steps", type=int, default=24, help="decode steps per request")
    ap.add_argument("--batch", type=int, default=8, help="requests decoded together")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=3, help="requests diffed per size and round")
    ap.add_argument("--ways", default="rows,whole", help="rows, whole or both (comma-separated)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    ways = args.ways.split(",")
    root = tempfile.mkdtemp(dir=args.dir, prefix="specdiff-watch-diff-")
    try:
        sizes = [Size(f"{root}/{n}", n, args.steps, args.batch, args.per_round) for n in (args.small, args.large)]
        for s in sizes:
            print(f"{s.requests} requests: {s.rows} rows of {aux_name(0)} on both sides, written in {s.write_s:.1f} s")
        times = {(s.requests, w): [] for s in sizes for w in ways}
        verdicts, per_way = {}, {}
        for r in range(args.rounds):
            order = [(s, w) for s in sizes for w in ways]
            for s, w in order if r % 2 == 0 else order[::-1]:
                t, v = s.time(w)
                times[(s.requests, w)].append(t)
                verdicts.setdefault(s.requests, set()).update(v)
                per_way[(s.requests, w)] = v  # each request's verdict, in the pairs' order
        for s in sizes:  # the two ways must agree request by request
            got = {w: per_way[(s.requests, w)] for w in ways}
            if len({tuple(v) for v in got.values()}) > 1:
                print(f"error: at {s.requests} requests the ways' verdicts differ: {got}", file=sys.stderr)
                return 1
        print(f"{'way':>7} {'requests':>9} {'median s/request':>17} {'min':>8}")
        med = {k: statistics.median(v) for k, v in times.items()}
        for (n, w), v in times.items():
            print(f"{w:>7} {n:9d} {med[(n, w)]:17.4f} {min(v):8.4f}")
        for w in ways:
            print(f"{w}: large / small = {med[(args.large, w)] / med[(args.small, w)]:.2f}x")
        if "rows" in ways and "whole" in ways:
            for s in sizes:
                print(f"{s.requests} requests: whole / rows = {med[(s.requests, 'whole')] / med[(s.requests, 'rows')]:.2f}x")
        print("verdicts:", {n: sorted(v) for n, v in verdicts.items()})
        for s in sizes:
            s.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
