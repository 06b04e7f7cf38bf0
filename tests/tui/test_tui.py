"""The interactive diff (``specdiff view``): pilot tests on small synthetic trace pairs, and SVG
snapshots of the main screen (pytest-textual-snapshot; update with ``--snapshot-update``).

Pairs come from the ``aux_traces`` fixture (tests/support/aux_traces.py): the seed bug (training HF [0, 3, 6] with layer
probes vs serving HF [3, 6, 7]) and a correct pair (same layers, other row order, noise).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.tracer.store import open_trace
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.grid import PipelineGrid
from specdiff.tui.screens import ErrorScreen
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
        # the header names the cause; the Explain pane says it in full, once; the fix has its own line
        assert verdict.strip() == "first divergence: target.aux.0 at seq 0 pos 0 — aux_layer_shift"
        assert tui.static_text(app, "#fix").startswith("fix: set the draft config's eagle_config")
        assert app.query_one("#fix").display and not app.query_one("#alert").display
        # the grid row of the first divergence carries the marker, its cell the ▶ lead
        line = "".join(seg.text for seg in grid.render_line(1 + grid.rows.index(next(
            r for r in grid.rows if r.name == "target.aux.0"))))
        assert line.startswith("▶ target.aux.0") and "▶✗" in line
        assert "aux_layer_shift" in tui.static_text(app, "#explain-body")
        await pilot.press("q")
    assert app.return_code == 1


async def test_n_and_N_move_between_failing_tensors_and_brackets_between_their_rows(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        report = app.report
        expected = []
        for name, i in report.divergences:
            m = report.comparisons[name].match
            expected.append(Sel(name, int(m.depth[i]), int(m.pair[i]), int(m.pos[i])))
        tensors = list(dict.fromkeys(s.name for s in expected))
        firsts = [next(s for s in expected if s.name == n) for n in tensors]
        assert expected[0] == app.sel and len(tensors) > 2
        for want in firsts[1:]:  # n: the next diverged tensor, on its first failing row
            await pilot.press("n")
            assert app.sel == want
        await pilot.press("n")
        assert app.sel == firsts[0]  # wraps around
        await pilot.press("N")
        assert app.sel == firsts[-1]
        await pilot.press("f")
        rows = [s for s in expected if s.name == expected[0].name]
        assert len(rows) > 3
        for want in rows[1:4]:  # ]: the next failing row of the same tensor
            await pilot.press("right_square_bracket")
            assert app.sel == want
        await pilot.press("left_square_bracket")
        assert app.sel == rows[2]
        await pilot.press("f", "left_square_bracket")
        assert app.sel == rows[-1]  # wraps around within the tensor
        await pilot.press("question_mark")
        help_text = tui.static_text(app.screen, "#help")
        assert "next / previous diverged tensor" in help_text and "next / previous failing row" in help_text


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


async def test_export_asks_for_a_folder_and_never_overwrites_an_earlier_export(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair)  # no export_root: the default is under the first trace's folder
    chosen = tmp_path / "chosen"
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("e")
        await tui.wait_for(pilot, lambda: app.screen.query("#export-dir"))
        box = app.screen.query_one("#export-dir")
        assert box.value == str(tmp_path / "specdiff-exports")  # seed_pair's traces lie in tmp_path
        box.value = str(chosen)
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.exported is not None)
        first = app.exported
        await pilot.press("e")
        await tui.wait_for(pilot, lambda: app.screen.query("#export-dir"))
        assert app.screen.query_one("#export-dir").value == str(chosen)  # the folder chosen last
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.exported != first)
        second = app.exported
        await pilot.press("e")
        await tui.wait_for(pilot, lambda: app.screen.query("#export-dir"))
        await pilot.press("escape")  # cancels: nothing written
        await pilot.pause()
        assert app.exported == second
    assert first == chosen / "specdiff-export-target.aux.0-seq0-pos0-depth0"
    assert second == chosen / "specdiff-export-target.aux.0-seq0-pos0-depth0-2"
    assert sorted(p.name for p in chosen.iterdir()) == [first.name, second.name]
    full = [open_trace(p) for p in seed_pair]
    for out in (first, second):
        a, b = open_trace(str(out / "a.trace")), open_trace(str(out / "b.trace"))
        assert a.side == "train" and b.side == "serve"
        # every tensor of the sequence, the explanation's evidence (the training side's probes) too
        assert (a.names, b.names) == (full[0].names, full[1].names) and any(n.startswith("target.probe.") for n in a.names)
        assert a.rows("target.aux.0") == 11 and len(a.sequences) == len(b.sequences) == 1  # seq 0: 12 tokens
        metrics = json.loads((out / "metrics.json").read_text())
        assert (metrics["tensor"], metrics["seq"], metrics["pos"], metrics["depth"]) == ("target.aux.0", 0, 0, 0)
        assert metrics["cell"]["status"] == "diverged"
    # re-diffed, the slice names the full pair's cause (it said "no known cause" with one tensor only)
    again = diff_traces(str(first / "a.trace"), str(first / "b.trace"))
    assert again.first.name == "target.aux.0"
    assert [e.cause for e in again.explanations][:1] == [e.cause for e in app.report.explanations][:1] == ["aux_layer_shift"]


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
    """The app paints before torch loads (replay imports it)."""
    import subprocess

    code = "import sys, specdiff.tui.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_view_command_is_registered(run_cli):
    result = run_cli("view", "--help")
    assert result.exit_code == 0 and "TRACE_A" in result.output


# ---- snapshots ------------------------------------------------------------------------------
#: Pairs of the main-screen snapshots: (training, serving) arguments of :meth:`AuxTraces.write`.
SNAPSHOT_SCENARIOS = {
    "seed_bug": ({"hf": [0, 3, 6], "probes": True}, {"hf": [3, 6, 7]}),
    "no_divergence": ({"hf": [0, 3, 6], "probes": True}, {"hf": [0, 3, 6], "order": [1, 0], "noise": 2e-4}),
}


@pytest.fixture(scope="module")
def snapshot_app(aux_traces):
    """``snapshot_app(scenario)`` -> a ``SpecdiffApp`` on that pair. The traces go to a fixed folder
    (not a random temp dir) and the app shows only their basenames, so the rendered screen is the
    same on every machine."""
    root = Path(tempfile.gettempdir()) / "specdiff-snapshot-traces"

    def build(scenario: str) -> SpecdiffApp:
        train, serve = SNAPSHOT_SCENARIOS[scenario]
        where = root / scenario
        where.mkdir(parents=True, exist_ok=True)
        a = aux_traces.write(where / "train.trace", side="train", **train)
        b = aux_traces.write(where / "serve.trace", side="serve", **serve)
        return SpecdiffApp(a, b, export_root=where)

    return build


@pytest.fixture
def until_ready(tui):
    async def run_before(pilot):
        await tui.wait_for(pilot, tui.ready(pilot.app))
        # under load (CI's 2 busy workers) one 80x24 snapshot caught a frame before the last
        # layout pass: let the diff worker finish and two refreshes run before the screenshot
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
@pytest.mark.parametrize("scenario", ["seed_bug", "no_divergence"])
def test_main_screen_snapshot(snap_compare, snapshot_app, until_ready, scenario, size):
    assert snap_compare(snapshot_app(scenario), terminal_size=size, run_before=until_ready)


# ---- the shipped example pair (traces/examples/seed): what a newcomer sees first ----------------
EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"
needs_example = pytest.mark.skipif(not (EXAMPLE / "serve.trace").exists(), reason="the shipped example pair is absent")


def _example_app(tmp_path=None) -> SpecdiffApp:
    return SpecdiffApp(str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace"), export_root=tmp_path)


def _assert_the_fix_is_whole_on_screen(app, size, tui) -> None:
    fix = app.query_one("#fix")
    assert " ".join(tui.static_text(app, "#fix").split()) == f"fix: {' '.join(app.report.explanations[0].fix.split())}"
    # every line of it is drawn: the widget is tall enough for its wrapped text and lies on screen
    assert fix.region.height == len(tui.plain(fix.content, width=fix.content_region.width).splitlines())
    assert 0 <= fix.region.y and fix.region.bottom <= size[1] - 1  # above the footer


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
async def test_the_fix_is_whole_on_screen_on_the_seed_bug_pair(seed_pair, tmp_path, size, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=size) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        _assert_the_fix_is_whole_on_screen(app, size, tui)


def _scroll_explain_to_the_table(app, tui) -> None:
    """Scroll the Explain pane so the layer-match table (the verdict's evidence) starts at its top."""
    from specdiff.tui import panes

    pane = app.query_one("#explain")
    lines = tui.plain(panes.explain(app.vm), width=pane.scrollable_content_region.width).splitlines()
    pane.scroll_to(y=next(i for i, line in enumerate(lines) if line.startswith("rel err: slot vs HF")),
                   animate=False, immediate=True)


@needs_example
@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
async def test_the_fix_is_on_screen_without_scrolling_on_the_shipped_pair(size, tmp_path, tui):
    app = _example_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        _assert_the_fix_is_whole_on_screen(app, size, tui)
        verdict = tui.static_text(app, "#verdict").strip()
        assert verdict == "first divergence: target.aux.0 at seq 0 pos 0 — aux_layer_shift"
        assert app.query_one("#verdict").region.height == 1


@needs_example
async def test_the_layer_match_table_reads_at_120_columns_on_the_shipped_pair(tmp_path, tui):
    app = _example_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        _scroll_explain_to_the_table(app, tui)
        await pilot.pause()
        m = app.report.explanations[0].matrix
        shown = tui.plain(app.query_one("#explain-body").content,
                          width=app.query_one("#explain").scrollable_content_region.width)
        table = shown.split("rel err: slot vs HF", 1)[1].split("\n\n", 1)[0]
        assert "…" not in table
        # one row per HF layer, one column per serving slot, every number whole
        for k, col in enumerate(m["cols"]):
            row = next(line.split() for line in table.splitlines() if line.strip().startswith(col))
            assert row == [col, *[f"{m['rel'][j][k]:.2g}" for j in range(len(m["rows"]))]]
        assert "slot 0" in table and "serving slot" not in table.split("\n", 2)[-1]


@needs_example
@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_shipped_pair_snapshot_shows_the_fix(snap_compare, until_ready, size):
    # the header: the verdict by cause name, then the fix, both whole, above the grid
    assert snap_compare(_example_app(), terminal_size=size, run_before=until_ready)


@needs_example
def test_shipped_pair_snapshot_shows_the_layer_match_table(snap_compare, tui):
    async def run_before(pilot):
        await tui.wait_for(pilot, tui.ready(pilot.app))
        # under load (CI's 2 busy workers) one 80x24 snapshot caught a frame before the last
        # layout pass: let the diff worker finish and two refreshes run before the screenshot
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        _scroll_explain_to_the_table(pilot.app, tui)
        await pilot.pause()

    assert snap_compare(_example_app(), terminal_size=(120, 40), run_before=run_before)


@needs_example
async def test_d_says_why_the_deeper_rows_are_empty_on_the_shipped_pair(tmp_path, tui):
    app = _example_app(tmp_path)
    said = tui.notices(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("d")
        assert "depths: all" in tui.static_text(app, "#title")
        coverage = app.report.traces.y.contract["depth_coverage"]
        assert said == [f"serving: {coverage}"]
        # a '-' cell of a depth sub-row says the same in the detail pane
        await pilot.press("up", "up")  # target.aux.0 -> tokens' depth 2 -> depth 1 sub-row
        assert app.sel == Sel("tokens", 1, 0, 0)
        assert coverage in " ".join(tui.static_text(app, "#detail-body").split())
        await pilot.press("d")
        assert "depths: 0 only" in tui.static_text(app, "#title") and app.sel.depth == 0


@needs_example
async def test_the_explain_pane_shows_the_serving_rows_left_out_on_the_shipped_pair(tmp_path, tui):
    """Serving's rows left out (compare/accounting.py), as the text report's section: the shipped pair's 450 of
    7,635 rows, all off training's path at depths 1 and 2, never counted as agreement; scrolled to, the section
    lies whole in the pane."""
    app = _example_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("x")
        pane = app.query_one("#explain")
        lines = [line.rstrip() for line in tui.plain(app.query_one("#explain-body").content,
                                                      width=pane.scrollable_content_region.width).splitlines()]
        top = lines.index("Serving rows left out")
        section = lines[top:(lines + [""]).index("", top)]
        acc = app.report.serving_rows
        assert (acc.left, acc.rows) == (450, 7635)
        assert section[1:5] == ["450 of 7635 rows (6%), never counted as agreement",
                                " depth  left out  why",
                                " 2      31 of 93  off training's path",
                                " 1      14 of 93  off training's path"]  # least compared first
        assert " ".join(" ".join(section[5:]).split()).startswith(
            "at depth 2, 1: tokens, draft.hidden_in, draft.positions, draft.attn_in, draft.hidden_out, ")
        assert "off training's path: the draft was fed another token than training feeds" in " ".join(section)
        pane.scroll_to(y=top, animate=False, immediate=True)
        await pilot.pause()
        assert pane.scroll_y <= top and top + len(section) <= pane.scroll_y + pane.scrollable_content_region.height


async def test_a_pair_with_every_row_compared_shows_no_left_out_section(correct_pair, tmp_path, tui):
    app = SpecdiffApp(*correct_pair, export_root=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert app.report.serving_rows.left == 0
        assert "rows left out" not in tui.static_text(app, "#explain-body")
