"""The interactive diff (``specdiff view``): pilot tests on small synthetic trace pairs, and SVG
snapshots of the main screen (pytest-textual-snapshot; update with ``--snapshot-update``).

Pairs come from the ``aux_traces`` fixture (tests/conftest.py): the seed bug (training HF [0, 3, 6] with layer
probes vs serving HF [3, 6, 7]) and a correct pair (same layers, other row order, noise).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from specdiff.replay.diff.report import diff_traces
from specdiff.tracer.store import open_trace
from specdiff.tui.app import ErrorScreen, SpecdiffApp
from specdiff.tui.grid import PipelineGrid
from specdiff.tui.view import Sel

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


@pytest.fixture
def seed_pair(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "train.trace", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[3, 6, 7])
    return a, b


@pytest.fixture
def correct_pair(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "train.trace", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[0, 3, 6], order=[1, 0], noise=2e-4)
    return a, b


async def test_seed_bug_opens_on_the_first_divergence(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert app.sel == Sel("target.aux.0", 0, 0, 0)
        grid = app.query_one(PipelineGrid)
        assert grid.selection == app.sel and grid.has_focus
        verdict = tui.static_text(app, "#verdict")
        assert verdict.startswith("first divergence: target.aux.0 at seq 0 pos 0 — serving slot 0")
        # the grid row of the first divergence carries the marker, its cell the ▶ lead
        line = "".join(seg.text for seg in grid.render_line(1 + grid.rows.index(next(
            r for r in grid.rows if r.name == "target.aux.0"))))
        assert line.startswith("▶ target.aux.0") and "▶✗" in line
        assert "aux_layer_shift" in tui.static_text(app, "#explain-body")
        await pilot.press("q")
    assert app.return_code == 1


async def test_n_and_N_walk_the_divergences_in_report_order(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        report = app.report
        expected = []
        for name, i in report.divergences:
            m = report.comparisons[name].match
            expected.append(Sel(name, int(m.depth[i]), int(m.pair[i]), int(m.pos[i])))
        assert expected[0] == app.sel and len(expected) == 57
        for want in expected[1:6]:
            await pilot.press("n")
            assert app.sel == want
        for want in reversed(expected[1:5]):
            await pilot.press("N")
            assert app.sel == want
        await pilot.press("N", "N")
        assert app.sel == expected[-1]  # wraps around
        await pilot.press("f")
        assert app.sel == expected[0]


async def test_detail_pane_shows_the_reports_numbers(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        comp = app.report.comparisons["target.aux.0"]
        i = comp.first_failing_row
        body = tui.static_text(app, "#detail-body")
        assert "target.aux.0  seq 0 pos 0 depth 0  ✗ diverged" in body
        assert f"rel err {comp.score[i]:.4g}   cos {comp.cos[i]:.4g}" in body
        assert "tolerance rel ≤ 0.001  cos ≥ 0.99999  fail ≤ 0.02" in body  # float32 default
        assert f"{comp.stats['fail_rows']}/{comp.stats['rows']} rows fail" in body
        values = tui.static_text(app, "#detail-values")
        x = app.report.traces.x.take_float("target.aux.0", comp.match.rows.x[i:i + 1])[0]
        y = app.report.traces.y.take_float("target.aux.0", comp.match.rows.y[i:i + 1])[0]
        e = int(np.argmax(np.abs(x - y)))
        assert f"values at the worst element {e} of {x.size}" in values
        assert f"▶ {e}" in values and f"{x[e]:.4g}" in values and f"{y[e]:.4g}" in values
        spark = app.query_one("#spark")
        assert len(spark.data) == x.size and max(spark.data) == pytest.approx(abs(x[e] - y[e]))
        # ids rows: both sides' lists
        await pilot.press("up", "up")
        assert app.sel.name == "tokens"
        assert "training" in tui.static_text(app, "#detail-values")


async def test_depth_toggle_filter_and_tolerance_cycle(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        grid = app.query_one(PipelineGrid)
        assert all(r.depth == 0 for r in grid.rows)
        await pilot.press("d")
        assert any(r.name == "draft.topk" and r.depth == 1 for r in grid.rows)
        await pilot.press("slash", *"topk")
        assert {r.name for r in grid.rows} == {"draft.topk", "draft.topk_target"}
        await pilot.press("escape")
        assert "tokens" in {r.name for r in grid.rows}
        await pilot.press("t")
        await tui.wait_for(pilot, lambda: app.preset == "loose")
        assert app.report.comparisons["target.aux.0"].tolerance.rel == pytest.approx(5e-3)
        assert app.sel is not None


async def test_export_writes_a_readable_store_and_metrics(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path / "out")
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("e")
        await tui.wait_for(pilot, lambda: app.exported is not None)
    out = app.exported
    assert out.name == "specdiff-export-target.aux.0-0-0"
    a, b = open_trace(str(out / "a.trace")), open_trace(str(out / "b.trace"))
    assert a.side == "train" and b.side == "serve"
    assert a.names == b.names == ["target.aux.0"] and a.rows("target.aux.0") == 11  # seq 0: 12 tokens
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tensor"] == "target.aux.0" and metrics["cell"]["status"] == "diverged"
    assert diff_traces(str(out / "a.trace"), str(out / "b.trace")).first.name == "target.aux.0"


async def test_correct_pair_shows_no_divergence(correct_pair, tmp_path, tui):
    app = SpecdiffApp(*correct_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert tui.static_text(app, "#verdict").startswith("no divergence")
        assert app.sel == Sel("tokens", 0, 0, 0)
        await pilot.press("n")
        assert app.sel == Sel("tokens", 0, 0, 0)
        await pilot.press("q")
    assert app.return_code == 0


async def test_corrupt_trace_shows_an_error_screen_not_a_traceback(seed_pair, tmp_path, tui):
    bad = tmp_path / "bad.trace"
    bad.mkdir()
    (bad / "zarr.json").write_text("{ not json")
    app = SpecdiffApp(seed_pair[0], str(bad), export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen))
        assert "not a specdiff trace" in tui.plain(app.screen.query_one("#error").content)
        await pilot.press("q")
    assert app.return_code == 2


async def test_traces_with_no_common_sequence_show_an_error_screen(tmp_path, tui, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], seqs=[np.arange(500, 510), np.arange(600, 607)])
    app = SpecdiffApp(a, b, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen))
        assert "share no token sequence" in tui.plain(app.screen.query_one("#error").content)
        await pilot.press("q")
    assert app.return_code == 2


def test_app_module_does_not_load_the_diff_engine_before_painting():
    """The app paints before torch loads (replay imports it); SKIP mirrors replay.compare's."""
    import subprocess

    code = "import sys, specdiff.tui.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from specdiff.replay.diff.compare import SKIP
    from specdiff.tui import view

    assert view.SKIP == SKIP


def test_view_command_is_registered(run_cli):
    result = run_cli("view", "--help")
    assert result.exit_code == 0 and "TRACE_A" in result.output


# ---- snapshots ------------------------------------------------------------------------------
@pytest.fixture
def until_ready(tui):
    async def run_before(pilot):
        await tui.wait_for(pilot, tui.ready(pilot.app))

    return run_before


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
@pytest.mark.parametrize("scenario", ["seed_bug", "no_divergence"])
def test_main_screen_snapshot(snap_compare, snapshot_app, until_ready, scenario, size):
    assert snap_compare(snapshot_app(scenario), terminal_size=size, run_before=until_ready)
