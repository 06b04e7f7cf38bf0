"""Benchmark: SGLang EAGLE-3 throughput untraced vs default capture vs full capture vs 10 % sampling.

    python benchmarks/recorder_overhead.py [--prompts 8] [--new 64] [--batch 4] [--rounds 5] [--modes off,default]
    python benchmarks/recorder_overhead.py --device cuda --target T --draft D \
        [--server-arg=--mem-fraction-static=0.2 ...]
    python benchmarks/recorder_overhead.py --engine vllm [--rounds 5] [--prompts 8] [--new 64] [--batch 4]

Starts one SGLang server per mode, all up at once (``specdiff.tracer.engines.sglang.cpu.launch.ServerProcess``;
on a GPU, ``--device cuda``: SGLang's own ``launch_server`` with CUDA graphs on, the recorder
loaded through SGLang's plugin entry point as users run it, on your ``--target``/``--draft``
checkpoints; give each server a share of the GPU with ``--mem-fraction-static``):
tracing off, a second untraced server (``twin``: its ratio to the first is the run's noise floor),
``SPECDIFF_CAPTURE=default``, ``SPECDIFF_CAPTURE=full`` and default capture with
``SPECDIFF_SAMPLE=0.1``. Each server gets one warm-up request, marked for recording, and the
writers are let finish it: a trace's one-off set-up (creating its arrays) is not in the rounds.
Every round sends the same greedy prompt set in batches of ``--batch`` concurrent requests (fresh
rids); each batch goes to every server back to back, in a seeded random order, since this VM's speed
swings by +-14 % from one batch to the next (one server alone, the same batch 30 times). It
prints each mode's median tokens/s, the median of its per-round ratio to the untraced server, and
the recorder's cost over the rounds: the hooks' time on the serving thread, the scheduler
process's CPU per token, the writer process's CPU seconds, and CPU seconds per MB recorded.
Goals (cheap enough to leave on; CPU server): default >= 0.9x, 10 % sampling >= 0.97x, full >= 0.5x.
Uses the demo pair in traces/models when it is built, else the throwaway bring-up models
(specdiff.demo_models.bringup) — throughput depends on shapes and accept lengths, so the demo pair
is the fairer measurement. ``--threads N`` sets every server's OMP_NUM_THREADS.

What the writer process costs a CPU server is not only its CPU: on this VM the demo pair's
forward runs out of the shared L3 cache, and a nice-19 process streaming through memory on the
other core slowed it by 13 % (a busy loop that touches no memory: no change), so the writer's
cost follows the bytes it moves, whatever its priority.

``--engine vllm``: a CPU vLLM 0.32 server from the repository's vLLM venv (``make vllm-venv``;
``specdiff.tracer.engines.vllm.cpu.VLLMServerProcess``), untraced and traced at default capture,
both up side by side in one run; each round sends the prompt set to one then the other (which goes
first alternates), and the median tokens/s of the rounds is compared, so a neighbour's load hits
both alike. The demo draft is in SGLang's format: its ids are rewritten in vLLM's numbering into a
copy's top-level ``eagle_aux_hidden_state_layer_ids`` (the same HF layers). vLLM's accept length is
read from its spec-decode counters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT_SEEDS = ["def main():\n    ", "import os\nimport sys\n\n", "class Parser:\n    def __init__(self",
                "for i in range(", "    return self.", "with open(path) as f:\n", "try:\n    import ",
                "if __name__ == '__main__':\n"]


def models(args) -> tuple[Path, Path]:
    if args.target:
        return Path(args.target), Path(args.draft)
    demo = ROOT / "traces" / "models"
    if (demo / "target" / "config.json").exists() and (demo / "draft" / "config.json").exists():
        return demo / "target", demo / "draft"
    from specdiff.demo_models.bringup import build_bringup_models

    return build_bringup_models(Path(tempfile.gettempdir()) / "specdiff-bringup")


def recorded_mb(trace) -> float:
    """MB of rows recorded (rows x row bytes of every tensor, keys not counted): a small trace's
    directory is mostly its raw chunks' fixed size, so its size on disk would not say what was recorded."""
    import numpy as np

    from specdiff.tracer.store import STORAGE_DTYPES

    total = 0
    for name in trace.names:
        info = trace.info(name)
        total += info.rows * int(np.prod(info.shape, dtype=np.int64)) * STORAGE_DTYPES[info.dtype].itemsize
    return total / 1e6


