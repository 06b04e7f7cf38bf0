"""The serving recorder at a production width: the serving thread's capture cost per token (recorded vs
not recorded, side by side), the writer's MB/s against the bytes a token produces, and trace bytes per
1,000 tokens per capture level and sampling fraction.

    python benchmarks/production_recorder.py                       # both shapes, batch 8
    python benchmarks/production_recorder.py --shape kimi-k2 --batch 32 --iters 40

No model runs: the tensors are random, of the widths and dtypes a CPU SGLang 0.5.23 decode iteration
hands the hooks (tracer/engines/sglang/plugin.py) at the shape (``demo_models.production.SHAPES``:
Llama-3-8B H 4096, vocab 128,256; Kimi-K2 H 7168, vocab 163,840; draft vocab 32,000), for ``--batch``
requests, ``--steps`` draft steps, chain (topk 1, N = steps + 1 verify tokens):
target aux [B*N, 3H] bf16, target logits [B*N, V] fp32, the draft extend's forward over B*N rows and
``steps - 1`` draft decode forwards over B rows (input ids, positions, fc in/out, hidden, logits
[rows, Vd] fp32, the midlayer taps hidden_in / attn_in [2H] / hidden_out), the tree and verify results.

1. **Serving thread** (the real ``hooks.Recorder``; its ``snap`` copies through the real
   ``ProcessTraceWriter.stage`` into a real shared-memory ``Ring``, no writer process started):
   per iteration, in alternating order, (a) a batch of recorded requests: ``begin`` (sampler, seq_lens),
   every ``snap`` / ``capture_draft_forward`` / ``target_logits.stage`` the hooks make, each a copy into
   the ring (the record is abandoned, not put: the writer process's work is part 2); (b) the same
   batch with requests the sampler leaves out (``SPECDIFF_SAMPLE``): ``begin`` returns None and every
   hook returns at once; (c) one sampled request among ``batch - 1`` left out: only its rows are
   selected on the device and copied (tracer/engines/sglang/row_select.py). Prints microseconds per
   iteration and per token (``--accept`` tokens a request an iteration), the ratios, and the bytes
   copied per iteration with 1 of B recorded against all B, side by side in one run.
2. **Writer** (one thread, as the writer process): the reductions of the staged logits
   (``target_logits.top``, ``attribution.reduce_logits``) and the appends of a token's rows to a real
   ``TraceWriter`` (zarr store, chunks + journal, synced at close), against a plain file write of the
   same bytes: MB/s, on-disk bytes, and the token rate the writer sustains.
3. **Trace bytes per 1,000 tokens**: the rows per token of each tensor of a real serving trace
   (``--trace``, default the shipped seed pair's CPU SGLang trace: its accept lengths and prefill
   share), each scaled to the shape's widths by the schema's dims (tracer/schema.py: hidden, aux_hidden
   = 3H, draft_hidden, attn_in = 2H, draft_vocab); capture ``full`` adds ``draft.logits`` [Vd] fp32 at
   every ``draft.logsumexp`` row; a sampling fraction keeps whole requests (``RequestSampler`` over
   100,000 request ids: the fraction it really keeps). Raw bytes: the store keeps float rows
   uncompressed, so on disk it is the same plus key columns and one padded chunk a tensor per trace.
4. **Requests dropped under sustained load**: benchmarks/production_load.py (a real writer process and
   ring fed by ``hot_path(..., submit=True)`` at multiples of the writer's measured rate).

Projection to the full model (61 layers Kimi-K2, 32 Llama-3-8B): none of these depends on the layer
count (the recorder reads three aux layers and the draft whatever the depth); only the server's time
per token grows with it. ``--server-tps`` (default 5,000 tokens/s, a GPU server's rate) puts
each cost beside a server's: overhead = serving-thread seconds per token x rate; disk = bytes per token
x rate. A GPU server's hot path differs (top-k on the device, pinned copies): not measured here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SEED_TRACE = ROOT / "traces" / "examples" / "seed" / "serve.trace"


# ---- one decode iteration's tensors ----------------------------------------------------------
def iteration(shape: dict, *, batch: int, steps: int) -> dict:
    """The tensors of one CPU decode iteration (chain, N = steps + 1) at ``shape``'s widths."""
    B, N, H, V, Vd = batch, steps + 1, shape["hidden"], shape["vocab"], shape["draft_vocab"]
    g = torch.Generator().manual_seed(0)

    def f(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dtype)

    def i(*s, hi=1000):
        return torch.randint(0, hi, s, generator=g, dtype=torch.int64)

    def forward(rows, fc):
        d = {"input_ids": i(rows, hi=V), "positions": i(rows), "hidden": f(rows, H), "logits": f(rows, Vd, dtype=torch.float32),
             "taps": {"draft.hidden_in": f(rows, H), "draft.attn_in": f(rows, 2 * H), "draft.hidden_out": f(rows, H),
                      "draft.positions": i(rows)}}
        if fc:
            d["fc"] = (f(rows, 3 * H), f(rows, H))
        return d

    return {"seq_lens": i(B), "target_aux": f(B * N, 3 * H), "target_logits": f(B * N, V, dtype=torch.float32),
            "draft": [forward(B * N, True)] + [forward(B, False) for _ in range(steps - 1)],
            "select": [i(B, 1, hi=Vd) for _ in range(steps)], "de_topk": i(B, 1, hi=Vd),
            "verify": {"draft_token": i(B * N, hi=V), "verify_positions": i(B * N), "retrieve_index": i(B, N),
                       "retrieve_next_token": i(B, N), "retrieve_next_sibling": i(B, N)},
            "sample": (i(B * N, hi=V), i(B, hi=N), i(B, N))}


