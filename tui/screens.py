"""The app's screens besides the main one: bad input (``ErrorScreen``), every key (``HelpScreen``,
its text built from the bindings by ``keys.keys_help``) and where an export goes (``ExportScreen``).
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from specdiff.tui.view import Sel

__all__ = ["ErrorScreen", "HelpScreen", "ExportScreen"]

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
    """Every key (``?``, the footer's "keys"): ``body`` is ``keys.keys_help(...)``; it scrolls where the
    terminal is shorter than the list (80x24)."""

    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    #help-box { width: 100%; max-width: 104; height: auto; max-height: 100%; border: round $primary;
                padding: 0 1; background: $surface; }
    #help { width: 100%; height: auto; }
    """

    def __init__(self, body):
        super().__init__()
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = "keys (escape closes)"
            yield Static(self.body, id="help")


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

