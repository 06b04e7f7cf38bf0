"""Part 4 of the production-width recorder benchmark (benchmarks/production_recorder.py has parts 1-3):
requests dropped under sustained load, by a real writer process at a production width.

    python benchmarks/production_load.py                        # both shapes, 0.5x 1x 2x 4x, then sample 0.1
    python benchmarks/production_load.py --shape kimi-k2 --multiples 1 3 --duration 10
    python benchmarks/production_load.py --quick                # a tiny shape, 8x for 2 s (the smoke test)

What runs is the recorder as a CPU SGLang 0.5.23 server runs it, minus the model: a real
``hooks.Recorder`` (``Options(sample=...)``, ``Recorder.open``: a real ``ProcessTraceWriter``, its
writer process and its shared-memory ring of ``--ring-mb``), fed by the serving thread's real hook
calls (``production_recorder.hot_path``: ``begin``, every ``snap`` / ``capture_draft_forward``, then
``Recorder.finish``, whose ``ProcessTraceWriter.submit`` puts the record or drops its requests). The
writer process runs the real SGLang attribution (``attribution.write_capture``: logit reductions,
row attribution, ``TraceWriter`` appends), so each item costs it what a served one does at this width:
the captures are synthetic but consistent (``Schedule``: prefill captures first, valid accept
indices, positions and sequence lengths), so every row lands where a server's would.

The server's batch (``Schedule``): ``--batch`` running requests, each living ``--life`` decode
iterations (the first batch staggered, so about batch/life requests finish each tick and as many
new request ids arrive: one prefill iteration for them, then the batch's decode iteration). A tick
is those one or two iterations. Prompts are N = steps + 1 tokens (the decode tensors' rows are
reused for the prefill): real prompts add prefill rows, which lowers the token rate a writer keeps.

1. **The writer's rate**, measured first in the same run (as part 2 measures a writer thread's):
   the schedule run closed-loop (each tick's captures handled before the next tick), ticks per
   second of writer time (wall minus the serving thread's hot path), after two warm-up ticks.
2. **Load**: a fresh writer and trace per ``--multiples`` entry, ticks at that multiple of the
   writer's rate for ``--duration`` s (the serving thread never waits: behind its schedule it runs
   ticks back to back; ``achieved`` says how fast it went), then ``Recorder.close`` (the writer
   drains its ring and closes the trace). Printed: requests arrived, recorded, dropped
   (``ProcessTraceWriter.dropped_rids``; the closed trace's ``dropped_requests``, which must list
   the same), the fraction dropped, items (captured iterations) dropped of those submitted, the ring's
   high-water mark (``Ring.used`` after each submit), ``load``: items submitted a second over the items
   the writer handled a second of its busy time in that run (the calibration's rate drifts with a
   shared machine's load; this one is measured side by side), and whether every kept request is
   written whole (its trace sequence holds the tokens served, its ``target.argmax`` rows one per
   generated token) and every dropped one only a prefix (drops are of whole requests: nothing after
   the drop).
3. **Sampling**: the same at ``--sample`` (``SPECDIFF_SAMPLE``) at the multiple that dropped most.

The writer process runs at ``--writer-nice`` (``SPECDIFF_WRITER_NICE``), default 0 here, the server's
priority: a server's default (child.py ``NICE`` 19) gives the writer the CPU the server leaves, and on a
machine that other jobs load it gets almost none (its own autogroup at nice 19: one such run's close
took minutes), so its rate would measure those jobs. Calibration and load runs share the priority;
rates and drops still vary with the machine's load, and the multiples are measured side by side. The
serving thread copies with ``--threads`` torch threads, default 1: with 2 on a loaded 2-core machine
its copies into the ring took longer than the writer's work (a decode iteration's 25 MiB at the
Llama-3-8B shape: 100-390 ms, against 6-55 ms with one thread), so no multiple was reached; part 1
measures the copies' cost.

The trace's ``dropped_requests`` lists the recorded requests of a dropped item (requests.sampling_facts;
it listed the sampler's left-out ones too, 32-50 names beside 12 recorded ones at sample 0.1, until this
benchmark showed it); ``dropped`` and the fraction count the recorded ones.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from production_recorder import _batch, _tensors, hot_path, iteration

#: ``--quick``'s shape: widths small enough for a smoke test, with the structure of the real ones
TINY = {"hidden": 256, "vocab": 4096, "draft_vocab": 1024}


class Schedule:
    """A server's running batch over ticks (module doc). ``served``: rid -> the tokens the server
    committed (prompt, the prefill's token, each decode's accepted tokens), what a whole trace
    sequence holds; ``tokens``: tokens committed in all; ``arrived``: request ids started.

    Args:
        it: ``production_recorder.iteration`` tensors (batch ``batch``, ``steps`` draft steps).
        accept: tokens a request commits per decode iteration (1 <= accept <= steps + 1).
        life: decode iterations a request lives.
        prefix: request ids are ``f"{prefix}-{n}"``.
    """

    def __init__(self, it: dict, *, batch: int, steps: int, accept: int, life: int, vocab: int, prefix: str):
        B, N = batch, steps + 1
        if not 1 <= accept <= N:
            raise SystemExit(f"--accept {accept}: a chain of {steps} draft steps accepts 1..{N} tokens")
        self.it, self.B, self.N, self.a, self.life, self.V, self.prefix = it, B, N, accept, life, vocab, prefix
        self.g = torch.Generator().manual_seed(2)
        self.running: list[str] = []
        self.left: dict[str, int] = {}
        self.served: dict[str, list[int]] = {}
        self.arrived = self.tokens = 0
        j, rows = torch.arange(N), torch.arange(B)[:, None] * N
        # a chain's verify metadata (SGLang's for topk 1): accepted nodes 0..a-1 of each request's block
        self.sample_meta = (torch.full((B,), accept, dtype=torch.int64), torch.where(j < accept, rows + j, -1))
        self.verify = {**it["verify"], "retrieve_index": rows + j,
                       "retrieve_next_token": torch.where(j < N - 1, j + 1, -1).expand(B, N).contiguous(),
                       "retrieve_next_sibling": torch.full((B, N), -1, dtype=torch.int64)}

    def _ints(self, *shape) -> torch.Tensor:
        return torch.randint(0, self.V, shape, generator=self.g, dtype=torch.int64)

    def tick(self) -> list[tuple[dict, object]]:
        """(iteration tensors, engine batch) of one tick: the arrivals' prefill (when any), then the
        batch's decode; requests that lived their ``life`` leave after it."""
        out, new = [], []
        while len(self.running) < self.B:
            rid = f"{self.prefix}-{self.arrived}"
            self.left[rid] = self.arrived % self.life + 1 if self.arrived < self.B else self.life
            self.arrived += 1
            self.running.append(rid)
            new.append(rid)
        if new:
            out.append(self._prefill(new))
        out.append(self._decode())
        for rid in self.running:
            self.left[rid] -= 1
        self.running = [r for r in self.running if self.left[r] > 0]
        return out

    def _prefill(self, rids: list[str]) -> tuple[dict, object]:
        n, P, it = len(rids), self.N, self.it
        prompts, nti = self._ints(n, P).tolist(), self._ints(n)
        for rid, p, t in zip(rids, prompts, nti.tolist(), strict=True):
            self.served[rid] = [*p, t]
        self.tokens += n
        d = it["draft"][0]  # the decode's draft extend: B*N rows, sliced to the prompts' n*P
        draft = {"mode": "extend", "input_ids": d["input_ids"][:n * P], "positions": d["positions"][:n * P],
                 "hidden": d["hidden"][:n], "logits": d["logits"][:n],  # capture LAST: one row a request
                 "taps": {k: v[:n * P] for k, v in d["taps"].items()}, "fc": tuple(t[:n * P] for t in d["fc"])}
        pre = {"target_aux": it["target_aux"][:n * P], "target_logits": it["target_logits"][:n],
               "next_token_ids": nti, "draft": [draft], "select": [], "de_topk": it["de_topk"][:n], "verify": {},
               "sample": None}
        batch = _batch(rids, torch.full((n,), P, dtype=torch.int64), prompts=prompts)
        batch.forward_iter = None  # the recorder counts its own iterations
        return pre, batch

    def _decode(self) -> tuple[dict, object]:
        B, N, a = self.B, self.N, self.a
        L = torch.tensor([len(self.served[r]) - 1 for r in self.running], dtype=torch.int64)  # root at L
        predict = self._ints(B * N)
        for b, rid in enumerate(self.running):
            self.served[rid] += predict[b * N:b * N + a].tolist()
        self.tokens += B * a
        dec = {**self.it, "verify": {**self.verify, "verify_positions": (L[:, None] + torch.arange(N)).reshape(-1)},
               "sample": (predict, *self.sample_meta)}
        batch = _batch(list(self.running), L)
        batch.forward_iter = None
        return dec, batch