def _batch(rids: list[str], seq_lens, prompts: list | None = None) -> SimpleNamespace:
    """SGLang's ``ScheduleBatch`` as the hooks read it: a decode of ``rids``, or with ``prompts`` (one
    token list a request) their prefill, no cached prefix."""
    prefill = prompts is not None
    reqs = [SimpleNamespace(rid=r, origin_input_ids=prompts[n] if prefill else [1, 2, 3], sampling_params=None,
                            cached_tokens=0) for n, r in enumerate(rids)]
    return SimpleNamespace(reqs=reqs, forward_iter=0, forward_mode=SimpleNamespace(is_extend=lambda: prefill),
                           prefix_lens=[0] * len(rids) if prefill else None,
                           extend_lens=[len(p) for p in prompts] if prefill else None, seq_lens=seq_lens)


def hot_path(rec, it: dict, batch, *, submit: bool = False, sizes: list | None = None) -> bool:
    """What the SGLang hooks do on the serving thread in one iteration (plugin.py's hook bodies, on
    stand-in engine objects: ``batch`` is a ``_batch``): a decode (``iteration``), or a prefill (``it``
    with ``next_token_ids``, its draft forward's ``mode`` "extend", ``sample`` None: production_load.py).
    ``submit``: the capture goes to the writer (``Recorder.finish``, as plugin.py ``_around_iteration``
    ends an iteration), else its staging is abandoned (part 1). True when it was recorded; ``sizes``
    gets the bytes the iteration copied to the host (``IterCapture.nbytes``)."""
    from specdiff.tracer.engines import target_logits

    cap = rec.begin(batch)
    if cap is None:  # every hook returns at ``_cur()``
        return False
    cap.t["target_aux"] = rec.snap(it["target_aux"])
    target_logits.stage(rec, cap.t, it["target_logits"], rec.opts.logits_topk)
    if "next_token_ids" in it:  # a prefill's sampled tokens (plugin.py _after_target_forward)
        cap.t["next_token_ids"] = rec.snap(it["next_token_ids"])
    for k, d in enumerate(it["draft"]):
        rec.fc_sink = [(rec.snap(d["fc"][0]), rec.snap(d["fc"][1]))] if "fc" in d else []
        stages = {name: rec.snap(t) for name, t in d["taps"].items()}  # draft_stages.py taps
        fb = SimpleNamespace(input_ids=d["input_ids"], positions=d["positions"], forward_mode=None)
        lo = SimpleNamespace(hidden_states=d["hidden"], next_token_logits=d["logits"])
        df = rec.capture_draft_forward(d.get("mode") or ("extend_v2" if k == 0 else "decode"), fb, lo)
        df.stages = stages
        cap.draft.append(df)
        rec.fc_sink = None
    cap.t["de_topk_index"] = rec.snap(it["de_topk"])
    for k, t in enumerate(it["select"]):
        cap.select.append((k, rec.snap(t)))
    for key, t in it["verify"].items():
        cap.t[key] = rec.snap(t)
    for key, t in zip(("predict", "accept_lens", "accept_index"), it["sample"] or (), strict=False):
        cap.t[key] = rec.snap(t)
    rec.cur = None
    if sizes is not None:
        sizes.append(cap.nbytes())
    if submit:
        rec.finish(cap, None)  # ProcessTraceWriter.submit: the staged record is put, or its requests dropped
    else:
        rec.writer.ring.abandon_stage()  # part 2 measures the writer's side
    return True