#: The SGLang modes compared side by side: the recorder's environment of each ("twin": a second
#: untraced server, the run's noise floor: its ratio to "off" is what the machine alone moves).
MODES = {"off": {}, "twin": {}, "default": {"SPECDIFF_CAPTURE": "default"}, "full": {"SPECDIFF_CAPTURE": "full"},
         "sample10": {"SPECDIFF_CAPTURE": "default", "SPECDIFF_SAMPLE": "0.1"}}
GOALS = {"default": 0.9, "full": 0.5, "sample10": 0.97}  # of untraced tokens/s, CPU server


def process_cpu(srv) -> dict[str, float]:
    """CPU seconds (user + system) so far of server ``srv``'s process, every process under it and
    its trace's writer process (out of the server's tree: tracer/engines/writer/alive.py), by role:
    ``scheduler`` (SGLang's scheduler: the serving thread and torch's), ``writer`` (specdiff's
    writer process), ``other`` (HTTP server, tokenizer, detokenizer)."""
    import psutil  # comes with distributed (a specdiff dependency)

    from specdiff.tracer.engines.writer.alive import writer_pids

    out = {"scheduler": 0.0, "writer": 0.0, "other": 0.0}
    root = psutil.Process(srv.pid)
    trace = (srv.env or {}).get("SPECDIFF_TRACE")
    writers = []
    for pid in writer_pids(trace) if trace else []:
        try:
            writers.append(psutil.Process(pid))
        except psutil.Error:  # exited meanwhile
            pass
    for p in [root, *root.children(recursive=True), *writers]:
        try:
            t = p.cpu_times()
            role = ("writer" if "specdiff.tracer.engines.writer.child" in " ".join(p.cmdline())
                    else "scheduler" if p.name().startswith("sglang::scheduler") else "other")
        except psutil.Error:  # exited meanwhile
            continue
        out[role] += t.user + t.system
    return out


def settle_writers(servers: dict, timeout_s: float = 60.0) -> None:
    """Wait until every writer process is idle (under 20 ms of CPU in a second: an idle writer still
    journals its progress once a second), so the rounds measure steady recording, not a trace's
    one-off set-up (the warm-up's rows, creating its arrays); says so when it gives up."""
    t_end = time.monotonic() + timeout_s
    last = tuple(process_cpu(srv)["writer"] for srv in servers.values())
    while time.monotonic() < t_end:
        time.sleep(1.0)
        now = tuple(process_cpu(srv)["writer"] for srv in servers.values())
        if all(b - a < 0.02 for a, b in zip(last, now, strict=True)):
            return
        last = now
    print(f"warning: the writer processes were still busy after {timeout_s:.0f} s; measuring anyway", flush=True)


