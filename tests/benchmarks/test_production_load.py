"""benchmarks/production_load.py's smoke run (``--quick``: the tiny shape, a 2 MiB ring, 8x the writer's
measured rate, then sampled at 0.1): a real writer process that cannot keep up drops whole requests only.

The writer is held back (``SPECDIFF_WRITER_TEST_DELAY_S``: it sleeps before each item, child.py), so it
handles at most a few items a second whatever the machine's load while the serving thread submits one or
two a tick: drops happen by design. No rate or fraction is asserted (a shared machine's timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "production_load.py"


@pytest.mark.slow
def test_a_writer_far_behind_drops_whole_requests_only(tmp_path):
    out = tmp_path / "load.json"
    env = {**os.environ, "SPECDIFF_WRITER_TEST_DELAY_S": "0.3"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out), "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    full, sampled = json.loads(out.read_text())
    assert (full["multiple"], full["sample"], sampled["multiple"], sampled["sample"]) == (8.0, None, 8.0, 0.1)
    for run in (full, sampled):
        assert run["closed"] and not run["writer_failed"] and run["writer_live"] == 0, run
        # the closed trace lists exactly the requests the serving side dropped
        assert run["lists_match"], run
        # every request recorded and not dropped is in the trace whole: all its tokens, a target row per
        # generated token; a dropped one holds at most the tokens served before its drop
        assert run["kept_whole"] == run["kept"] == run["recorded"] - run["dropped"], run
        assert run["dropped_not_prefix"] == 0, run
    assert full["recorded"] == full["arrived"] and full["dropped"] > 0 and full["dropped_items"] > 0, full
    assert sampled["recorded"] < sampled["arrived"], sampled
    assert f"{full['dropped']:7d} {full['fraction']:8.3f}" in r.stdout, r.stdout