class RingStager:
    """The serving thread's side of the writer process (``ProcessTraceWriter.stage``, the real method,
    over a real shared-memory ``Ring``) without the process: what ``Recorder.snap`` calls on a CPU
    server. No rows are put (part 2 measures the writer's work), so no writer process is started."""

    stage = None  # set below: ProcessTraceWriter.stage itself

    def __init__(self, ring_mb: int, where: Path):
        from specdiff.tracer.engines.writer.ring import Ring

        path = str(where / "ring")
        self.ring = Ring(path, ring_mb << 20, create=True)
        os.unlink(path)
        self._stage_ok, self._publisher, self._closed = True, None, False
        self.dropped_rids: set = set()
        self.active = True


def measure_hot_path(shape: dict, *, batch: int, steps: int, iters: int, ring_mb: int, tmp: Path) -> dict:
    """Median seconds per iteration, recorded and not, interleaved; staged bytes per iteration."""
    from specdiff.tracer.engines.options import Options
    from specdiff.tracer.engines.requests import sample_unit
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.hooks import Recorder
    from specdiff.tracer.engines.writer.process import ProcessTraceWriter

    RingStager.stage = ProcessTraceWriter.stage
    it = iteration(shape, batch=batch, steps=steps)
    rec = Recorder(Options(path=str(tmp / "hot.trace"), sample=0.5), SGLangAdapter("0.5.23", log=lambda m: None))
    rec.writer = RingStager(ring_mb, tmp)
    rec.hidden_size, rec.num_aux, rec.topk = shape["hidden"], 3, 1
    pool = [f"req-{n}" for n in range(20000)]
    kept = [r for r in pool if sample_unit(r) < 0.5]
    left = [r for r in pool if sample_unit(r) >= 0.5]
    # the hidden states alone: the logits left out (None: the hooks skip them), the bytes a GPU server
    # also copies to the host (it reduces the logits on the device: only top-k values and ids travel)
    no_logits = {**it, "target_logits": None, "draft": [{**d, "logits": None} for d in it["draft"]]}
    times = {"recorded": [], "not recorded": [], "recorded, no logits": [], "1 recorded": []}
    sizes = {m: [] for m in times}
    staged = sum(t.nbytes for t in _tensors(it))
    if staged > rec.writer.ring.cap:
        raise SystemExit(f"an iteration stages {staged / 2**20:.0f} MiB, more than the {ring_mb} MiB ring: "
                         "raise --ring-mb (SPECDIFF_MAX_QUEUE_MB)")
    modes = list(times)
    for n in range(iters + 2):
        for mode in modes[n % 4:] + modes[:n % 4]:  # each mode first in turn
            # the same requests every iteration (decode steps of running requests: each decided at its first);
            # "1 recorded": one sampled request among batch - 1 the sampler leaves out (row_select.py)
            rids = (left[:batch] if mode == "not recorded" else kept[batch:2 * batch] if mode == "recorded"
                    else [kept[2 * batch], *left[batch:2 * batch - 1]] if mode == "1 recorded" else kept[:batch])
            engine_batch = _batch(rids, it["seq_lens"])  # the engine's objects: made before the clock starts
            t0 = time.perf_counter()
            got = hot_path(rec, no_logits if mode == "recorded, no logits" else it, engine_batch, sizes=sizes[mode])
            dt = time.perf_counter() - t0
            if got != (mode != "not recorded"):
                raise SystemExit(f"the {mode} iteration was {'' if got else 'not '}recorded")
            if n >= 2:  # two warm-up rounds
                times[mode].append(dt)
    hidden = staged - it["target_logits"].nbytes - sum(d["logits"].nbytes for d in it["draft"])
    return {m: statistics.median(v) for m, v in times.items()} | {
        "staged_bytes": staged, "hidden_bytes": hidden, "all_bytes": statistics.median(sizes["recorded"]),
        "one_bytes": statistics.median(sizes["1 recorded"])}


