"""What re-execution costs the diff: ``diff_traces`` with re-execution and narrowing (the default)
against the same diff without (``--no-narrow``), side by side on one pair in one run.

Re-execution (replay/diff/rerun/reexec.py) re-runs the training draft on serving's recorded inputs to
decide whether a draft stage is the first divergence; narrowing grafts serving's inputs in one at a
time; the context judge may ask for a re-run too. All three load the draft checkpoint the training
contract names (``draft_name``; ``--draft`` overrides), so the benchmark needs the pair's models.

Each diff runs in a fresh subprocess (imports and the draft load are part of the cost a user sees), in
``--rounds`` alternating rounds after one untimed warm-up of each (page cache); prints per mode the
median time to the first divergence (``on_first``) and to the whole report, and the ratios.

    python benchmarks/reexec_cost.py                                   # the shipped seed pair
    python benchmarks/reexec_cost.py --train T.trace --serve S.trace [--draft DIR] [--rounds 5]
    python benchmarks/reexec_cost.py --build-gib 1 --dir /tmp          # a real pair of ~1 GiB a side

``--build-gib N`` records a pair of about N GiB a side with ``record train`` on the committed demo
models (random prompts of 128 tokens): training with the trained draft, "serving" with a copy whose
MLP ``down_proj`` is scaled by 1.5 (test_reexec.py's changed draft): its draft stages diverge and
re-execution proves it on the failing rows' sequences, whatever the pair's size. Deleted after
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "traces" / "examples" / "seed"

#: one timed diff in a fresh interpreter: argv = train, serve, narrow (0/1), draft or ""; prints json
PROBE = """
import json, sys, time
t0 = time.perf_counter()
from specdiff.replay.diff.pipeline import diff_traces
train, serve, narrow, draft = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] or None
first = []
r = diff_traces(train, serve, narrow=narrow, draft_path=draft, on_first=lambda e: first.append(time.perf_counter()))
t1 = time.perf_counter()
print(json.dumps({"total": t1 - t0, "first": (first[0] - t0) if first else None,
                  "verdict": r.verdict()[:120], "reexec": r.reexecution is not None}))
"""


def _one(train: str, serve: str, narrow: bool, draft: str | None) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, train, serve, "1" if narrow else "0", draft or ""],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"reexec_cost: the diff failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build_pair(root: Path, gib: float) -> tuple[str, str]:
    """(train, serve) traces of about ``gib`` GiB a side under ``root`` (module doc)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from specdiff.demo.run import REPO_MODELS
    from specdiff.replay.record.record_train import record_train

    draft = root / "draft-mlp"
    shutil.copytree(REPO_MODELS / "draft", draft)
    f = next(draft.glob("*.safetensors"))
    w = load_file(str(f))
    key = next(k for k in w if k.endswith("mlp.down_proj.weight"))
    w[key] = w[key] * 1.5
    save_file(w, str(f), metadata={"format": "pt"})
    vocab = json.loads((REPO_MODELS / "target" / "config.json").read_text())["vocab_size"]

    def prompts(n: int, seed: int) -> Path:
        import numpy as np

        rng = np.random.default_rng(seed)
        out = root / f"prompts-{n}.jsonl"
        out.write_text("".join(json.dumps({"input_ids": rng.integers(4, vocab, 128).tolist()}) + "\n" for _ in range(n)))
        return out

    sizes = []  # bytes a sequence takes, to size the pair: the slope of two probes (a trace has a fixed part)
    for k in (16, 48):
        probe = root / f"probe-{k}.trace"
        record_train(REPO_MODELS / "target", REPO_MODELS / "draft", str(probe), prompts=prompts(k, 1),
                     probe_positions=0, noise_floor=False)
        sizes.append(_du(probe))
        shutil.rmtree(probe)
    n = max(16, int(gib * 2**30 / max((sizes[1] - sizes[0]) / 32, 1)))
    train, serve = root / "train.trace", root / "serve.trace"
    print(f"recording {n} sequences of 128 tokens a side (~{gib:g} GiB each)", flush=True)
    record_train(REPO_MODELS / "target", REPO_MODELS / "draft", str(train), prompts=prompts(n, 2), probe_positions=0,
                 noise_floor=False)
    record_train(REPO_MODELS / "target", draft, str(serve), replay=str(train), probe_positions=0, noise_floor=False)
    print(f"pair built: training {_du(train) / 2**30:.2f} GiB, serving {_du(serve) / 2**30:.2f} GiB", flush=True)
    return str(train), str(serve)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", default=str(SEED / "train.trace"), help="training trace (default: the seed pair's)")
    ap.add_argument("--serve", default=str(SEED / "serve.trace"), help="serving trace (default: the seed pair's)")
    ap.add_argument("--draft", default=None, help="the draft as trained (default: the contract's draft_name)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per mode (default 3)")
    ap.add_argument("--build-gib", type=float, default=None, help="record a real pair of about this size a side")
    ap.add_argument("--dir", default=None, help="where --build-gib records (default: the system temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the pair --build-gib recorded")
    a = ap.parse_args()
    if a.build_gib:
        import shutil
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="specdiff-reexec-", dir=a.dir))
        try:
            a.train, a.serve = build_pair(root, a.build_gib)
            _measure(a)
        finally:
            if a.keep:
                print(f"kept: {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
        return
    _measure(a)


def _measure(a) -> None:
    """The side-by-side rounds on ``a.train`` / ``a.serve`` (module doc)."""
    for narrow in (False, True):  # warm the page cache and the imports' byte code
        _one(a.train, a.serve, narrow, a.draft)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(a.rounds):
        for narrow in ((False, True) if i % 2 == 0 else (True, False)):
            runs[narrow].append(_one(a.train, a.serve, narrow, a.draft))
            print(f"round {i + 1} {'re-execution' if narrow else 'no re-run   '}: "
                  f"{runs[narrow][-1]['total']:.2f} s", flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) if all(r[m] is not None for r in v) else None
               for m in ("total", "first")} for k, v in runs.items()}
    print(f"pair: {a.train} vs {a.serve}")
    print(f"verdict: {runs[True][-1]['verdict']}")
    for key, words in ((False, "diff --no-narrow     "), (True, "diff (re-execution)  ")):
        m = med[key]
        first = f"{m['first']:.2f} s" if m["first"] is not None else "no divergence"
        print(f"{words} first divergence {first}, whole report {m['total']:.2f} s")
    ratio = med[True]["total"] / med[False]["total"]
    print(f"re-execution / no re-run, whole report: {ratio:.2f}x"
          + ("" if runs[True][-1]["reexec"] else " (no draft stage needed re-execution on this pair)"))
    if med[True]["first"] is not None and med[False]["first"] is not None:
        print(f"re-execution / no re-run, first divergence: {med[True]['first'] / med[False]['first']:.2f}x")


if __name__ == "__main__":
    main()
