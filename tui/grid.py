"""The pipeline grid: tensors (dataflow order) x positions of one sequence, one 2-char cell each.

A line-API ``ScrollView``: each line renders only its visible cells from the view model's numpy
status arrays (plus a small line cache), so a 100k-position sequence scrolls as fast as a short
one. The label column stays put while the cells scroll horizontally.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from specdiff.tui.view import CELLS, NONE, GridRow, Sel, ViewModel

LABEL_W = 22
SHORT = {0: "match", 1: "within tol", 2: "diverged", 3: "missing", 4: "unreadable", 5: "not observable"}
CELL_W = 2


def fit(label: str, width: int) -> str:
    """``label`` in at most ``width`` cells, its last dotted part kept whole (``draft.logits_topk.values``
    -> ``draft.logits…values``) so names that differ only at the end stay apart."""
    if len(label) <= width:
        return label
    head, dot, tail = label.rpartition(".")
    if not dot or len(tail) + 2 > width:
        return label[: width - 1] + "…"
    return head[: width - len(tail) - 1] + "…" + tail


class PipelineGrid(ScrollView, can_focus=True):
    """Cells coloured and marked by comparison status; the first divergence carries ``▶``."""

    DEFAULT_CSS = """
    PipelineGrid { height: 1fr; }
    """

    # one group per line of the app's keys screen (tui/keys.py), never in the footer
    _MOVE = Binding.Group("move in the pipeline grid (tensors x positions)")
    _PAGE = Binding.Group("a page of positions left / right")
    _EDGE = Binding.Group("first / last position")
    BINDINGS = [
        Binding("up", "move(0, -1)", "up", show=False, group=_MOVE),
        Binding("down", "move(0, 1)", "down", show=False, group=_MOVE),
        Binding("left", "move(-1, 0)", "left", show=False, group=_MOVE),
        Binding("right", "move(1, 0)", "right", show=False, group=_MOVE),
        Binding("pageup", "page(-1)", "page left", show=False, group=_PAGE),
        Binding("pagedown", "page(1)", "page right", show=False, group=_PAGE),
        Binding("home", "edge(-1)", "first position", show=False, group=_EDGE),
        Binding("end", "edge(1)", "last position", show=False, group=_EDGE),
    ]

    @dataclass
    class Moved(Message):
        """The cursor moved to ``sel`` (by a key in the grid)."""

        sel: Sel

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.vm: ViewModel | None = None
        self.rows: list[GridRow] = []
        self.pair = 0
        self.length = 0
        self.row = 0
        self.col = 0
        self._cache: dict[tuple, Strip] = {}
        self._gen = 0

    # ---- state ------------------------------------------------------------------------------
    def show(self, vm: ViewModel, rows: list[GridRow], sel: Sel) -> None:
        """Show ``rows`` of sequence ``sel.pair`` with the cursor on ``sel`` (nearest row if absent)."""
        self.vm, self.rows, self.pair = vm, rows, sel.pair
        self.length = vm.length(sel.pair)
        self.row = self._row_of(sel)
        self.col = min(max(sel.pos, 0), max(self.length - 1, 0))
        self._gen += 1
        self._cache.clear()
        self.virtual_size = Size(LABEL_W + CELL_W * self.length, len(rows) + 1)
        self._follow()
        self.refresh()

    def _row_of(self, sel: Sel) -> int:
        for i, r in enumerate(self.rows):
            if r.name == sel.name and r.depth == sel.depth:
                return i
        for i, r in enumerate(self.rows):
            if r.name == sel.name:
                return i
        return min(self.row, max(len(self.rows) - 1, 0))

    @property
    def selection(self) -> Sel | None:
        if not self.rows:
            return None
        r = self.rows[self.row]
        return Sel(r.name, r.depth, self.pair, self.col)

    # ---- movement ---------------------------------------------------------------------------
    def _visible_cols(self) -> int:
        return max((self.scrollable_content_region.width - LABEL_W) // CELL_W, 1)

    def _follow(self) -> None:
        """Scroll so the cursor cell is visible."""
        vis = self._visible_cols()
        col0 = int(self.scroll_offset.x) // CELL_W
        if self.col < col0:
            col0 = self.col
        elif self.col >= col0 + vis:
            col0 = self.col - vis + 1
        rows_vis = max(self.scrollable_content_region.height - 1, 1)
        y0 = int(self.scroll_offset.y)
        if self.row < y0:
            y0 = self.row
        elif self.row >= y0 + rows_vis:
            y0 = self.row - rows_vis + 1
        self.scroll_to(col0 * CELL_W, y0, animate=False, immediate=True)

    def _moved(self) -> None:
        self._follow()
        self.refresh()
        sel = self.selection
        if sel is not None:
            self.post_message(self.Moved(sel))

    def action_move(self, dx: int, dy: int) -> None:
        if not self.rows:
            return
        self.row = min(max(self.row + dy, 0), len(self.rows) - 1)
        self.col = min(max(self.col + dx, 0), max(self.length - 1, 0))
        self._moved()

    def action_page(self, direction: int) -> None:
        self.action_move(direction * self._visible_cols(), 0)

    def action_edge(self, direction: int) -> None:
        self.col = 0 if direction < 0 else max(self.length - 1, 0)
        self._moved()

    # ---- drawing ----------------------------------------------------------------------------
    def on_resize(self) -> None:
        self._cache.clear()
        self._follow()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        vis = self._visible_cols()
        col0 = int(self.scroll_offset.x) // CELL_W
        if self.vm is None:
            return Strip.blank(width)
        if y == 0:
            return self._header(col0, vis, width)
        r = y - 1 + int(self.scroll_offset.y)
        if r >= len(self.rows):
            return Strip.blank(width)
        cursor = self.col if r == self.row else -1
        key = (self._gen, r, col0, vis, width, cursor, self.has_focus)
        strip = self._cache.get(key)
        if strip is None:
            if len(self._cache) > 512:
                self._cache.clear()
            strip = self._cache[key] = self._line(self.rows[r], col0, vis, width, cursor)
        return strip

    def _header(self, col0: int, vis: int, width: int) -> Strip:
        chars = [" "] * (vis * CELL_W)
        for c in range(col0, min(col0 + vis, self.length)):
            if c % 10 == 0:
                for k, ch in enumerate(str(c)):
                    off = (c - col0) * CELL_W + 1 + k
                    if off < len(chars):
                        chars[off] = ch
        label = f"{'pos →':<{LABEL_W}}"
        style = Style(dim=True)
        return Strip([Segment(label, style), Segment("".join(chars), style)]).adjust_cell_length(width)

    def _line(self, row: GridRow, col0: int, vis: int, width: int, cursor: int) -> Strip:
        vm = self.vm
        status, _ = vm.cells(row.name, self.pair)
        first = vm.first if vm.first and vm.first.pair == self.pair and vm.first.name == row.name \
            and vm.first.depth == row.depth else None
        comp = vm.report.comparisons.get(row.name)
        marker = "▶ " if first is not None else "  "
        label = (marker + row.label)
        label = fit(label, LABEL_W - 1)
        lstyle = Style(bold=True, color="red") if (comp is not None and comp.diverged and row.depth == 0) \
            else Style(dim=row.depth > 0)
        segs = [Segment(f"{label:<{LABEL_W}}", lstyle)]
        sub = status[row.depth] if row.depth < status.shape[0] else None
        for c in range(col0, min(col0 + vis, self.length)):
            code = int(sub[c]) if sub is not None else NONE
            sym, colour, _ = CELLS[code]
            style = Style(color=colour or None, bold=code == 2)
            lead = " "
            if first is not None and c == first.pos:
                lead = "▶"
                style += Style(underline=True)
            if c == cursor:
                style += Style(reverse=True, bold=True)
                lead_style = style
            else:
                lead_style = Style(color="red", bold=True) if lead == "▶" else Style()
            segs.append(Segment(lead, lead_style))
            segs.append(Segment(sym if code != NONE or c != cursor else "□", style))
        return Strip(segs).adjust_cell_length(width)


def legend(*, unreadable: bool = False) -> str:
    """One line: every cell symbol and what it means (Rich markup, readable without colour); the
    unreadable symbol only when a damaged trace put one in the grid."""
    parts = []
    for code in (0, 1, 2, 3, 4, 5) if unreadable else (0, 1, 2, 3, 5):
        sym, colour, _ = CELLS[code]
        text = SHORT[code]
        parts.append(f"[{colour}]{sym}[/] {text}")
    parts.append("[bold red]▶[/] first")
    parts.append("blank: no row   enter: why")  # the detail pane says why any cell is empty
    return "   ".join(parts)