def open_recorder(shape: dict, path: Path, *, ring_mb: int, sample: float | None):
    """A real SGLang ``Recorder`` with its ``ProcessTraceWriter`` open on a new trace at ``path``."""
    from specdiff.tracer.engines.options import Options
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.hooks import Recorder

    rec = Recorder(Options(path=str(path), sample=sample, max_queue_mb=ring_mb),
                   SGLangAdapter("0.5.23", log=lambda m: None))
    contract = {"engine": "benchmark", "hidden_size": shape["hidden"], "draft_vocab_size": shape["draft_vocab"],
                "aux_hf_indices": [1, 2, 3], "spec_topk": 1}
    rec.adopt(contract)
    rec.open(contract, [], side={"hidden_size": shape["hidden"], "num_aux": 3, "topk": 1})
    return rec


def run(shape: dict, it: dict, args, path: Path, *, hz: float | None, seconds: float, sample: float | None,
        prefix: str) -> dict:
    """One writer process and trace: ticks at ``hz`` for ``seconds`` (``hz`` None: closed loop, each
    tick's items handled before the next tick, two warm-up ticks untimed), then close and check."""
    from specdiff.tracer.engines.writer.alive import wait_for_writers

    sched = Schedule(it, batch=args.batch, steps=args.steps, accept=args.accept, life=args.life,
                     vocab=shape["vocab"], prefix=prefix)
    rec = open_recorder(shape, path, ring_mb=args.ring_mb, sample=sample)
    w = rec.writer
    high = items = 0

    def tick() -> float:
        nonlocal high, items
        hot = 0.0
        for its, batch in sched.tick():
            s = time.perf_counter()
            items += hot_path(rec, its, batch, submit=True)
            hot += time.perf_counter() - s
            high = max(high, w.ring.used())
        while hz is None and w.ring.used() and w.active:  # closed loop: the writer takes the whole tick
            time.sleep(0.0005)
        return hot

    for _ in range(2 if hz is None else 0):  # warm-up: the writer creates its arrays
        tick()
    t0, tokens0, items0, ticks, hot = time.perf_counter(), sched.tokens, items, 0, 0.0
    while time.perf_counter() - t0 < seconds:
        if hz is not None:  # on schedule; a serving thread behind it runs ticks back to back
            time.sleep(max(0.0, t0 + ticks / hz - time.perf_counter()))
        hot += tick()
        ticks += 1
    wall = time.perf_counter() - t0
    tokens = sched.tokens - tokens0
    rec.close()  # Recorder.close: sampled / dropped lists to the writer, which drains the ring and closes
    # a close not confirmed within its 30 s: the writer goes on and closes the trace (record serve waits so)
    live = wait_for_writers(str(path), timeout_s=180.0)
    got = {"ticks": ticks, "wall_s": wall, "hot_s": hot, "tokens": tokens, "achieved_hz": ticks / wall,
           "arrived": sched.arrived, "recorded": len(rec.recorded), "dropped": len(w.dropped_rids & set(rec.recorded)),
           "dropped_items": w.dropped, "ring_high": high, "ring_bytes": w.ring.size, "writer_failed": w.failed,
           "writer_live": len(live), "items": items - items0,
           # the load the writer met: items submitted a second against the items it handled a second of its
           # busy time in this run (ring.busy_s; the ring's count includes the contract updates, ~1 a run)
           "load": (items - items0) / wall / (w.written / max(w.busy_s, 1e-9))}
    return got | check(path, sched, w.dropped_rids & set(rec.recorded))


