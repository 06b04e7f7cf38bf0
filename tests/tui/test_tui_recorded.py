"""The app on traces recorded by the real recorders: the shipped seed-scenario pair
(traces/examples/seed: a CPU SGLang 0.5.23 server traced by the plugin + `specdiff record train`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specdiff.tracer.store import open_trace
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.view import Sel

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"
pytestmark = pytest.mark.anyio


async def test_recorded_seed_pair_opens_on_the_layer_shift(tmp_path, tui):
    app = SpecdiffApp(str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace"), export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, lambda: app.vm is not None and app.sel is not None, timeout=120)
        assert app.sel == Sel("target.aux.0", 0, 0, 0)
        # the header names the cause; the Explain pane says it in full, with the fix
        assert tui.static_text(app, "#verdict").startswith(
            "first divergence: target.aux.0 at seq 0 pos 0 — aux_layer_shift")
        explain = " ".join(tui.static_text(app, "#explain-body").split())  # the pane wraps
        assert "serving slot 0 = training HF hidden_states[3]" in explain
        assert "[-1, 2, 5]" in tui.static_text(app, "#fix")  # the fix has its own line in the header
        comp = app.report.comparisons["target.aux.0"]
        body = tui.static_text(app, "#detail-body")
        assert f"{comp.stats['fail_rows']}/{comp.stats['rows']} rows fail" in body
        assert "tolerance rel ≤ 0.05  cos ≥ 0.995" in body  # bf16 traces: bf16 tolerance
        # ] walks to the next failing row of the same tensor
        await pilot.press("]")
        assert app.sel.name == "target.aux.0" and (app.sel.pair, app.sel.pos) != (0, 0)
        await pilot.press("f", "e")
        await tui.wait_for(pilot, lambda: app.screen.query("#export-dir"))
        await pilot.press("enter")
        # the export runs in a worker and renames its folder into place once whole (tui/export.py)
        await tui.wait_for(pilot, lambda: any(tmp_path.glob("specdiff-export-*/b.trace")), timeout=60)
        export = next(tmp_path.glob("specdiff-export-*"))
        assert open_trace(str(export / "b.trace")).rows("target.aux.0") > 0
        await pilot.press("q")
    assert app.return_code == 1


def test_view_on_an_unreadable_trace_is_one_line_not_an_app(tmp_path):
    import subprocess

    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00not a trace")
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "view", str(junk), str(EXAMPLE / "serve.trace")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("specdiff: error: ") and proc.stderr.count("\n") == 1
    assert proc.stdout == ""

