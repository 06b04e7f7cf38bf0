"""The app's screens besides the main one: bad input (``ErrorScreen``), every key (``HelpScreen``,
its text built from the bindings by ``keys.keys_help``) where an export goes (``ExportScreen``) and where a fix goes (``FolderScreen``).
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

__all__ = ["ErrorScreen", "ExportScreen", "FolderScreen", "HelpScreen"]

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


class FolderScreen(ModalScreen[str | None]):
    """A folder to edit under a one-line ``prompt`` (enter gives it, escape cancels: None); the
    input's id is ``input_id``."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    FolderScreen { align: center middle; }
    #folder-box { width: 90%; max-width: 110; height: auto; border: round $primary; padding: 0 1;
                  background: $surface; }
    """

    def __init__(self, prompt: str, folder: Path, input_id: str):
        super().__init__()
        self.prompt, self.folder, self.input_id = prompt, folder, input_id

    def compose(self) -> ComposeResult:
        with Vertical(id="folder-box"):
            yield Static(self.prompt)
            yield Input(str(self.folder), id=self.input_id)

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submitted(self, msg: Input.Submitted) -> None:
        self.dismiss(msg.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ExportScreen(FolderScreen):
    """Where ``e`` writes: a folder to edit (enter exports into a new subfolder, escape cancels)."""

    def __init__(self, root: Path, sel: Sel):
        super().__init__(f"export {sel.name} seq {sel.pair} pos {sel.pos} depth {sel.depth} into a new subfolder "
                         "of (enter exports, escape cancels):", root, "export-dir")
        self.root, self.sel = root, sel

