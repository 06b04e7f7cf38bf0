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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", default=str(SEED / "train.trace"), help="training trace (default: the seed pair's)")
    ap.add_argument("--serve", default=str(SEED / "serve.trace"), help="serving trace (default: the seed pair's)")
    ap.add_argument("--draft", default=None, help="the draft as trained (default: the contract's draft_name)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per mode (default 3)")
    a = ap.parse_args()
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