def check(path: Path, sched: Schedule, dropped: set) -> dict:
    """Open the closed trace: its dropped list against the writer's, and each recorded request's
    sequence against what was served (module doc)."""
    from specdiff.tracer.store import open_trace

    t = open_trace(str(path))
    c = t.contract
    listed, sampled = set(c.get("dropped_requests") or ()), set(c.get("sampled_requests") or {})
    seqs = {s.rid: s for s in t.sequences}
    rows = Counter(t.keys("target.argmax", columns=("seq",))["seq"].tolist()) if "target.argmax" in t.names else {}
    kept = sampled - listed
    whole = sum(rid in seqs and seqs[rid].tokens.tolist() == sched.served[rid]
                and rows.get(seqs[rid].id, 0) == len(sched.served[rid]) - seqs[rid].prompt_len for rid in kept)
    cut = sum(rid in seqs and sched.served[rid][:len(seqs[rid].tokens)] != seqs[rid].tokens.tolist() for rid in listed)
    return {"closed": t.closed, "trace_dropped": len(listed), "lists_match": listed == dropped, "kept": len(kept),
            "kept_whole": whole, "dropped_not_prefix": cut, "sequences": len(t.sequences)}


def report(name: str, shape: dict, args) -> list[dict]:
    """Calibrate, then run every multiple and the sampled run, for one shape; the rows printed."""
    it = iteration(shape, batch=args.batch, steps=args.steps)
    staged = sum(t.nbytes for t in _tensors(it))
    if 2 * staged > args.ring_mb << 20:
        raise SystemExit(f"a tick stages up to {2 * staged / 2**20:.0f} MiB, more than the {args.ring_mb} MiB ring: "
                         "raise --ring-mb (SPECDIFF_MAX_QUEUE_MB)")
    tmp = Path(tempfile.mkdtemp(prefix="specdiff-prodload-", dir=args.dir))
    rows: list[dict] = []
    try:
        cal = run(shape, it, args, tmp / "calibrate.trace", hz=None, seconds=args.calibrate_s, sample=None,
                  prefix=f"{name}-cal")
        hz = cal["ticks"] / max(cal["wall_s"] - cal["hot_s"], 1e-9)
        tpt = cal["tokens"] / max(cal["ticks"], 1)
        print(f"\n== {name}: H {shape['hidden']}, vocab {shape['vocab']}, draft vocab {shape['draft_vocab']}; batch "
              f"{args.batch}, {args.steps} draft steps, {args.accept} tokens a request an iteration, requests live "
              f"{args.life} decode iterations (prompts {args.steps + 1} tokens); ring {args.ring_mb} MiB")
        print(f"writer process (SGLang write_capture), closed loop: {hz:.2f} ticks/s = {hz * tpt:.0f} tokens/s "
              f"({cal['ticks']} ticks, {staged / 2**20:.1f} MiB staged a decode iteration; serving thread "
              f"{cal['hot_s'] / max(cal['ticks'], 1) * 1e3:.1f} ms a tick); load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs; writer nice {args.writer_nice}")
        print(f"  {'multiple':>8} {'sample':>6} {'ticks/s':>7} {'achieved':>8} {'load':>6} {'requests':>8} {'recorded':>8} "
              f"{'dropped':>7} {'fraction':>8} {'items':>9} {'ring high':>13} {'kept whole':>11} {'trace lists':>16}")
        for m in args.multiples:
            rows.append(_load(name, shape, it, args, tmp, hz, tpt, m, None, len(rows)))
        if args.sample < 1:  # sampled, at the multiple that dropped most
            worst = max(rows, key=lambda x: (x["fraction"], x["multiple"]))
            rows.append(_load(name, shape, it, args, tmp, hz, tpt, worst["multiple"], args.sample, len(rows)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _load(name, shape, it, args, tmp: Path, hz: float, tpt: float, m: float, sample, n: int) -> dict:
    """One load run at ``m`` times the writer's ``hz`` (``tpt`` tokens a tick), printed as a table row."""
    r = run(shape, it, args, tmp / f"load-{n}.trace", hz=m * hz, seconds=args.duration, sample=sample,
            prefix=f"{name}-{n}")
    r |= {"shape": name, "multiple": m, "sample": sample, "writer_hz": hz, "writer_tps": hz * tpt,
          "fraction": r["dropped"] / max(r["recorded"], 1)}
    print(f"  {m:7.2f}x {sample or 1.0:6.2f} {m * hz:7.2f} {r['achieved_hz'] / hz:7.2f}x {r['load']:5.2f}x {r['arrived']:8d} "
          f"{r['recorded']:8d} {r['dropped']:7d} {r['fraction']:8.3f} {r['dropped_items']:4d}/{r['items']:<4d} "
          f"{r['ring_high'] / 2**20:6.0f} MiB {r['ring_high'] / r['ring_bytes']:4.0%} "
          f"{r['kept_whole']:5d}/{r['kept']:<5d} {r['trace_dropped']:5d}, {'same' if r['lists_match'] else 'OTHER':>5}"
          + ("" if r["closed"] else "  trace NOT closed") + ("  WRITER FAILED" if r["writer_failed"] else "")
          + (f"  {r['dropped_not_prefix']} dropped requests not a prefix" if r["dropped_not_prefix"] else ""),
          flush=True)
    return r


def main(argv=None) -> int:
    from specdiff.demo_models.production import SHAPES

    shapes = {**SHAPES, "tiny": TINY}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[*shapes, "both"], default="both", help="both: llama3-8b and kimi-k2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--accept", type=int, default=3, help="tokens a request commits an iteration")
    ap.add_argument("--life", type=int, default=8, help="decode iterations a request lives")
    ap.add_argument("--multiples", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0],
                    help="tick rates, as multiples of the writer's measured rate")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of load per multiple")
    ap.add_argument("--calibrate-s", type=float, default=4.0, help="seconds of the closed-loop writer measurement")
    ap.add_argument("--sample", type=float, default=0.1, help="SPECDIFF_SAMPLE of the last run (1: no such run)")
    ap.add_argument("--ring-mb", type=int, default=256, help="the ring's size (SPECDIFF_MAX_QUEUE_MB, default 256)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the serving thread's copies (module doc)")
    ap.add_argument("--writer-nice", type=int, default=int(os.environ.get("SPECDIFF_WRITER_NICE") or 0),
                    help="the writer process's niceness (SPECDIFF_WRITER_NICE; default 0: module doc)")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None, help="also write every run's numbers here")
    ap.add_argument("--quick", action="store_true",
                    help="the smoke test's run: the tiny shape, 8x for 2 s after 1.5 s of calibration, a 2 MiB ring")
    args = ap.parse_args(argv)
    if args.quick:
        args.shape, args.multiples, args.duration, args.calibrate_s, args.ring_mb = "tiny", [8.0], 2.0, 1.5, 2
    torch.set_num_threads(args.threads)
    os.environ["SPECDIFF_WRITER_NICE"] = str(args.writer_nice)  # read by each writer process at its start
    rows = []
    for name in (("llama3-8b", "kimi-k2") if args.shape == "both" else [args.shape]):
        rows += report(name, shapes[name], args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
