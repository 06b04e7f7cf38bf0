"""What the app shows, as a user first met it on the shipped pair at 120x40 and 80x24: the detail pane's
|x-y| sparkline is the row's data to its last element, the header says which depths the grid shows
whoever opened them, an export says what it writes and shows its progress, and a small terminal still
shows most of the pipeline's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specdiff.tui import panes
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.export import export_slice
from specdiff.tui.grid import PipelineGrid
from specdiff.tui.view import Sel

SEED = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"
pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(not (SEED / "serve.trace").exists(), reason="the shipped seed pair is absent")]


def _app(tmp_path) -> SpecdiffApp:
    return SpecdiffApp(str(SEED / "train.trace"), str(SEED / "serve.trace"), export_root=tmp_path)


def test_the_sparkline_pools_every_element_and_pads_nothing():
    # 256 elements into 120 points: bins of 2 or 3, every element in one, the last point the row's end
    d = np.zeros(256)
    d[-1] = 7.0
    pooled = panes._pool(d)
    assert len(pooled) == 120 and pooled[-1] == 7.0 and sum(pooled) == 7.0
    ramp = np.arange(1.0, 257.0)
    assert panes._pool(ramp)[-1] == 256.0 and min(panes._pool(ramp)) > 0  # no zero bin of padding
    assert panes._pool(np.arange(5.0)) == [0.0, 1.0, 2.0, 3.0, 4.0]  # short rows are drawn as they are


async def test_the_sparkline_ends_with_the_rows_data_and_the_header_says_which_depths_are_open(tmp_path, tui):
    app = _app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        comp = app.report.comparisons[app.sel.name]
        i = comp.first_failing_row
        x = app.report.traces.x.take_float(app.sel.name, comp.match.rows.x[i:i + 1])[0].astype(np.float64)
        y = app.report.traces.y.take_float(app.sel.name, comp.match.rows.y[i:i + 1])[0].astype(np.float64)
        d = np.abs(x - y)
        spark = app.query_one("#spark").data
        assert x.size == 256 and len(spark) == 120  # pooled: bins of 2 or 3 elements
        assert spark[-1] == pytest.approx(d[-2:].max()) and spark[-1] > 0  # the row's last elements, not padding
        assert max(spark) == pytest.approx(d.max())
        # the header follows the grid: a selection at depth >= 1 opens the depth rows, and it says so
        assert "depths: 0 only" in tui.static_text(app, "#title") and not app.depths
        r = app.report
        deep = next(Sel(n, int(r.comparisons[n].match.depth[i]), int(r.comparisons[n].match.pair[i]),
                        int(r.comparisons[n].match.pos[i]))
                    for n, i in r.divergences if r.comparisons[n].match.depth[i] > 0)
        app.select(deep)  # what n / ] / the first divergence do when the row they go to is deeper
        await pilot.pause()
        assert app.depths and any(row.depth > 0 for row in app.query_one(PipelineGrid).rows)
        assert "depths: all" in tui.static_text(app, "#title")


async def test_the_app_says_what_it_exports_at_once_and_fills_the_progress_bar(tmp_path, tui):
    app = _app(tmp_path)
    said = tui.notices(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("e")
        await tui.wait_for(pilot, lambda: app.screen.query("#export-dir"))
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.exported is not None)
        total = len(app.report.traces.x.names) + len(app.report.traces.y.names)
        assert said[0] == (f"exporting seq 0: both sides' rows of {total} tensors into a new folder under "
                           f"{tmp_path}…")
        assert said[-1] == f"exported to {app.exported}" and app.exporting is None
        bar = app.query_one("#progress")
        assert (bar.total, bar.progress) == (total, total) and bar.has_class("done")
        calls = []  # the bar's steps: one a tensor of each side
        export_slice(app.vm, app.sel, root=tmp_path / "again", progress=lambda done, n: calls.append((done, n)))
        assert calls == [(k, total) for k in range(1, total + 1)]


async def test_a_small_terminal_shows_most_of_the_pipeline(tmp_path, tui):
    app = _app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await app.workers.wait_for_complete()
        await pilot.pause()
        grid = app.query_one(PipelineGrid)
        shown = grid.scrollable_content_region.height - 1  # the position header is the grid's first line
        assert len(grid.rows) == 16 and shown >= 9, shown  # was 4 of 16 with the 120x40 layout
        assert not app.query_one("#legend").display  # the keys screen (?) explains every cell symbol
        detail = app.query_one("#detail")
        assert detail.region.height >= 6 and detail.region.bottom <= 23  # the detail pane stays, above the footer
