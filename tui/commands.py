"""specdiff's own actions in Textual's command palette (``ctrl+p``), beside Textual's: jump to the
first divergence, the next / previous diverged tensor, export the selected slice, each tolerance
preset, open the explanation, depths, filter and the keys screen. Each runs the app action its key
runs (tui/keys.py), so a palette entry and its key never do different things.

Pattern: Textual's ``Provider`` (docs guide/command_palette): ``discover`` lists every entry on an
empty palette, ``search`` scores each title with the palette's fuzzy ``matcher``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from specdiff.tui.keys import BINDINGS

__all__ = ["COMMANDS", "PRESETS", "Command", "SpecdiffCommands"]

#: the tolerance presets in the order ``t`` cycles them (replay/diff/measure/tolerance.py PRESETS), with
#: what each does to every stage's tolerance
PRESETS = {"strict": "every tolerance x0.2", "default": "dtype-aware tolerances",
           "loose": "every tolerance x5"}


@dataclass(frozen=True)
class Command:
    """One palette entry: its title, one line of help and the app action it runs."""

    title: str
    help: str
    action: str


COMMANDS = (
    Command("Jump to first divergence", "the first tensor and row where the two sides disagree", "first"),
    Command("Next diverged tensor", "the next diverged tensor in dataflow order, on its first failing row",
            "tensor(1)"),
    Command("Previous diverged tensor", "the previous diverged tensor, on its first failing row", "tensor(-1)"),
    Command("Export the selected slice", "both sides' rows of the selected cell and metrics.json, into a "
            "folder you choose", "export"),
    *(Command(f"Tolerance preset: {name}", f"re-run the diff with the {name} preset ({what})",
              f"set_preset('{name}')") for name, what in PRESETS.items()),
    Command("Open explanation", "focus the Explain pane: the cause, its evidence and the fix", "explain"),
    Command("Write the fix", "a corrected copy of the served draft for the cause found (what `specdiff fix` "
            "writes), into a folder you choose", "write_fix"),
    Command("Verify the fix", "serve the written fix again, record and diff both sides (minutes)", "verify_fix"),
    Command("Toggle draft depths", "depth 0 only, or every draft depth as a sub-row", "depths"),
    Command("Filter tensors by name", "show only the grid rows whose tensor name contains a text", "filter"),
    Command("Show all keys", "every key of the app and what it does", "help"),
)


class SpecdiffCommands(Provider):
    """The palette's specdiff entries (:data:`COMMANDS`); each help line names the entry's key."""

    def _entries(self):
        for cmd in COMMANDS:
            key = next((b for b in BINDINGS if b.action == cmd.action), None)
            shown = cmd.help if key is None else f"{cmd.help} (key {self.app.get_key_display(key)})"
            yield cmd, shown, partial(self.app.run_action, cmd.action)

    async def discover(self) -> Hits:
        for cmd, help_text, run in self._entries():
            yield DiscoveryHit(cmd.title, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for cmd, help_text, run in self._entries():
            score = matcher.match(cmd.title)
            if score > 0:
                yield Hit(score, matcher.highlight(cmd.title), run, text=cmd.title, help=help_text)
