"""How fast the ``specdiff`` CLI answers, side by side: ``--version`` (click and the package's version
only), ``--help`` (every subcommand's module imported for its one-line help), ``diff --help``,
``info TRACE`` (reads a trace: zarr, no ml_dtypes, no torch) and ``check`` on the shipped models
(config.json, safetensors headers and d2t / t2d through numpy, no torch).

Each command runs in a fresh Python process (``python -m specdiff.tui ...``), ``--repeats`` times,
round-robin so a busy machine slows all of them alike; prints the median and fastest wall time of
each, the median's ratio to ``--version``'s, and the median CPU time (user + system) of the process,
which a busy machine inflates far less than wall time. The CLI imports torch, transformers and SGLang
only inside the commands that need them (tests/tui/test_cli_startup.py asserts that by module, not
time).

    python benchmarks/cli_startup.py                      # the shipped seed trace for info
    python benchmarks/cli_startup.py --repeats 9 --trace path/to/serve.trace
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(trace: str, models: Path) -> dict[str, list[str]]:
    """label -> the CLI arguments it runs."""
    return {"--version": ["--version"], "--help": ["--help"], "diff --help": ["diff", "--help"],
            "info TRACE": ["info", trace],
            "check": ["check", "--target", str(models / "target"), "--draft", str(models / "draft")]}


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_once(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``python -m specdiff.tui ARGS`` from launch to exit (raises on exit >= 2)."""
    t0, c0 = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, "-m", "specdiff.tui", *args], capture_output=True, text=True)
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    if done.returncode >= 2:
        raise SystemExit(f"specdiff {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return elapsed, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs of each command (default 5)")
    ap.add_argument("--trace", default=str(ROOT / "traces" / "examples" / "seed" / "serve.trace"),
                    help="the trace for info (default: the shipped seed pair's serving trace)")
    ap.add_argument("--models", default=str(ROOT / "traces" / "models"),
                    help="directory with target/ and draft/ for check (default: the shipped tiny models)")
    args = ap.parse_args()
    cmds = commands(args.trace, Path(args.models))
    times: dict[str, list[float]] = {label: [] for label in cmds}
    cpus: dict[str, list[float]] = {label: [] for label in cmds}
    for _ in range(args.repeats):
        for label, argv in cmds.items():
            wall, cpu = run_once(argv)
            times[label].append(wall)
            cpus[label].append(cpu)
    base = statistics.median(times["--version"])
    print(f"specdiff CLI start-up, {args.repeats} fresh processes each (python {sys.version.split()[0]}):")
    print(f"  {'command':14s} {'median':>8s} {'fastest':>8s} {'x --version':>12s} {'median CPU':>11s}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"  {label:14s} {med:7.2f}s {min(ts):7.2f}s {med / base:11.1f}x {statistics.median(cpus[label]):10.2f}s")


if __name__ == "__main__":
    main()
