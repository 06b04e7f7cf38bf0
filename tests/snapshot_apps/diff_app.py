"""Snapshot fixture apps: the seed-bug and the no-divergence pairs, built deterministically.

The traces go to a fixed folder (not a random temp dir) and the app shows only their basenames,
so the rendered screen is the same on every machine. ``textual run tests/snapshot_apps/diff_app.py``
opens the seed-bug scenario by hand.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_diff_engine import write_trace  # noqa: E402

from specdiff.tui.app import SpecdiffApp  # noqa: E402

ROOT = Path(tempfile.gettempdir()) / "specdiff-snapshot-traces"
SCENARIOS = {
    "seed_bug": ({"hf": [0, 3, 6], "probes": True}, {"hf": [3, 6, 7]}),
    "no_divergence": ({"hf": [0, 3, 6], "probes": True}, {"hf": [0, 3, 6], "order": [1, 0], "noise": 2e-4}),
}


def build_traces(scenario: str) -> tuple[str, str]:
    train, serve = SCENARIOS[scenario]
    where = ROOT / scenario
    where.mkdir(parents=True, exist_ok=True)
    return (write_trace(where / "train.trace", side="train", **train),
            write_trace(where / "serve.trace", side="serve", **serve))


def build(scenario: str) -> SpecdiffApp:
    a, b = build_traces(scenario)
    return SpecdiffApp(a, b, export_root=ROOT / scenario)


app = build(os.environ.get("SPECDIFF_SNAPSHOT_SCENARIO", "seed_bug"))