def run_sglang(target, draft, args, workdir: Path) -> dict:
    """One SGLang server per mode (``MODES``), all up at once. Every batch of every round goes to
    each server back to back, in a seeded random order, so each mode's batch and the untraced one's
    run seconds apart and the machine's swings hit them alike. Per mode: each round's
    tokens/s, the median of the rounds' ratios to the untraced server, and the recorder's cost
    over the rounds (CPU of the scheduler and the writer process; hooks and MB from the trace)."""
    from specdiff.tracer.engines.requests import MARK_KEY
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings
    from specdiff.tracer.store import open_trace

    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECDIFF_")}
    if args.threads:
        base["OMP_NUM_THREADS"] = str(args.threads)
    spec = SpecSettings(num_steps=3, topk=args.topk, num_draft_tokens=4 if args.topk == 1 else 6)
    extra = list(args.server_arg)
    if args.device == "cpu":
        extra.append("--sleep-on-idle")  # idle servers must not poll the cores the measured one uses
    modes = [m for m in MODES if m in args.modes]
    traces = {m: workdir / f"{m}.trace" for m in modes if MODES[m]}
    servers = {m: ServerProcess(target, draft_model_path=draft, spec=spec, device=args.device, extra_args=extra,
                                env={**base, **MODES[m], **({"SPECDIFF_TRACE": str(traces[m])} if m in traces else {})})
               for m in modes}
    prompts = [PROMPT_SEEDS[i % len(PROMPT_SEEDS)] + " " * (i // len(PROMPT_SEEDS)) for i in range(args.prompts)]
    tok_s: dict[str, list[float]] = {m: [] for m in modes}
    accept: dict[str, list[float]] = {m: [] for m in modes}
    tokens = {m: 0 for m in modes}
    try:
        for srv in servers.values():
            srv.start(wait=False)
        for srv in servers.values():
            srv.wait_ready()
            # warm-up: first-request set-up, and a recorded request (the client's mark) so each
            # trace creates its arrays now, not inside the measured rounds
            srv.generate("x = 1\n", max_new_tokens=8, custom_params={MARK_KEY: True})
        settle_writers(servers)
        cpu0 = {m: process_cpu(srv) for m, srv in servers.items()}
        batches = list(range(0, len(prompts), args.batch))
        for r in range(args.rounds):
            # rids unique per round: the 10 % sample is a different tenth each round
            rids = [f"bench-{r}-{i}" for i in range(len(prompts))]
            secs, toks, verify = ({m: 0 for m in modes} for _ in range(3))
            for b, i in enumerate(batches):
                # a seeded shuffle, not a rotation: a writer still finishing its server's batch
                # slows whichever server runs next, so no mode may always follow the same one
                for m in random.Random(r * len(batches) + b).sample(modes, len(modes)):
                    t0 = time.perf_counter()
                    outs = servers[m].generate(prompts[i:i + args.batch], max_new_tokens=args.new,
                                               request={"rid": rids[i:i + args.batch]})
                    secs[m] += time.perf_counter() - t0
                    outs = outs if isinstance(outs, list) else [outs]
                    toks[m] += sum(o["meta_info"]["completion_tokens"] for o in outs)
                    verify[m] += sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
            for m in modes:
                tok_s[m].append(toks[m] / secs[m])
                accept[m].append(toks[m] / max(verify[m], 1))
                tokens[m] += toks[m]
        settle_writers(servers)  # the rounds' rows written: their CPU is counted
        cpu1 = {m: process_cpu(srv) for m, srv in servers.items()}
    finally:
        for srv in servers.values():
            srv.stop()
    out = {}
    for m in modes:
        ratios = [v / o for v, o in zip(tok_s[m], tok_s["off"], strict=True)]
        cpu = {k: cpu1[m][k] - cpu0[m][k] for k in cpu0[m]}
        res = {"mode": m, "tok_s": statistics.median(tok_s[m]), "rounds": tok_s[m],
               "ratio": statistics.median(ratios), "accept": statistics.median(accept[m]),
               "sched_ms_tok": 1000 * cpu["scheduler"] / max(tokens[m], 1), "writer_cpu_s": cpu["writer"]}
        if m in traces:
            t = open_trace(str(traces[m]))
            c = t.contract
            mb = recorded_mb(t)
            res.update(records=t.records, dropped=c.get("dropped_records"), mb=mb, closed=t.closed,
                       sampled=len(c.get("sampled_requests") or {}), dropped_requests=len(c.get("dropped_requests") or []),
                       hook_share=c.get("recorder_hook_s", 0.0) / max(c.get("recorder_iter_s", 0.0), 1e-9),
                       hook_s=c.get("recorder_hook_s", 0.0),
                       # both over the whole trace (warm-up included), as the MB are
                       cpu_s_per_mb=((c.get("recorder_hook_s", 0.0) + c.get("recorder_writer_cpu_s", cpu["writer"])) / mb
                                     if mb else float("nan")))
        out[m] = res
    return out


def vllm_draft(target: Path, draft: Path, workdir: Path) -> Path:
    """``draft`` as vLLM reads it: a draft whose config already has the top-level ids is used as is;
    one with only SGLang's nested ids gets a copy (weights linked) whose top-level ids name the same
    HF layers in vLLM's numbering (eagle3.aux_layers: SGLang's rule of the target, then vLLM's)."""
    from specdiff.eagle3.aux_layers import engine_capture, native_aux_ids, target_architecture

    cfg = json.loads((draft / "config.json").read_text())
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if cfg.get("eagle_aux_hidden_state_layer_ids") or not nested:
        return draft
    tcfg = json.loads((target / "config.json").read_text())
    L = int(tcfg["num_hidden_layers"])
    hf = engine_capture("sglang", nested, num_layers=L, architecture=target_architecture(tcfg)).hf_indices
    out = workdir / "vllm-draft"
    out.mkdir()
    for f in draft.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    cfg["eagle_aux_hidden_state_layer_ids"] = list(native_aux_ids(list(hf), "vllm", num_layers=L))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def run_vllm(target: Path, draft: Path, args, workdir: Path) -> dict:
    """Untraced and default-capture vLLM CPU servers side by side: per mode the median output tokens/s
    over ``args.rounds`` alternating rounds, vLLM's accept length, and the trace's cost facts."""
    from specdiff.tracer.engines.vllm.cpu import VLLMServerProcess, spec_decode_stats, vllm_python
    from specdiff.tracer.store import open_trace

    py = vllm_python()
    if not os.path.exists(py):
        sys.exit(f"no vLLM venv at {py}: build it with `make vllm-venv`")
    vdraft = vllm_draft(target, draft, workdir)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECDIFF_")}
    trace = workdir / "vllm-default.trace"
    envs = {"off": base, "default": {**base, "SPECDIFF_TRACE": str(trace), "SPECDIFF_CAPTURE": "default"}}
    servers = {m: VLLMServerProcess(target, draft_model_path=vdraft, python=py, env=e,
                                    cache_root=str(ROOT / ".cache" / "vllm"), log_path=str(workdir / f"{m}.log"))
               for m, e in envs.items()}
    prompts = [PROMPT_SEEDS[i % len(PROMPT_SEEDS)] + " " * (i // len(PROMPT_SEEDS)) for i in range(args.prompts)]
    tok_s: dict[str, list[float]] = {m: [] for m in servers}
    try:
        for srv in servers.values():
            srv.start(wait=False)
        for srv in servers.values():
            srv.wait_ready()
            srv.generate("x = 1\n", max_new_tokens=8)  # warm-up (first-request compile and setup)
        before = {m: spec_decode_stats(srv.metrics()) for m, srv in servers.items()}
        for r in range(args.rounds):
            for m in (("off", "default") if r % 2 == 0 else ("default", "off")):
                t0, tokens = time.perf_counter(), 0
                for i in range(0, len(prompts), args.batch):
                    outs = servers[m].generate(prompts[i:i + args.batch], max_new_tokens=args.new)
                    tokens += sum(o["meta_info"]["completion_tokens"] for o in outs)
                tok_s[m].append(tokens / (time.perf_counter() - t0))
        after = {m: spec_decode_stats(srv.metrics()) for m, srv in servers.items()}
    finally:
        for srv in servers.values():
            srv.stop()
    out = {}
    for m in servers:
        b, a = before[m], after[m]
        drafts = a.get("drafts", 0) - b.get("drafts", 0)
        acc = 1 + (a.get("accepted", 0) - b.get("accepted", 0)) / drafts if drafts else float("nan")
        out[m] = {"mode": m, "tok_s": statistics.median(tok_s[m]), "rounds": tok_s[m], "accept": acc}
    t = open_trace(str(trace))
    c = t.contract
    out["default"].update(records=t.records, dropped=c.get("dropped_records"),
                          mb=sum(f.stat().st_size for f in trace.rglob("*") if f.is_file()) / 1e6,
                          hook_share=c.get("recorder_hook_s", 0.0) / max(c.get("recorder_iter_s", 0.0), 1e-9),
                          writer_s=c.get("recorder_writer_s", 0.0), closed=t.closed)
    return out


def main_vllm(args, target: Path, draft: Path) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="specdiff-overhead-vllm-"))
    try:
        res = run_vllm(target, draft, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    off, on = res["off"], res["default"]
    print(f"{'capture':8s} {'median tok/s':>12s} {'accept':>6s}  rounds (tok/s)")
    for r in (off, on):
        print(f"{r['mode']:8s} {r['tok_s']:12.1f} {r['accept']:6.2f}  " + " ".join(f"{v:.1f}" for v in r["rounds"]))
    print(f"trace: {on['records']} records, {on['dropped'] or 0} dropped, {on['mb']:.2f} MB, closed {on['closed']}; "
          f"hooks {100 * on['hook_share']:.2f} % of the recorded iterations' wall time; writer {on['writer_s']:.2f} s")
    print(f"vLLM default capture keeps {on['tok_s'] / off['tok_s']:.1%} of untraced throughput "
          f"(median of {args.rounds} alternating rounds; goal >= 90 %)")


def main():
    from specdiff.eagle3.engines import ENGINES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu: the CPU recipe on the demo pair; cuda: SGLang as served on a GPU")
    ap.add_argument("--target", help="target checkpoint (default: the demo pair, or throwaway models)")
    ap.add_argument("--draft", help="EAGLE-3 draft checkpoint (with --target)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more SGLang flag, e.g. --server-arg=--tp-size=2 (repeatable)")
    ap.add_argument("--engine", choices=list(ENGINES), default="sglang",
                    help="sglang: one server per mode side by side; vllm: a CPU vLLM untraced and traced side "
                         "by side (.venv-vllm)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (median taken)")
    ap.add_argument("--threads", type=int, default=0,
                    help="OMP_NUM_THREADS of every SGLang server (default: torch's own, one per core)")
    ap.add_argument("--modes", default=",".join(MODES), type=lambda v: v.split(","),
                    help=f"SGLang modes to compare, comma-separated (of {', '.join(MODES)}); 'off' is the baseline")
    args = ap.parse_args()
    if bool(args.target) != bool(args.draft):
        ap.error("--target and --draft go together (a target checkpoint and its EAGLE-3 draft)")
    if not set(args.modes) <= set(MODES) or "off" not in args.modes:
        ap.error(f"--modes: names of {', '.join(MODES)}, including off")
    if args.engine == "vllm" and (args.device != "cpu" or args.server_arg or args.topk != 1):
        ap.error("--engine vllm runs the CPU vLLM of .venv-vllm with a chain (topk 1) and no extra flags")
    target, draft = models(args)
    print(f"models: {target} / {draft}; {args.prompts} prompts x {args.new} new tokens, batch {args.batch}, "
          f"topk {args.topk}" + (f", engine vllm, {args.rounds} rounds" if args.engine == "vllm" else ""))
    if args.engine == "vllm":
        main_vllm(args, target, draft)
        return
    workdir = Path(tempfile.mkdtemp(prefix="specdiff-overhead-"))
    try:
        res = run_sglang(target, draft, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'mode':9s} {'tok/s':>8s} {'ratio':>6s} {'accept':>6s} {'records':>8s} {'sampled':>7s} {'dropped':>9s} "
          f"{'MB':>7s} {'hooks%':>7s} {'hook_s':>7s} {'sched':>7s} {'wr_cpu_s':>8s} {'cpu_s/MB':>8s}  rounds (tok/s)")
    for m, r in res.items():
        print(f"{m:9s} {r['tok_s']:8.1f} {r['ratio']:6.3f} {r['accept']:6.2f} {r.get('records', 0):8d} "
              f"{r.get('sampled', 0):7d} {r.get('dropped', 0) or 0:4d}/{r.get('dropped_requests', 0):<4d} "
              f"{r.get('mb', 0.0):7.2f} {100 * r.get('hook_share', 0.0):7.2f} {r.get('hook_s', 0.0):7.2f} "
              f"{r['sched_ms_tok']:7.2f} {r['writer_cpu_s']:8.2f} {r.get('cpu_s_per_mb', 0.0):8.3f}  "
              + " ".join(f"{v:.1f}" for v in r["rounds"]))
    print("ratio = median over rounds of (mode tok/s / untraced tok/s in the same round; each batch sent to every "
          "server back to back, in random order); dropped = iterations/requests; hooks% = the hooks' wall time / the recorded "
          "forwards' (serving thread); sched = the scheduler process's CPU ms per token and wr_cpu_s = the writer "
          "process's CPU s, both over the rounds; MB = rows recorded; cpu_s/MB = (hooks + writer CPU) / MB, all over "
          "the whole trace (warm-up included)")
    twin = res.get("twin", {}).get("ratio")
    noise = f"; the untraced twin measured {twin:.1%} (this run's noise floor)" if twin is not None else ""
    for m, goal in GOALS.items():
        if m in res:
            r = res[m]["ratio"]
            print(f"{m}: keeps {r:.1%} of untraced throughput (goal >= {goal:.0%}): {'met' if r >= goal else 'NOT met'}"
                  + noise)

if __name__ == "__main__":
    main()
