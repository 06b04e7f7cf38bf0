"""The app's fix actions: ``w`` writes what ``specdiff fix`` writes for the report's cause
into a folder you choose, ``v`` serves that fix on a CPU SGLang server, records and diffs both sides
again (minutes, in a worker thread, its progress in the verdict line) and shows the verdict. The plan,
the writer and the verification are the CLI's own (replay/fix/, demo/verify_fix.py).
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.widgets import Static

from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.default_dirs import default_dir
from specdiff.tui.screens import FolderScreen

__all__ = ["FixActions"]


def _free(folder: Path) -> Path:
    """``folder``, or ``folder-2``, ``folder-3``... the first that does not exist (never overwritten)."""
    out, k = folder, 1
    while out.exists():
        k += 1
        out = folder.with_name(f"{folder.name}-{k}")
    return out


class FixActions:
    """Mixed into ``SpecdiffApp``: ``action_write_fix`` / ``action_verify_fix`` and the verify worker.
    ``fixed``: the folder the last fix went to (None before ``w``)."""

    fixed: Path | None = None
    fix_plan = None
    #: demo/verify_fix.py ``Verdict`` of the last ``v`` (None before it finished)
    verdict = None

    def action_write_fix(self) -> None:
        """``w``: plan the fix of the report's cause (replay/fix/plan.py), then ask where to write it."""
        from specdiff.replay.fix.plan import NoMechanicalFix, plan_fix

        if self.report is None:
            return
        try:
            plan = plan_fix(self.report)
        except NoMechanicalFix as e:
            self.notify(str(e), title="write fix", severity="warning")
            return
        if plan is None:
            self.notify("nothing to fix: the traces agree within tolerance", title="write fix")
            return
        self.fix_plan = plan
        default = _free(default_dir(self.paths.y, "fixed-draft"))  # beside the serving trace (tui/default_dirs.py)
        self.push_screen(FolderScreen(f"write the fix for {plan.cause} (a corrected copy of {plan.source.name}) "
                                      "into the new folder (enter writes, escape cancels):", default, "fix-dir"),
                         self._write_fix_to)

    def _write_fix_to(self, folder: str | None) -> None:
        from specdiff.replay.fix.write import check_out, write_fix

        if not folder or self.fix_plan is None:
            return
        out = Path(folder).expanduser()
        try:
            check_out(out, self.fix_plan.source, overwrite=False)
            write_fix(self.fix_plan, out)
        except (SpecdiffError, OSError) as exc:
            self.notify(f"the fix was not written: {exc}", title="write fix", severity="error")
            return
        self.fixed = out
        self.notify(f"wrote {out}; press v to serve it again and verify (minutes)", title="write fix")

    def action_verify_fix(self) -> None:
        """``v``: verify the fix ``w`` wrote (demo/verify_fix.py ``verify_fix``) in a worker thread."""
        if self.report is None:
            return
        if self.fixed is None or self.fix_plan is None:
            self.notify("write the fix first (w)", title="verify fix", severity="warning")
            return
        self.query_one("#verdict", Static).update(f"verifying the fix in {self.fixed}: serving it on a CPU SGLang "
                                                  "server, recording and diffing both sides again (minutes)…")
        self.run_verify(self.fixed, self.fix_plan.cause, self.fix_plan.options)

    @work(thread=True, exclusive=True, group="verify")
    def run_verify(self, fixed: Path, cause: str, options=()) -> None:
        """Serve, record, diff (blocking, minutes); the verdict goes to the verdict line and a notice."""
        from specdiff.demo.verify_fix import verify_fix

        try:
            verdict = verify_fix(self.report, fixed, fixed.parent / f"{fixed.name}-verify", cause=cause,
                                 options=options)
        except SpecdiffError as exc:
            self.call_from_thread(self._verified, f"the fix could not be verified: {exc}", False)
            return
        self.verdict = verdict
        self.call_from_thread(self._verified, verdict.line, verdict.verified)

    def _verified(self, line: str, ok: bool) -> None:
        self.query_one("#verdict", Static).update(line)
        self.notify(line, title="verify fix", severity="information" if ok else "error", timeout=30)
