"""The interactive terminal diff (``specdiff view A B``): lands on the first divergence.

The app is a view of a ``DiffReport`` (replay/diff/result.py). The diff runs in a thread worker that
posts small messages back (progress, early first divergence, partial grid, ready, failed; they are
in ``messages``), so the screen paints at once, says the first divergence as soon as the rows read
prove it, and fills the grid tensor by tensor until the full report lands; re-running it with
another tolerance preset (``t``) reuses the opened traces (and keeps the previous report on screen
until the new one is ready). The error, help and export screens are in ``screens``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Input, ProgressBar, Sparkline, Static

from specdiff.tracer.errors import SpecdiffError
from specdiff.tui import keys, panes
from specdiff.tui.cli import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK
from specdiff.tui.commands import PRESETS, SpecdiffCommands
from specdiff.tui.default_dirs import default_dir
from specdiff.tui.export_actions import ExportActions
from specdiff.tui.fix_actions import FixActions
from specdiff.tui.grid import PipelineGrid, legend
from specdiff.tui.messages import DiffEarly, DiffFailed, DiffPartial, DiffProgress, DiffReady
from specdiff.tui.screens import ErrorScreen, HelpScreen
from specdiff.tui.view import Sel, ViewModel, basename, load_tokenizer

if TYPE_CHECKING:
    from specdiff.replay.diff.result import DiffReport

# The diff engine (and torch, which it imports) loads in the worker, not before the first paint.
PRESET_NAMES = tuple(PRESETS)  # replay.tolerance.PRESETS order


class Paths(NamedTuple):
    x: str
    y: str


# ---- the app ---------------------------------------------------------------------------------
class SpecdiffApp(FixActions, ExportActions, App):
    """Two traces, aligned and compared by the diff engine, shown as a pipeline grid."""

    TITLE = "specdiff"
    CSS = """
    #title { height: 1; background: $primary; color: $text; padding: 0 1; text-style: bold; }
    #alert { height: auto; max-height: 2; padding: 0 1; color: $error; text-style: bold; display: none; }
    #alert.shown { display: block; }
    #verdict { height: auto; max-height: 2; padding: 0 1; }
    #fix { height: auto; max-height: 4; padding: 0 1; color: $success; display: none; }
    #fix.shown { display: block; }
    #verdict.diverged { color: $error; text-style: bold; }
    #verdict.clean { color: $success; text-style: bold; }
    #progress { height: 1; padding: 0 1; }
    #progress.done { display: none; }
    #top { height: 1fr; min-height: 7; }
    #seq-box { width: 30%; max-width: 44; height: 1fr; border: round $primary-darken-2; }
    #seq-box:focus-within { border: round $accent; }
    #seqs { height: 1fr; }
    #prompt { height: auto; max-height: 2; color: $text-muted; }
    #grid-box { width: 1fr; border: round $primary-darken-2; }
    #grid-box:focus-within { border: round $accent; }
    #legend { height: 1; }
    #filter { display: none; }
    #filter.shown { display: block; }
    #bottom { height: 1fr; }
    #detail, #explain { width: 1fr; border: round $primary-darken-2; padding: 0 1; }
    #detail:focus-within, #explain:focus-within { border: round $accent; }
    #spark { height: 2; margin: 0 0 1 0; }
    Screen.-short #top { height: 3fr; }
    Screen.-short #bottom { min-height: 6; }
    Screen.-short #legend { display: none; }
    Screen.-short #spark { height: 1; margin: 0; }
    """
    # under 32 rows (an 80x24 terminal) the grid takes three quarters of the panes' height and the legend
    # goes (the keys screen, ?, explains every cell symbol): 9 of the shipped pair's 16 rows, not 4
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    BINDINGS = keys.BINDINGS  # tui/keys.py: the footer's, and every one on the keys screen (?)
    COMMANDS = App.COMMANDS | {SpecdiffCommands}  # specdiff's actions in the palette (tui/commands.py)

    def __init__(self, trace_a: str, trace_b: str, *, preset: str = "default", overrides: dict | None = None,
                 export_root: str | Path | None = None):
        super().__init__()
        self.paths = Paths(str(trace_a), str(trace_b))
        self.preset = preset
        self.overrides = overrides
        # exports go under the first trace's folder (the checkout's ignored specdiff-out/ for a pair inside it,
        # tui/default_dirs.py) unless the user picks another (``e``)
        self.export_root = Path(export_root) if export_root is not None else default_dir(trace_a, "specdiff-exports")
        self.traces = None  # Pair of opened traces, once the worker opened them
        self.report: DiffReport | None = None
        self.vm: ViewModel | None = None
        self.sel: Sel | None = None
        self._depths = False
        self.filter_text = ""
        self.error: str | None = None
        self.exported: Path | None = None
        self.early = None  # replay.diff.compare.early.EarlyFirst once proven, before the full report
        self.partial: ViewModel | None = None  # the grid's model while the diff runs

    # ---- layout -----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="title")
        yield Static("", id="alert")
        yield Static("opening traces…", id="verdict")
        yield Static("", id="fix")
        # determinate from the start: an indeterminate bar animates and takes the GIL from the worker
        yield ProgressBar(total=1, id="progress", show_eta=False)
        with Horizontal(id="top"):
            with Vertical(id="seq-box") as box:
                box.border_title = "Sequences"
                yield DataTable(id="seqs", cursor_type="row", zebra_stripes=False)
                yield Static("", id="prompt")
            with Vertical(id="grid-box") as box:
                box.border_title = "Pipeline"
                yield Input(placeholder="filter tensors (escape clears)", id="filter")
                yield PipelineGrid(id="grid")
                yield Static(legend(), id="legend")
        with Horizontal(id="bottom"):
            with VerticalScroll(id="detail") as det:
                det.border_title = "Detail"
                yield Static("", id="detail-body")
                yield Sparkline([], id="spark")
                yield Static("", id="detail-values")
            with VerticalScroll(id="explain") as ex:
                ex.border_title = "Explain"
                yield Static("", id="explain-body")
        yield Footer()

    @property
    def depths(self) -> bool:
        """Whether the grid shows the rows of every draft depth (``d``), not depth 0 only."""
        return self._depths

    @depths.setter
    def depths(self, shown: bool) -> None:
        # the header says it whoever opens them: ``d``, or a selection at depth >= 1 (``n``, ``]``, the
        # first divergence, the grid filling in)
        self._depths = shown
        for title in self.query("#title"):
            title.update(self._title())

    def _title(self) -> str:
        return (f"specdiff  {basename(self.paths.x)} ↔ {basename(self.paths.y)}   "
                f"tolerance: {self.preset}   depths: {'all' if self.depths else '0 only'}")

    def on_mount(self) -> None:
        self.query_one(PipelineGrid).focus()
        self.run_diff(self.preset)

    # ---- the worker -------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="diff")
    def run_diff(self, preset: str) -> None:
        """Open (once), diff, and index the report for drawing; posts DiffReady or DiffFailed."""
        try:
            from specdiff.replay.diff.pipeline import diff_opened
            from specdiff.replay.diff.types import Pair
            from specdiff.tracer.store import open_trace

            if self.traces is None:
                self.traces = Pair(open_trace(self.paths.x), open_trace(self.paths.y))

            def progress(name, i, total):
                self.post_message(DiffProgress(name, i, total))

            def on_partial(partial):
                self.post_message(DiffPartial(ViewModel(partial)))

            report = diff_opened(self.traces, preset=preset, overrides=self.overrides, progress=progress,
                                 on_first=lambda early: self.post_message(DiffEarly(early)),
                                 on_partial=on_partial if self.report is None else None)
            report.verdict()  # what it reads once (the serving rows' accounting: key columns) is read here, off the UI thread
            tokenizer, why_not = load_tokenizer(report)
            vm = ViewModel(report, tokenizer=tokenizer, tokenizer_note=why_not)
        except SpecdiffError as exc:
            self.post_message(DiffFailed(str(exc)))
            return
        self.post_message(DiffReady(report, vm, preset))

    def on_diff_progress(self, msg: DiffProgress) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.remove_class("done")
        bar.update(total=msg.total, progress=msg.done)
        self.query_one("#verdict", Static).update(f"comparing {msg.done + 1}/{msg.total}: {msg.name}…")

    def on_diff_early(self, msg: DiffEarly) -> None:
        if self.report is not None:  # a preset re-run: the report on screen stays until the new one
            return
        self.early = msg.early
        verdict = self.query_one("#verdict", Static)
        verdict.update(f"{msg.early.verdict()} — computing the totals and the explanation…")
        verdict.set_class(True, "diverged")

    def on_diff_partial(self, msg: DiffPartial) -> None:
        if self.report is not None:
            return
        vm, grid = msg.vm, self.query_one(PipelineGrid)
        self.partial = vm
        first = vm.first if self.early is not None else None
        sel = first if first is not None and grid.vm is not None and grid.vm.first is None else grid.selection
        if sel is None or sel.pair not in vm.pairs:
            sel = first or vm.initial()
        if sel.depth > 0:
            self.depths = True
        grid.show(vm, vm.rows(depths=self.depths, text=self.filter_text), sel)

    def on_diff_failed(self, msg: DiffFailed) -> None:
        self.error = msg.message
        self.push_screen(ErrorScreen(msg.message))

    def on_diff_ready(self, msg: DiffReady) -> None:
        first_time = self.report is None
        self.report, self.vm, self.preset = msg.report, msg.vm, msg.preset
        self.query_one("#title", Static).update(self._title())
        self.query_one("#progress", ProgressBar).add_class("done")
        verdict = self.query_one("#verdict", Static)
        verdict.update(msg.report.verdict(short=True))  # the cause in full is the Explain pane's first line
        bad = msg.report.diverged or not msg.report.conclusive
        verdict.set_class(bad, "diverged")
        verdict.set_class(not bad, "clean")
        alert, fix = panes.alert_line(msg.report), panes.fix_line(msg.report)
        self.query_one("#alert", Static).update(alert or "")
        self.query_one("#alert", Static).set_class(bool(alert), "shown")
        self.query_one("#fix", Static).update(Text.assemble(("fix: ", "bold"), fix) if fix else "")
        self.query_one("#fix", Static).set_class(bool(fix), "shown")
        self.query_one("#legend", Static).update(legend(unreadable=msg.vm.unreadable))
        self._fill_sequences()
        self.query_one("#explain-body", Static).update(panes.explain(msg.vm))
        sel = msg.vm.initial() if first_time or self.sel is None else self.sel
        if sel.pair not in msg.vm.pairs:
            sel = msg.vm.initial()
        self.select(sel)

    def _fill_sequences(self) -> None:
        vm = self.vm
        table = self.query_one("#seqs", DataTable)
        table.clear(columns=True)
        lab = vm.report.labels
        short = {"training": "T", "serving": "S"}
        table.add_columns("", "seq", "len", f"accept {short.get(lab.x, lab.x)}/{short.get(lab.y, lab.y)}",
                          "prompt")
        acc = vm.report.acceptance
        for idx, p in vm.pairs.items():
            mark = Text("✗", style="bold red") if idx in vm.diverged_pairs else \
                Text("▒", style="bright_magenta") if idx in vm.unreadable_pairs else Text("·", style="green")
            ax, ay = acc.x.per_sequence.get(idx), acc.y.per_sequence.get(idx)
            both = "/".join("-" if a is None else f"{a:.2f}" for a in (ax, ay))
            table.add_row(mark, str(idx), str(p.length), both, vm.prompt_preview(idx, 40), key=str(idx))
        # the prompts are text where the target's tokenizer loads, else token ids: the title says which
        self.query_one("#seq-box").border_title = "Sequences" if vm.tokenizer is not None else "Sequences: ids"
        self._show_prompt()

    def _show_prompt(self) -> None:
        """Under the list: the selected sequence's prompt, decoded (or its ids and why not decoded)."""
        if self.vm is None or self.sel is None or self.sel.pair not in self.vm.pairs:
            return
        text = Text.assemble(("prompt ", "bold"), self.vm.prompt_preview(self.sel.pair, 200))
        if self.vm.tokenizer_note:
            text.append(f"\n({self.vm.tokenizer_note})", style="italic")
        self.query_one("#prompt", Static).update(text)

    # ---- selection --------------------------------------------------------------------------
    def select(self, sel: Sel) -> None:
        """Move the selection (grid cursor, sequence list, detail pane) to ``sel``."""
        if self.vm is None:
            return
        if sel.depth > 0 and not self.depths:
            self.depths = True
        if self.filter_text and self.filter_text.lower() not in sel.name.lower():
            self._set_filter("")
        self.sel = sel
        grid = self.query_one(PipelineGrid)
        grid.show(self.vm, self.vm.rows(depths=self.depths, text=self.filter_text), sel)
        self.sel = grid.selection or sel
        self._grid_title()
        table = self.query_one("#seqs", DataTable)
        if table.row_count and table.cursor_row != sel.pair:
            self._syncing = True
            table.move_cursor(row=sel.pair)
        self._show_prompt()
        self._show_detail()

    def _show_detail(self) -> None:
        body = self.query_one("#detail-body", Static)
        values = self.query_one("#detail-values", Static)
        spark = self.query_one("#spark", Sparkline)
        values.update("")
        if self.sel is None or self.vm is None:
            body.update("")
            spark.data = []
            return
        if not self.vm.pairs:  # a side crashed before recording any sequence: nothing to show per cell
            body.update(Text(self.vm.report.verdict(), style="red" if self.vm.report.diverged else ""))
            spark.data = []
            return
        try:
            d = panes.detail(self.vm, self.sel)
        except SpecdiffError as exc:  # a damaged chunk in one row: say so, keep the app
            body.update(Text(f"cannot read this row: {exc}", style="red"))
            spark.data = []
            return
        body.update(d.body)
        values.update(d.values)
        spark.data = d.diffs
        spark.display = bool(d.diffs)

    @on(PipelineGrid.Moved)
    def _grid_moved(self, msg: PipelineGrid.Moved) -> None:
        self.sel = msg.sel
        self._grid_title()
        self._show_detail()

    def _grid_title(self) -> None:
        """The grid's border says which aligned sequence it shows."""
        if self.vm is not None and self.sel is not None and self.sel.pair in self.vm.pairs:
            self.query_one("#grid-box").border_title = (f"Pipeline — seq {self.sel.pair} "
                                                        f"({self.vm.length(self.sel.pair)} positions)")

    @on(DataTable.RowHighlighted, "#seqs")
    def _seq_highlighted(self, msg: DataTable.RowHighlighted) -> None:
        if getattr(self, "_syncing", False):
            self._syncing = False
            return
        if self.vm is None or self.sel is None or msg.row_key is None:
            return
        pair = int(msg.row_key.value)
        if pair != self.sel.pair:
            self.select(Sel(self.sel.name, self.sel.depth, pair, min(self.sel.pos, self.vm.length(pair) - 1)))

    # ---- actions ----------------------------------------------------------------------------
    def action_first(self) -> None:
        if self.vm is not None and self.vm.first is not None:
            self.select(self.vm.first)
            self.query_one(PipelineGrid).focus()
        elif self.vm is not None:
            self.notify("no divergence within tolerance")

    def action_tensor(self, step: int) -> None:
        """``n`` / ``N``: the next / previous diverged tensor, on its first failing row."""
        self._go(None if self.vm is None or self.sel is None else self.vm.tensor_step(self.sel, step),
                 "no divergence within tolerance")

    def action_row(self, step: int) -> None:
        """``]`` / ``[``: the next / previous failing row of the selected tensor."""
        self._go(None if self.vm is None or self.sel is None else self.vm.row_step(self.sel, step),
                 f"{self.sel.name if self.sel else 'this tensor'} has no failing row")

    def _go(self, nxt: Sel | None, none: str) -> None:
        if self.vm is None or self.sel is None:
            return
        if nxt is None:
            self.notify(none)
            return
        self.select(nxt)
        self.query_one(PipelineGrid).focus()

    def action_drill(self) -> None:
        if isinstance(self.focused, Input):
            return
        self.query_one("#detail", VerticalScroll).focus()

    def action_back(self) -> None:
        if self.query_one("#filter", Input).has_class("shown"):
            self._set_filter("")
        self.query_one(PipelineGrid).focus()

    def action_depths(self) -> None:
        if self.vm is None or self.sel is None:
            return
        self.depths = not self.depths
        sel = self.sel if self.depths else Sel(self.sel.name, 0, self.sel.pair, self.sel.pos)
        self.select(sel)
        if self.depths:  # most deeper cells are empty on an engine side: say why before anyone asks
            why = self.vm.depth_note()
            if why:
                self.notify(why, title="depths ≥ 1")

    def action_preset(self) -> None:
        """``t``: the next tolerance preset (strict, default, loose, around)."""
        names = list(PRESET_NAMES)
        self.action_set_preset(names[(names.index(self.preset) + 1) % len(names)] if self.preset in names
                               else "default")

    def action_set_preset(self, name: str) -> None:
        """Re-run the diff with tolerance preset ``name`` (the palette's "Tolerance preset: ...")."""
        if self.report is None:
            return
        self.query_one("#verdict", Static).update(f"re-running the diff with tolerance preset {name}…")
        self.run_diff(name)

    def action_explain(self) -> None:
        """``x``: focus the Explain pane at its top (the cause, its evidence and the fix)."""
        pane = self.query_one("#explain", VerticalScroll)
        pane.scroll_home(animate=False)
        pane.focus()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, msg: Input.Changed) -> None:
        self.filter_text = msg.value.strip()
        if self.vm is not None and self.sel is not None:
            grid = self.query_one(PipelineGrid)
            grid.show(self.vm, self.vm.rows(depths=self.depths, text=self.filter_text), self.sel)
            if grid.selection is not None and grid.selection != self.sel:
                self.sel = grid.selection
                self._show_detail()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.query_one(PipelineGrid).focus()

    def _set_filter(self, text: str) -> None:
        box = self.query_one("#filter", Input)
        self.filter_text = text
        with box.prevent(Input.Changed):
            box.value = text
        box.set_class(bool(text), "shown")
        if self.vm is not None and self.sel is not None:
            self.query_one(PipelineGrid).show(self.vm, self.vm.rows(depths=self.depths, text=text), self.sel)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(keys.keys_help([*self.BINDINGS, *PipelineGrid.BINDINGS], self.get_key_display)))

    def action_quit_app(self) -> None:
        """``q``: exit with the verdict's code (``exit_code``)."""
        self.exit(return_code=self.exit_code())

    async def action_quit(self) -> None:
        """ctrl+q (Textual's own quit binding): the same exit as ``q``, never a bare 0."""
        self.action_quit_app()

    def action_help_quit(self) -> None:
        """Ctrl-C (Textual binds it to a "press ctrl+q to quit" notice): the command's interrupt, exit 130,
        which ``terminal.run_app`` raises as KeyboardInterrupt for the CLI's one ``interrupted:`` line."""
        self.exit(return_code=EXIT_INTERRUPTED)

    def exit_code(self) -> int:
        """2 after an error screen; 0 only once the report says the traces agree; else 1: a divergence was
        shown, the report is inconclusive, or the diff is still deciding (no report yet: never 0 before it)."""
        if self.error is not None:
            return EXIT_BAD_INPUT
        if self.report is None or self.report.diverged or not self.report.conclusive:
            return EXIT_DIVERGED
        return EXIT_OK

    def action_quit_bad(self) -> None:
        self.exit(return_code=EXIT_BAD_INPUT)
