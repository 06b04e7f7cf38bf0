"""How fast ``specdiff view`` opens two large traces, against ``specdiff diff --format json``.

Builds a seed-bug pair (training HF [0, 3, 6] vs serving HF [3, 6, 7], i.e. serving slot j holds
training slot j+1's layer) of bf16 aux rows with H=4096 (8 KiB a row, 3 slots a position) at
``--size-mib`` per trace, then measures, each in a fresh Python process from its launch:

- the app (headless, Textual ``run_test``): time to first paint; to "first divergence shown" (the
  verdict line names it, proven by the rows read so far: replay/diff/compare/early.py) and "grid on it"
  (the partial grid's cursor sits on target.aux.0 pos 0); and to "report ready" (the full
  statistics, explanation and acceptance computed, the cursor on the first divergence);
- ``specdiff diff --format json`` on the same pair: wall time to the report.

    python benchmarks/tui_open.py --size-mib 1024          # the 1 GiB traces of docs/performance.md
    python benchmarks/tui_open.py --size-mib 128 --keep    # quicker; keep the traces
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def build(root: Path, *, size_mib: int, hidden: int, seq_len: int) -> tuple[str, str]:
    import torch

    from specdiff.tracer.schema import aux_name
    from specdiff.tracer.store import TraceWriter

    row_bytes = hidden * 2 * 3  # three bf16 aux slots per position
    positions = max(size_mib * 2**20 // row_bytes, seq_len)
    n_seqs = max(positions // seq_len, 1)
    rng = np.random.default_rng(0)
    paths = (str(root / "train.trace"), str(root / "serve.trace"))
    contract = {"num_layers": 8, "hidden_size": hidden, "dtype": "bfloat16", "spec_steps": 3}
    writers = (TraceWriter(paths[0], side="train", contract={**contract, "aux_hf_indices": [0, 3, 6]},
                           overwrite=True),
               TraceWriter(paths[1], side="serve", contract={**contract, "aux_hf_indices": [3, 6, 7]},
                           overwrite=True))
    for s in range(n_seqs):
        toks = rng.integers(0, 4096, seq_len + 1)
        n = seq_len
        layers = torch.from_numpy(rng.standard_normal((4, n, hidden), dtype=np.float32)).to(torch.bfloat16)
        for w, offset in zip(writers, (0, 1)):
            sid = w.add_sequence(toks, prompt_len=16, rid=f"{w.side}-{s}")
            for j in range(3):
                w.append(aux_name(j), layers[j + offset], seq=sid, pos=np.arange(n))
            w.append("tokens", toks[1:n + 1].astype(np.int64), seq=sid, pos=np.arange(n))
    for w in writers:
        w.close()
    return paths


def du(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def measure_tui(a: str, b: str, launched: float) -> dict:
    """Run in a child process: the app headless, times since the child's launch."""
    import asyncio

    from specdiff.tui.app import SpecdiffApp

    out: dict = {}

    async def run():
        app = SpecdiffApp(a, b, export_root=tempfile.gettempdir())
        async with app.run_test(size=(120, 40)) as pilot:
            out["first_paint_s"] = time.time() - launched
            while app.sel is None and not app.error:
                if app.early is not None and "first_shown_s" not in out:
                    out["first_shown_s"] = time.time() - launched
                    out["early"] = app.early.verdict()
                grid = app.query_one("#grid")
                if "grid_on_first_s" not in out and grid.vm is not None and grid.vm.first is not None \
                        and grid.selection == grid.vm.first:
                    out["grid_on_first_s"] = time.time() - launched
                await pilot.pause(0.02)  # a light poll: an idle app, as on a real terminal
            out["first_divergence_s"] = time.time() - launched
            out["selected"] = None if app.sel is None else [app.sel.name, app.sel.pair, app.sel.pos]
            await pilot.press("n")  # one navigation step, as a user would
            out["error"] = app.error

    asyncio.run(run())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="raw size of each trace (default 1024)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--dir", default=None, help="where to build the traces (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the traces")
    ap.add_argument("--tui-child", nargs=3, metavar=("A", "B", "LAUNCHED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tui_child:
        a, b, launched = args.tui_child
        print(json.dumps(measure_tui(a, b, float(launched))))
        return

    root = Path(args.dir or tempfile.mkdtemp(prefix="specdiff-tui-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    a, b = build(root, size_mib=args.size_mib, hidden=args.hidden, seq_len=args.seq_len)
    print(f"built 2 traces of {args.size_mib} MiB raw (H={args.hidden}, bf16, 3 aux slots): "
          f"{du(a) / 2**20:.0f} + {du(b) / 2**20:.0f} MiB on disk in {time.perf_counter() - t:.1f} s")
    try:
        launched = time.time()
        child = subprocess.run([sys.executable, __file__, "--tui-child", a, b, str(launched)],
                               capture_output=True, text=True, check=True)
        tui = json.loads(child.stdout.strip().splitlines()[-1])
        t = time.time()
        proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "json"],
                              capture_output=True, text=True)
        diff_s = time.time() - t
        first = json.loads(proc.stdout)["first_divergence"] if proc.stdout else None
        print(f"specdiff view (headless, 120x40): first paint {tui['first_paint_s']:.2f} s, "
              f"first divergence shown {tui.get('first_shown_s', float('nan')):.2f} s "
              f"({tui.get('early')}), grid on it {tui.get('grid_on_first_s', float('nan')):.2f} s, "
              f"report ready {tui['first_divergence_s']:.2f} s -> {tui['selected']}")
        print(f"  first divergence {tui.get('first_shown_s', float('nan')) - tui['first_paint_s']:.2f} s after the "
              f"app opened (goal < 1 s)")
        print(f"specdiff diff --format json:      {diff_s:.2f} s (exit {proc.returncode}) -> "
              f"{first and [first['tensor'], first['seq'], first['pos']]}")
        print("(all times from process launch, imports included)")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
