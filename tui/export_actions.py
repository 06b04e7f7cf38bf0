"""The app's export (``e``): ask where, then write the selected slice (tui/export.py) in a worker thread,
its progress on screen. Writing both sides' rows of every tensor of a sequence takes seconds on a real
pair: a notice says what is being written as it starts, the progress bar counts the tensors, and a
notice names the folder once it is whole.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.widgets import ProgressBar

from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.screens import ExportScreen

__all__ = ["ExportActions"]


class ExportActions:
    """Mixed into ``SpecdiffApp``: ``action_export`` and its worker. ``exported``: the folder the last
    export wrote (None before one finished); ``exporting``: the selection being exported, or None."""

    exported: Path | None = None
    exporting = None

    def action_export(self) -> None:
        """``e``: ask where (the last folder used, at first the app's ``export_root``), then export."""
        if self.vm is None or self.sel is None:
            return
        if self.exporting is not None:
            self.notify("an export is still being written; wait for its notice", title="export", severity="warning")
            return
        self.push_screen(ExportScreen(self.export_root, self.sel), self._export_to)

    def _export_to(self, root: str | None) -> None:
        if not root or self.vm is None or self.sel is None:
            return
        self.export_root = Path(root).expanduser()
        self.exporting = self.sel
        names = len(self.vm.report.traces.x.names) + len(self.vm.report.traces.y.names)
        self.notify(f"exporting seq {self.sel.pair}: both sides' rows of {names} tensors into a new folder "
                    f"under {self.export_root}…", title="export")
        self.run_export(self.vm, self.sel, self.export_root)

    @work(thread=True, exclusive=True, group="export")
    def run_export(self, vm, sel, root: Path) -> None:
        """``export_slice`` (blocking: seconds); progress and the outcome go back to the app's thread."""
        from specdiff.tui.export import export_slice

        def progress(done: int, total: int) -> None:
            self.call_from_thread(self._export_progress, done, total)

        try:
            out = export_slice(vm, sel, root=root, progress=progress)
        except (SpecdiffError, OSError) as exc:
            self.call_from_thread(self._exported, None, f"export failed: {exc}")
            return
        self.call_from_thread(self._exported, out, f"exported to {out}")

    def _export_progress(self, done: int, total: int) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.remove_class("done")
        bar.update(total=total, progress=done)

    def _exported(self, out: Path | None, line: str) -> None:
        self.exporting = None
        self.query_one("#progress", ProgressBar).add_class("done")
        if out is None:
            self.notify(line, title="export", severity="error")
            return
        self.exported = out
        self.notify(line, title="export")
