"""How fast the ``specdiff`` CLI answers, side by side: ``--version`` (click and the package's version
only), ``--help`` (every subcommand's module imported for its one-line help), ``diff --help`` and
``info TRACE`` (reads a trace: zarr and its bfloat16 data type, no torch).

Each command runs in a fresh Python process (``python -m specdiff.tui ...``), ``--repeats`` times,
round-robin so a busy machine slows all of them alike; prints the median and fastest wall time of
each and the median's ratio to ``--version``'s. The CLI imports torch, transformers and SGLang only
inside the commands that need them (tests/tui/test_cli_startup.py asserts that by module, not time).

    python benchmarks/cli_startup.py                      # the shipped seed trace for info
    python benchmarks/cli_startup.py --repeats 9 --trace path/to/serve.trace
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(trace: str) -> dict[str, list[str]]:
    """label -> the CLI arguments it runs."""
    return {"--version": ["--version"], "--help": ["--help"], "diff --help": ["diff", "--help"],
            "info TRACE": ["info", trace]}


def run_once(args: list[str]) -> float:
    """Wall seconds of ``python -m specdiff.tui ARGS`` from launch to exit (raises on exit >= 2)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "specdiff.tui", *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if done.returncode >= 2:
        raise SystemExit(f"specdiff {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs of each command (default 5)")
    ap.add_argument("--trace", default=str(ROOT / "traces" / "examples" / "seed" / "serve.trace"),
                    help="the trace for info (default: the shipped seed pair's serving trace)")
    args = ap.parse_args()
    cmds = commands(args.trace)
    times: dict[str, list[float]] = {label: [] for label in cmds}
    for _ in range(args.repeats):
        for label, argv in cmds.items():
            times[label].append(run_once(argv))
    base = statistics.median(times["--version"])
    print(f"specdiff CLI start-up, {args.repeats} fresh processes each (python {sys.version.split()[0]}):")
    print(f"  {'command':14s} {'median':>8s} {'fastest':>8s} {'x --version':>12s}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"  {label:14s} {med:7.2f}s {min(ts):7.2f}s {med / base:11.1f}x")


if __name__ == "__main__":
    main()
