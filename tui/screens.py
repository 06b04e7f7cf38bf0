"""The app's screens besides the main one: bad input (``ErrorScreen``), the key help
(``HelpScreen``, its text ``HELP``) and where an export goes (``ExportScreen``).
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from specdiff.tui.view import Sel

__all__ = ["HELP", "ErrorScreen", "HelpScreen", "ExportScreen"]

HELP = """\
[b]specdiff view[/b] — training ↔ serving, first divergence first

[b]f[/b]            jump to the first divergence
[b]n[/b] / [b]N[/b]        next / previous diverged tensor (dataflow order), on its first failing row
[b]][/b] / [b][[/b]        next / previous failing row of this tensor (position, sequence, depth order)
[b]arrows[/b]       move in the pipeline grid (tensors × positions)
[b]pgup/pgdn[/b]    a page of positions left / right;  [b]home/end[/b] first / last position
[b]enter[/b]        drill in: focus the detail pane (escape comes back)
[b]d[/b]            toggle draft depths (depth 0 only ↔ every depth as a sub-row; the title says which)
[b]t[/b]            cycle tolerance presets (strict ×0.2, default, loose ×5) and re-run the diff
[b]/[/b]            filter the grid's tensors by name (escape clears)
[b]e[/b]            export the selected slice (both sides' rows + metrics.json) to a folder you choose;
             default under the first trace's folder; a new folder per export, named by tensor/seq/pos/depth
[b]tab[/b]          cycle panes (sequences list selects the sequence)
[b]?[/b]            this help;  [b]q[/b] quit

Cells: [green]·[/] match  [yellow]~[/] within tolerance  [red]✗[/] diverged  [magenta]?[/] missing on one side
       [bright_magenta]▒[/] unreadable (damaged chunk);  [blue]-[/] not observable on one side;  blank: no row
       on either side;  [bold red]▶[/] first divergence.  The detail pane says why a cell is empty.
"""


class ErrorScreen(Screen):
    """Bad input: the SpecdiffError text, no traceback; quitting exits with code 2."""

    BINDINGS = [Binding("q,escape,enter", "app.quit_bad", "quit")]
    DEFAULT_CSS = """
    ErrorScreen { align: center middle; }
    #error { width: 90%; height: auto; border: heavy $error; padding: 1 2; }
    """

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("specdiff: error\n\n", "bold red"), self.message,
                                   ("\n\npress q to quit", "dim")), id="error")
        yield Footer()


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    #help { width: auto; max-width: 100; height: auto; border: round $primary; padding: 1 2;
            background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")


class ExportScreen(ModalScreen[str | None]):
    """Where ``e`` writes: a folder to edit (enter exports into a new subfolder, escape cancels)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    #export-box { width: 90%; max-width: 110; height: auto; border: round $primary; padding: 0 1;
                  background: $surface; }
    """

    def __init__(self, root: Path, sel: Sel):
        super().__init__()
        self.root, self.sel = root, sel

    def compose(self) -> ComposeResult:
        with Vertical(id="export-box"):
            yield Static(f"export {self.sel.name} seq {self.sel.pair} pos {self.sel.pos} depth {self.sel.depth} "
                         "into a new subfolder of (enter exports, escape cancels):")
            yield Input(str(self.root), id="export-dir")

    def on_mount(self) -> None:
        self.query_one("#export-dir", Input).focus()

    @on(Input.Submitted, "#export-dir")
    def _submitted(self, msg: Input.Submitted) -> None:
        self.dismiss(msg.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)