def _tensors(it: dict):
    if it["target_logits"] is not None:
        yield it["target_logits"]
    yield from (it["seq_lens"], it["target_aux"], it["de_topk"], *it["select"],
                *it["verify"].values(), *it["sample"])
    for d in it["draft"]:
        yield from (d["input_ids"], d["positions"], d["hidden"], *d["taps"].values(), *d.get("fc", ()))
        if d["logits"] is not None:
            yield d["logits"]


# ---- trace bytes per token (from a real trace's rows) -----------------------------------------
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int64": torch.int64,
           "int32": torch.int32, "bool": torch.bool}


def _scale(dim: str, facts: dict, shape: dict) -> float:
    """Width factor of one schema dim from the trace's model to ``shape`` (tracer/schema.py dims)."""
    if dim in ("hidden", "aux_hidden", "draft_hidden", "attn_in"):
        return shape["hidden"] / facts["hidden"]
    if dim == "draft_vocab":
        return shape["draft_vocab"] / facts["draft_vocab"]
    return 1.0


def trace_rows(path: str) -> tuple[dict, dict]:
    """(name -> (rows per token, elements per row, dims, dtype) of every per-token tensor of the
    trace at ``path``, the trace's facts: hidden, draft_vocab, tokens, sequences)."""
    from specdiff.tracer.store import open_trace

    t = open_trace(path)
    c = t.contract
    facts = {"hidden": c["hidden_size"], "draft_vocab": c["draft_vocab_size"], "sequences": len(t.sequences),
             "tokens": sum(len(s.tokens) for s in t.sequences)}
    out = {}
    for name in t.names:
        if name == "draft.d2t":  # once per trace (Vd rows), not per token
            continue
        info = t.info(name)
        out[name] = (t.rows(name) / facts["tokens"], int(np.prod(info.shape or (1,))), info.dims, _DTYPES[info.dtype])
    return out, facts


def shape_rows(rows: dict, facts: dict, shape: dict, capture: str) -> dict:
    """``rows`` at ``shape``'s widths: name -> (rows per token, elements per row, dtype); capture
    ``full`` adds ``draft.logits`` [Vd] at every ``draft.logsumexp`` row (SGLang's logits are fp32)."""
    got = {name: (r, round(n * float(np.prod([_scale(d, facts, shape) for d in dims] or [1.0]))), dtype)
           for name, (r, n, dims, dtype) in rows.items()}
    if capture == "full" and "draft.logits" not in got and "draft.logsumexp" in got:
        got["draft.logits"] = (got["draft.logsumexp"][0], shape["draft_vocab"], torch.float32)
    return got


def token_bytes(rows: dict) -> float:
    """Raw bytes a token adds to the trace (``shape_rows``)."""
    return sum(r * n * dtype.itemsize for r, n, dtype in rows.values())


def sampled_fraction(f: float, n: int = 100_000) -> float:
    """The fraction of ``n`` request ids the recorder's sampler keeps at ``SPECDIFF_SAMPLE=f``."""
    from specdiff.tracer.engines.requests import RequestSampler

    s = RequestSampler(None if f >= 1 else f, None)
    return sum(s.decide(f"req-{k}", None) is not None for k in range(n)) / n


