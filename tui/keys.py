"""The app's keys, in one table: the footer shows the bindings marked ``show`` (they fit in 80
columns beside the palette key, ``q`` included), and the keys screen (``?``) lists every binding of
the app and of the pipeline grid, each with its longer help (the binding's ``tooltip``), built from
the same bindings so the two never disagree. The command palette's entries are in ``commands``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.binding import Binding

from specdiff.tui.view import CELLS

__all__ = ["BINDINGS", "EXTRA_KEYS", "keys_help"]

TENSOR = Binding.Group("tensor")
ROW = Binding.Group("row")

#: the app's bindings; ``show``: in the footer (every one is on the keys screen). A pair of keys (n/N,
#: ]/[) is one footer entry (its first key's ``key_display``) and one row of the keys screen (its group):
#: a footer entry per key would not fit in 80 columns, and Textual's grouped footer entries are
#: drawn a frame later than the others (snapshots caught them half styled)
BINDINGS = [
    Binding("f", "first", "first", tooltip="jump to the first divergence"),
    Binding("n", "tensor(1)", "tensor", group=TENSOR, key_display="n/N",
            tooltip="next / previous diverged tensor (dataflow order), on its first failing row"),
    Binding("N", "tensor(-1)", "prev tensor", group=TENSOR, show=False),
    Binding("right_square_bracket", "row(1)", "row", group=ROW, key_display="]/[",
            tooltip="next / previous failing row of this tensor (position, sequence, depth order)"),
    Binding("left_square_bracket", "row(-1)", "prev row", group=ROW, show=False),
    Binding("enter", "drill", "drill in", show=False,
            tooltip="drill in: focus the detail pane (escape comes back)"),
    Binding("d", "depths", "depths", show=False,
            tooltip="toggle draft depths (depth 0 only or every depth as a sub-row; the title says which)"),
    Binding("t", "preset", "tolerance",
            tooltip="cycle tolerance presets (strict x0.2, default, loose x5) and re-run the diff"),
    Binding("slash", "filter", "filter", show=False, tooltip="filter the grid's tensors by name (escape clears)"),
    Binding("e", "export", "export",
            tooltip="export the selected slice (both sides' rows + metrics.json) into a new folder under one "
                    "you choose (at first, under the first trace's folder; for traces inside the specdiff checkout, "
                    "under its ignored specdiff-out/)"),
    Binding("x", "explain", "explain", show=False,
            tooltip="open the explanation: focus the Explain pane (cause, evidence, fix), from its top"),
    Binding("w", "write_fix", "write fix", show=False,
            tooltip="write the fix of the first divergence's cause (what `specdiff fix` writes: a corrected copy "
                    "of the served draft) into a new folder you choose (at first, beside the serving trace; for traces "
                    "inside the specdiff checkout, under its ignored specdiff-out/)"),
    Binding("v", "verify_fix", "verify fix", show=False,
            tooltip="serve the fix w wrote on a CPU SGLang server with the recorded prompts, record and diff both "
                    "sides again (minutes); the verdict replaces the verdict line"),
    Binding("question_mark", "help", "keys", tooltip="this list of every key"),
    Binding("escape", "back", "back", show=False, tooltip="back to the grid (and clear the filter)"),
    Binding("q", "quit_app", "quit",
            tooltip="quit: exit code 0 only once the report says the traces agree, else 1 (a divergence, or "
                    "the diff still deciding); ctrl+q the same; ctrl+c: 130"),
]

#: keys that are not the app's own bindings: Textual's focus cycling and command palette
EXTRA_KEYS = (
    ("tab", "cycle panes (in the sequences list, up / down selects the sequence)"),
    ("^p", "command palette: every action above by name (type 'export', 'tolerance', 'explain')"),
)


def _rows(bindings: Iterable[Binding], display: Callable[[Binding], str]) -> list[tuple[str, str]]:
    """(keys, help) rows: the bindings of one group share a row (each key in its own displayed form,
    joined by " / ", and the group's first binding's help, else the group's description)."""
    rows: list[tuple[str, str]] = []
    last_group = None
    for b in bindings:
        text = b.tooltip or (b.group.description if b.group else "") or b.description
        key = display(b.with_key(b.key))  # the key itself, not the footer's "n/N"
        if b.group is not None and b.group is last_group:
            keys, first = rows[-1]
            rows[-1] = (f"{keys} / {key}", first)
        else:
            rows.append((key, text))
        last_group = b.group
    return rows


def keys_help(bindings: Iterable[Binding], display: Callable[[Binding], str]) -> Group:
    """The keys screen: every binding in ``bindings`` (the app's, then the grid's) as ``keys  help``
    rows in the key's displayed form (``display``: ``App.get_key_display``), the keys of
    :data:`EXTRA_KEYS`, then what each grid cell symbol means. Plain Rich objects, no markup."""
    table = Table(box=None, padding=(0, 2, 0, 0), show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for keys, text in [*_rows(bindings, display), *EXTRA_KEYS]:
        table.add_row(keys, text)
    cells = Text("cells: ")
    for code in sorted(c for c in CELLS if c >= 0):
        sym, colour, meaning = CELLS[code]
        cells.append(sym, style=colour)
        cells.append(f" {meaning}   ")
    cells.append("▶", style="bold red")
    cells.append(" first divergence;  blank: no row on either side (the detail pane says why)")
    return Group(Text("specdiff view: training ↔ serving, first divergence first", style="bold"), Text(""),
                 table, Text(""), cells)
