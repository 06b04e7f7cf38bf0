"""Benchmark: SGLang EAGLE-3 throughput with the specdiff recorder off, at default and at full capture.

    python benchmarks/recorder_overhead.py [--prompts 8] [--new 64] [--batch 4] [--topk 1]
    python benchmarks/recorder_overhead.py --device cuda --target T --draft D [--server-arg=--tp=2 ...]

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
"""

from __future__ import annotations

import argparse
import os
import shutil
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
    args = ap.parse_args()
    if bool(args.target) != bool(args.draft):
        ap.error("--target and --draft go together (a target checkpoint and its EAGLE-3 draft)")
    target, draft = models(args)
    print(f"models: {target} / {draft}; {args.prompts} prompts x {args.new} new tokens, batch {args.batch}, "
          f"topk {args.topk}")
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