# ---- the writer's side ---------------------------------------------------------------------
def measure_writer(shape: dict, rows: dict, *, batch: int, steps: int, accept: float, iters: int,
                   tmp: Path) -> dict:
    """Seconds of the writer's logit reductions (median) and ``TraceWriter`` appends (``iters``
    iterations and the close that commits them, after one untimed iteration that creates the arrays)
    per iteration of ``batch * accept`` tokens (``rows``: ``shape_rows``), against a plain file write
    and fsync of the same bytes (before and after, averaged); bytes on disk per iteration."""
    from specdiff.tracer.engines import target_logits
    from specdiff.tracer.engines.sglang.attribution import DraftForward, reduce_logits
    from specdiff.tracer.store import TraceWriter
    from specdiff.tracer.store.arrays import bf16

    it = iteration(shape, batch=batch, steps=steps)
    tokens = batch * accept
    g = torch.Generator().manual_seed(1)
    data = {}
    for name, (r, n, dtype) in rows.items():
        k = max(1, round(r * tokens))
        shp = (k, n) if n > 1 or name in ("draft.topk", "draft.topk_target") else (k,)
        data[name] = (torch.randn(shp, generator=g).to(dtype) if dtype.is_floating_point
                      else torch.randint(0, 1000, shp, generator=g).to(dtype))
    raw = sum(t.nbytes for t in data.values())
    bf16()  # ml_dtypes' import (seconds, once a writer process): not a commit's cost
    t_reduce = []
    for _ in range(max(3, iters // 4)):  # the writer's reductions of one iteration's staged logits
        t0 = time.perf_counter()
        target_logits.top({target_logits.RAW: it["target_logits"], target_logits.K: torch.tensor([8])})
        for k, d in enumerate(it["draft"]):
            reduce_logits(DraftForward(mode="decode"), d["logits"], 8, 1 if k else None, False)
        t_reduce.append(time.perf_counter() - t0)

    def store() -> float:
        w = TraceWriter(str(tmp / "w.trace"), side="serve", contract={"engine": "benchmark"})
        seq = w.add_sequence(np.arange(16, dtype=np.int32), prompt_len=8, rid="warm-up")
        for name, t in data.items():  # creates the arrays (once a trace): not timed
            w.append(name, t, seq=seq, pos=np.arange(t.shape[0]) % 16)
        t0 = time.perf_counter()
        for i in range(iters):
            seq = w.add_sequence(np.arange(16, dtype=np.int32), prompt_len=8, rid=f"r{i}")
            for name, t in data.items():
                w.append(name, t, seq=seq, pos=np.arange(t.shape[0]) % 16)
        w.close()  # waits for every chunk's commit
        return time.perf_counter() - t0

    def plain() -> float:
        t0 = time.perf_counter()
        with open(tmp / "plain.bin", "wb") as f:
            for _ in range(iters):
                for t in data.values():
                    f.write((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - t0

    tmp.mkdir(parents=True, exist_ok=True)
    p1, st, p2 = plain(), store(), plain()
    disk = sum(f.stat().st_size for f in (tmp / "w.trace").rglob("*") if f.is_file())
    return {"tokens": tokens, "raw": raw, "disk": disk / (iters + 1), "reduce": statistics.median(t_reduce),
            "store": st / iters, "plain": (p1 + p2) / 2 / iters}


def report(name: str, shape: dict, args, rows: dict, facts: dict) -> None:
    """Measure and print parts 1-3 for one shape."""
    from specdiff.tracer.store import CHUNK_BYTES

    tmp = Path(tempfile.mkdtemp(prefix="specdiff-prodrec-", dir=args.dir))
    try:
        tokens = args.batch * args.accept
        h = measure_hot_path(shape, batch=args.batch, steps=args.steps, iters=args.iters, ring_mb=args.ring_mb, tmp=tmp)
        rec, off, nolog = h["recorded"], h["not recorded"], h["recorded, no logits"]
        print(f"\n== {name}: H {shape['hidden']}, vocab {shape['vocab']}, draft vocab {shape['draft_vocab']}; batch "
              f"{args.batch}, {args.steps} draft steps (N {args.steps + 1}), {args.accept} tokens a request an iteration")
        print(f"serving thread, per iteration: recorded {rec * 1e6:8.0f} us   not recorded {off * 1e6:6.1f} us   "
              f"ratio {rec / off:.0f}x  [interleaved, median of {args.iters}]")
        print(f"  per token: recorded {rec / tokens * 1e6:7.1f} us (copies {h['staged_bytes'] / tokens / 1e3:.0f} KB a "
              f"token into the ring, {h['staged_bytes'] / rec / 1e9:.2f} GB/s), not recorded {off / tokens * 1e6:.2f} us")
        one = h["1 recorded"]
        print(f"  1 of {args.batch} requests recorded (the others left out by the sampler): {one * 1e6:.0f} us "
              f"({one / rec:.3f}x all recorded), {h['one_bytes'] / 2**20:.2f} MiB copied vs "
              f"{h['all_bytes'] / 2**20:.2f} MiB with all recorded (ratio {h['one_bytes'] / h['all_bytes']:.3f}; "
              f"1/{args.batch} = {1 / args.batch:.3f})  [same run]")
        print(f"  recorded without the raw logits (the hidden states a GPU server copies too, "
              f"{h['hidden_bytes'] / tokens / 1e3:.0f} KB a token): {nolog / tokens * 1e6:.1f} us a token, "
              f"{nolog / off:.0f}x not recorded; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        writer = {}
        for cap in ("default", "full"):
            w = writer[cap] = measure_writer(shape, shape_rows(rows, facts, shape, cap), batch=args.batch,
                                             steps=args.steps, accept=args.accept, iters=args.writer_iters, tmp=tmp / cap)
            print(f"writer, capture {cap}, per iteration ({w['tokens']:.0f} tokens, {w['raw'] / 2**20:.1f} MiB of rows): "
                  f"logit reductions {w['reduce'] * 1e3:.1f} ms, TraceWriter {w['store'] * 1e3:.1f} ms vs plain write "
                  f"{w['plain'] * 1e3:.1f} ms (ratio {w['store'] / w['plain']:.2f}x)")
            print(f"  store {w['raw'] / w['store'] / 1e6:.0f} MB/s of rows, on disk {w['disk'] / w['raw']:.2f}x raw; one "
                  f"writer sustains {w['tokens'] / (w['reduce'] + w['store']):.0f} tokens/s "
                  f"({w['raw'] / w['tokens'] / 1e3:.0f} KB raw a token)")
        print(f"trace per 1,000 tokens (rows per token of {facts['sequences']} sequences, {facts['tokens']} tokens of "
              f"{args.trace}); the store keeps float rows uncompressed (tracer/store/layout.py), so on disk = raw + the "
              f"key columns + at most one padded {CHUNK_BYTES >> 20} MiB chunk a tensor at the trace's end (the writer "
              f"runs' disk/raw above include that padding); disk at {args.server_tps:.0f} tokens/s; thread % = recorder "
              f"seconds on the serving thread per second of serving at that rate (CPU copies; a GPU server's are device "
              f"work + pinned copies):")
        print(f"  {'capture':8} {'sample':>6} {'kept':>6} {'MB/1k tok':>9} {'disk MB/s':>10} {'TB/day':>7} "
              f"{'thread %':>9} {'no logits':>9}")
        for cap in ("default", "full"):
            b = token_bytes(shape_rows(rows, facts, shape, cap))
            for f in args.sample:
                kept = sampled_fraction(f)
                disk = b * kept * args.server_tps
                hot = (rec * kept + off * (1 - kept)) / tokens * args.server_tps * 100
                hot2 = (nolog * kept + off * (1 - kept)) / tokens * args.server_tps * 100
                print(f"  {cap:8} {f:6.2f} {kept:6.3f} {b * kept / 1e3:9.1f} {disk / 1e6:10.1f} "
                      f"{disk * 86400 / 1e12:7.2f} {hot:8.2f}% {hot2:8.2f}%")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    from specdiff.demo_models.production import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--accept", type=float, default=3.0, help="tokens a request commits an iteration")
    ap.add_argument("--iters", type=int, default=20, help="serving-thread iterations per mode")
    ap.add_argument("--writer-iters", type=int, default=24, help="writer iterations per capture level")
    ap.add_argument("--sample", type=float, nargs="+", default=[1.0, 0.1, 0.01])
    ap.add_argument("--server-tps", type=float, default=5000.0)
    ap.add_argument("--trace", default=str(SEED_TRACE), help="a real serving trace: its rows per token")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ring-mb", type=int, default=256, help="the ring's size (SPECDIFF_MAX_QUEUE_MB, default 256)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows, facts = trace_rows(args.trace)
    for name in (SHAPES if args.shape == "both" else [args.shape]):
        report(name, SHAPES[name], args, rows, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
