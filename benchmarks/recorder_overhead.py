"""Benchmark: SGLang EAGLE-3 throughput with the specdiff recorder off, at default and at full capture.

    python benchmarks/recorder_overhead.py [--prompts 8] [--new 64] [--batch 4] [--topk 1]
    python benchmarks/recorder_overhead.py --device cuda --target T --draft D [--server-arg=--tp=2 ...]
    python benchmarks/recorder_overhead.py --engine vllm [--rounds 5] [--prompts 8] [--new 64] [--batch 4]

Starts the same SGLang server three times (``specdiff.tracer.engines.sglang.cpu.launch.ServerProcess``; on a GPU,
``--device cuda``: SGLang's own ``launch_server`` with CUDA graphs, the recorder loaded through
SGLang's plugin entry point as users run it, on your ``--target``/``--draft`` checkpoints):
tracing off, ``SPECDIFF_CAPTURE=default`` and ``SPECDIFF_CAPTURE=full``; sends one warm-up
request, then the same greedy prompt set in batches of ``--batch`` concurrent requests, and
prints output tokens/s and the traced/untraced ratios. Goal (issue 3): default capture costs
<= 10 % throughput, full capture <= 50 %. Uses the demo pair in traces/models when it is
built, else the throwaway bring-up models (specdiff.demo_models.bringup) — throughput depends on
shapes and accept lengths, so the demo pair is the fairer measurement. On a shared machine
run it twice: neighbours' load moves the numbers by more than the recorder does.

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


def run(mode: str, target, draft, args, workdir: Path) -> dict:
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings
    from specdiff.tracer.store import open_trace

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDIFF_")}
    trace = workdir / f"{mode}.trace"
    if mode != "off":
        env.update(SPECDIFF_TRACE=str(trace), SPECDIFF_CAPTURE=mode)
    spec = SpecSettings(num_steps=3, topk=args.topk, num_draft_tokens=4 if args.topk == 1 else 6)
    prompts = [PROMPT_SEEDS[i % len(PROMPT_SEEDS)] + " " * (i // len(PROMPT_SEEDS)) for i in range(args.prompts)]
    with ServerProcess(target, draft_model_path=draft, spec=spec, env=env, device=args.device,
                       extra_args=args.server_arg) as srv:
        srv.generate("x = 1\n", max_new_tokens=8)  # warm-up (first-request setup)
        tokens = verify = 0
        t0 = time.perf_counter()
        for i in range(0, len(prompts), args.batch):
            outs = srv.generate(prompts[i:i + args.batch], max_new_tokens=args.new)
            outs = outs if isinstance(outs, list) else [outs]
            tokens += sum(o["meta_info"]["completion_tokens"] for o in outs)
            verify += sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
        wall = time.perf_counter() - t0
    out = {"mode": mode, "tokens": tokens, "seconds": wall, "tok_s": tokens / wall,
           "accept": tokens / max(verify, 1)}
    if mode != "off":
        t = open_trace(str(trace))
        out["records"] = t.records
        out["dropped"] = t.contract.get("dropped_records")
        out["mb"] = sum(f.stat().st_size for f in trace.rglob("*") if f.is_file()) / 1e6
        c = t.contract
        out["hook_share"] = c.get("recorder_hook_s", 0.0) / max(c.get("recorder_iter_s", 0.0), 1e-9)
        out["writer_s"] = c.get("recorder_writer_s", 0.0)
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
    ap.add_argument("--engine", choices=["sglang", "vllm"], default="sglang",
                    help="sglang: three servers one after the other; vllm: a CPU vLLM untraced and traced side "
                         "by side (.venv-vllm)")
    ap.add_argument("--rounds", type=int, default=5, help="--engine vllm: alternating rounds (median taken)")
    args = ap.parse_args()
    if bool(args.target) != bool(args.draft):
        ap.error("--target and --draft go together (a target checkpoint and its EAGLE-3 draft)")
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
        res = [run(m, target, draft, args, workdir) for m in ("off", "default", "full")]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    base = res[0]["tok_s"]
    print(f"{'capture':8s} {'tok/s':>8s} {'ratio':>6s} {'accept':>6s} {'records':>8s} {'dropped':>7s} {'MB':>7s} "
          f"{'hooks%':>7s} {'writer_s':>8s} {'gen_s':>7s}")
    for r in res:
        print(f"{r['mode']:8s} {r['tok_s']:8.1f} {r['tok_s'] / base:6.3f} {r['accept']:6.2f} "
              f"{r.get('records', 0):8d} {r.get('dropped', 0) or 0:7d} {r.get('mb', 0.0):7.2f} "
              f"{100 * r.get('hook_share', 0.0):7.2f} {r.get('writer_s', 0.0):8.2f} {r['seconds']:7.1f}")
    print("hooks% = wall time inside the recorder's hooks / wall time of the recorded forwards (serving "
          "thread); writer_s = background writer thread time (off the serving thread, but it shares CPUs)")
    d, f = res[1]["tok_s"] / base, res[2]["tok_s"] / base
    print(f"default capture keeps {d:.1%} of untraced throughput (goal >= 90 %), "
          f"full keeps {f:.1%} (goal >= 50 %)")


if __name__ == "__main__":
    main()
