"""What the app shows, indexed for drawing: cells of the pipeline grid, divergences, selections.

Everything here is a lookup into a ``DiffReport`` (replay/diff/result.py) and the row keys of the two
traces; nothing is compared again. Built once per report in the diff worker, so the UI thread
only indexes numpy arrays.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

# replay.diff.compare imports numpy only, so the app still paints before torch loads.
from specdiff.replay.diff.compare.compare import is_compared
from specdiff.replay.diff.types import CLOSE, DIVERGED, MATCH, UNREADABLE
from specdiff.tracer.schema import ordered, spec_for

if TYPE_CHECKING:
    from specdiff.replay.diff.result import DiffReport

NONE, MISSING, UNOBSERVED = -1, 3, 5
#: cell code -> (symbol, colour, legend text). Symbols alone carry the meaning (no colour needed).
CELLS = {
    MATCH: ("·", "green", "match"),
    CLOSE: ("~", "yellow", "within tolerance"),
    DIVERGED: ("✗", "red", "diverged"),
    MISSING: ("?", "magenta", "missing on one side"),
    UNREADABLE: ("▒", "bright_magenta", "unreadable (damaged chunk)"),
    UNOBSERVED: ("-", "blue", "not observable on one side (the trace says why)"),
    NONE: (" ", "", "not compared"),
}


@dataclass(frozen=True)
class Sel:
    """A selected grid cell: tensor ``name`` at draft ``depth``, aligned sequence ``pair``, ``pos``."""

    name: str
    depth: int
    pair: int
    pos: int


@dataclass(frozen=True)
class GridRow:
    name: str
    depth: int

    @property
    def label(self) -> str:
        return self.name if self.depth == 0 else f"  └ depth {self.depth}"


def shown(name: str) -> bool:
    """Tensors that get a grid row: compared ones, and canonical ones recorded on one side only."""
    return is_compared(name) and name != "target.argmax"


def basename(path: str) -> str:
    return os.path.basename(str(path).rstrip("/")) or str(path)


def load_tokenizer(report: DiffReport) -> tuple[object | None, str | None]:
    """(``tokenizers.Tokenizer`` of the target a contract names, None) or, when none loads, (None,
    why: the model paths looked in), so the app can say the prompts are shown as token ids."""
    from specdiff.replay.diff.align.token_format import load_tokenizer as from_traces
    from specdiff.replay.diff.align.token_format import tokenizer_dir

    tok = from_traces(report.traces)
    if tok is not None:
        return tok, None
    names = list(dict.fromkeys(str(t.contract.get("model_name")) for t in (report.traces.x, report.traces.y)
                               if t.contract.get("model_name")))
    if not names:
        return None, "no tokenizer: neither trace names its target model (contract model_name)"
    found = tokenizer_dir(report.traces)
    where = " or ".join(names)
    return None, (f"no tokenizer: the tokenizer.json in {found} does not load" if found is not None else
                  f"no tokenizer: no tokenizer.json for model {where}, from here or above the traces")


class ViewModel:
    """A DiffReport indexed for the grid, the sequence list and divergence navigation."""

    def __init__(self, report: DiffReport, *, tokenizer=None, tokenizer_note: str | None = None):
        self.report = report
        self.tokenizer = tokenizer
        #: why prompts are shown as token ids (no tokenizer found), None when they are decoded
        self.tokenizer_note = tokenizer_note if tokenizer is None else None
        traces = report.traces
        comps = report.comparisons
        one_side = (set(traces.x.names) ^ set(traces.y.names)) - set(comps)
        self.names: list[str] = ordered([n for n in comps if shown(n)] + [n for n in one_side if shown(n)])
        self.pairs = {p.index: p for p in report.alignment.seq_pairs}
        # Row keys per side (seq, pos, depth) for presence: a cell one side recorded and the other did not.
        self._keys: dict[str, list] = {}
        self.max_depth: dict[str, int] = {}
        for name in self.names:
            per_side = []
            deepest = 0
            for trace in (traces.x, traces.y):
                if name in trace.names:
                    k = trace.keys(name)
                    per_side.append((k["seq"], k["pos"], k["depth"]))
                    if len(k["depth"]):
                        deepest = max(deepest, int(k["depth"].max()))
                else:
                    per_side.append(None)
            self._keys[name] = per_side
            self.max_depth[name] = deepest if spec_for(name).by_depth else 0
        self.divergences: list[Sel] = []
        for name, i in report.divergences:
            m = comps[name].match
            self.divergences.append(Sel(name, int(m.depth[i]), int(m.pair[i]), int(m.pos[i])))
        self.diverged_pairs = {s.pair for s in self.divergences}
        self.first: Sel | None = None
        if report.first is not None:
            # A structure finding has no row: land on its grid row at the first sequence's start.
            w = report.first.first_where or {"pair": 0, "pos": 0, "depth": 0}
            if w["pair"] in self.pairs or report.first.kind == "structure":
                self.first = Sel(report.first.name, w["depth"], w["pair"], w["pos"])
        self._cells: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        self.unreadable = any(c.stats.get("unreadable_rows", 0) for c in comps.values())
        self.unreadable_pairs = {int(p) for c in comps.values() for p in np.unique(c.match.pair[c.status == UNREADABLE])}
        self._first: list[dict[int, int] | None] = [None, None]  # per side: seq id -> first position

    # ---- grid -------------------------------------------------------------------------------
    def rows(self, *, depths: bool, text: str = "") -> list[GridRow]:
        """Grid rows in dataflow order; with ``depths`` every draft depth is a sub-row."""
        out = []
        for name in self.names:
            if text and text.lower() not in name.lower():
                continue
            for d in range(self.max_depth[name] + 1 if depths else 1):
                out.append(GridRow(name, d))
        return out

    def length(self, pair: int) -> int:
        """Aligned positions of ``pair``; 0 when there is none (a crashed side's trace, or a structure
        finding on traces that share no sequence)."""
        return self.pairs[pair].length if pair in self.pairs else 0

    def cells(self, name: str, pair: int) -> tuple[np.ndarray, np.ndarray]:
        """(status int8 [depths, length], comparison row index int64 [depths, length], -1 = none)."""
        key = (name, pair)
        hit = self._cells.get(key)
        if hit is not None:
            return hit
        p = self.pairs.get(pair)
        n, depths = (p.length if p is not None else 0), self.max_depth[name] + 1
        status = np.full((depths, n), NONE, np.int8)
        index = np.full((depths, n), -1, np.int64)
        if p is None:
            return status, index
        present = []
        for keys, sid, start in zip(self._keys[name], (p.seq.x, p.seq.y), (p.start.x, p.start.y)):
            have = np.zeros((depths, n), bool)
            if keys is not None:
                seq, pos, dep = keys
                pos = pos.astype(np.int64) - start  # aligned positions (content-paired sequences)
                sel = (seq == sid) & (pos >= 0) & (pos < n) & (dep < depths)
                have[dep[sel].astype(np.int64), pos[sel]] = True
            present.append(have)
        status[present[0] ^ present[1]] = MISSING
        for side, (trace, sid) in enumerate(zip((self.report.traces.x, self.report.traces.y), (p.seq.x, p.seq.y))):
            lacks = present[1 - side] & ~present[side]
            for d in range(depths):
                if lacks[d].any() and self.why_unobserved(name, d, trace) is not None:
                    status[d][lacks[d]] = UNOBSERVED
            first = self.first_computed(side, sid)
            if first:
                cached = lacks[:, :first]
                status[:, :first][cached] = UNOBSERVED
        comp = self.report.comparisons.get(name)
        if comp is not None:
            m = comp.match
            sel = np.nonzero(m.pair == pair)[0]
            d, t = m.depth[sel].astype(np.int64), m.pos[sel].astype(np.int64)
            ok = d < depths
            status[d[ok], t[ok]] = comp.status[sel[ok]]
            index[d[ok], t[ok]] = sel[ok]
        self._cells[key] = (status, index)
        return status, index

    def cell(self, sel: Sel) -> tuple[int, int]:
        """(status code, comparison row index or -1) of one cell."""
        status, index = self.cells(sel.name, sel.pair)
        if sel.depth >= status.shape[0] or not 0 <= sel.pos < status.shape[1]:
            return NONE, -1
        return int(status[sel.depth, sel.pos]), int(index[sel.depth, sel.pos])

    @staticmethod
    def why_unobserved(name: str, depth: int, trace) -> str | None:
        """Why ``trace`` holds no row of ``name`` at ``depth`` where the other side does, when its
        recorder said so (contract ``unrecorded_stages``, ``depth_coverage``) or never records the
        tensor; None when nothing explains it (the cell stays ``?``)."""
        c = trace.contract
        reasons = []
        if name in trace.names and depth > 0 and spec_for(name).by_depth and c.get("depth_coverage"):
            reasons.append(str(c["depth_coverage"]))
        if (c.get("unrecorded_stages") or {}).get(name):
            reasons.append(str(c["unrecorded_stages"][name]))
        if not reasons and name not in trace.names:
            reasons.append(f"this trace ({c.get('engine', 'unknown engine')} {c.get('engine_version', '')}".rstrip()
                           + f") holds no {name} rows: its recorder does not record this stage")
        return "; ".join(reasons) or None

    def depth_note(self) -> str | None:
        """Why the depth >= 1 sub-rows are mostly ``-``: each side's recorded ``depth_coverage`` (SGLang
        drafts deeper only from the last accepted position of a decode step), or None when neither says."""
        r = self.report
        notes = [f"{label}: {t.contract['depth_coverage']}" for label, t in ((r.labels.x, r.traces.x),
                                                                           (r.labels.y, r.traces.y))
                 if t.contract.get("depth_coverage")]
        return "; ".join(notes) or None

    def first_computed(self, side: int, seq_id: int) -> int:
        """First position a serving request computed itself: > 0 when SGLang's radix cache served
        its prompt's prefix (the recorder writes prefill rows from the prefix length on; the
        earlier request that computed the prefix holds those rows). 0 for training sides."""
        if self._first[side] is None:  # one pass over the keys: min position per sequence
            trace = (self.report.traces.x, self.report.traces.y)[side]
            self._first[side] = {}
            if trace.side == "serve" and "target.aux_cat" in trace.names:
                k = trace.keys("target.aux_cat", columns=("seq", "pos"))
                if len(k["seq"]):
                    order = np.lexsort((k["pos"], k["seq"]))
                    seq, pos = k["seq"][order], k["pos"][order]
                    start = np.r_[True, seq[1:] != seq[:-1]]
                    self._first[side] = dict(zip(seq[start].tolist(), pos[start].tolist()))
        return int(self._first[side].get(int(seq_id), 0))

    def unobserved(self, sel: Sel) -> tuple[str, str] | None:
        """(side label, reason) when the selected cell is unobservable on one side, else None."""
        px, py = self.present(sel)
        if px == py:
            return None
        side = 1 if px else 0
        label, trace = ((self.report.labels.y, self.report.traces.y) if px
                        else (self.report.labels.x, self.report.traces.x))
        pair = self.pairs[sel.pair]
        first = self.first_computed(side, pair.seq.y if side else pair.seq.x)
        if sel.pos < first:
            return label, (f"positions 0..{first - 1} of this request's prompt came from SGLang's radix cache "
                           "(computed for an earlier request with the same prefix, recorded there); this "
                           f"request computed from position {first}")
        why = self.why_unobserved(sel.name, sel.depth, trace)
        return None if why is None else (label, why)

    def present(self, sel: Sel) -> tuple[bool, bool]:
        """Whether each side recorded the selected cell."""
        p = self.pairs.get(sel.pair)
        if p is None:
            return False, False
        out = []
        for keys, sid, start in zip(self._keys[sel.name], (p.seq.x, p.seq.y), (p.start.x, p.start.y)):
            if keys is None:
                out.append(False)
                continue
            seq, pos, dep = keys
            out.append(bool(((seq == sid) & (pos == sel.pos + start) & (dep == sel.depth)).any()))
        return out[0], out[1]

    def damage_at(self, sel: Sel) -> list[tuple[str, object]]:
        """(side label, ``Damage``) of the damaged chunks that hold the selected cell's rows, or, for a
        cell one side lacks, that side's damaged row-key chunks of the tensor (rows it cannot place)."""
        traces, labels = self.report.traces, self.report.labels
        rows = self.pair_rows(sel)
        out = []
        for k, (trace, label) in enumerate(((traces.x, labels.x), (traces.y, labels.y))):
            for d in trace.damage:
                if d.tensor != sel.name or d.rows is None:
                    continue
                if rows is not None and d.rows[0] <= rows[k] < d.rows[1]:
                    out.append((label, d))
                elif rows is None and d.column != "data" and not self.present(sel)[k]:
                    out.append((label, d))
        return out

    def pair_rows(self, sel: Sel) -> tuple[int, int] | None:
        """Storage rows (x, y) of the selected cell's comparison, or None when not compared."""
        _, i = self.cell(sel)
        if i < 0:
            return None
        m = self.report.comparisons[sel.name].match
        return int(m.rows.x[i]), int(m.rows.y[i])

    # ---- navigation -------------------------------------------------------------------------
    def initial(self) -> Sel:
        """Where the app opens: the first divergence, else the first cell of the first sequence."""
        if self.first is not None:
            return self.first
        return Sel(self.names[0] if self.names else "tokens", 0, 0, 0)

    def tensor_step(self, current: Sel, step: int) -> Sel | None:
        """The first failing row of the next (step=1) / previous (step=-1) diverged tensor in dataflow
        order, wrapping around (``n`` / ``N``); None when nothing diverged."""
        names = list(dict.fromkeys(s.name for s in self.divergences))
        if not names:
            return None
        if current.name in names:
            i = names.index(current.name) + step
        else:  # not on a diverged tensor: the next one below (or above) it in the grid's order
            order = {n: k for k, n in enumerate(self.names)}
            here = order.get(current.name, -1)
            later = [k for k, n in enumerate(names) if order.get(n, -1) > here]
            i = (later[0] if later else len(names)) if step > 0 else (later[0] - 1 if later else len(names) - 1)
        name = names[i % len(names)]
        return next(s for s in self.divergences if s.name == name)

    def row_step(self, current: Sel, step: int) -> Sel | None:
        """The next (step=1) / previous (step=-1) failing row of the current tensor (position, then
        sequence, then depth order, as the report lists them), wrapping around (``]`` / ``[``); None
        when the tensor has no failing row."""
        rows = [s for s in self.divergences if s.name == current.name]
        if not rows:
            return None
        if current in rows:
            return rows[(rows.index(current) + step) % len(rows)]
        key = (current.pos, current.pair, current.depth)
        after = [s for s in rows if (s.pos, s.pair, s.depth) > key]
        if step > 0:
            return after[0] if after else rows[0]
        before = [s for s in rows if (s.pos, s.pair, s.depth) < key]
        return before[-1] if before else rows[-1]

    # ---- text -------------------------------------------------------------------------------
    def decode(self, ids) -> str | None:
        if self.tokenizer is None:
            return None
        try:
            return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        except Exception:
            return None

    def prompt_preview(self, pair: int, width: int = 40) -> str:
        """The prompt of aligned sequence ``pair`` in one line of at most ``width`` cells: decoded with
        the target tokenizer (newlines as ⏎, tabs as →), else its first token ids."""
        p = self.pairs[pair]
        toks = self.report.traces.x.sequence(p.seq.x).tokens[: max(p.prompt_len, 1)]
        text = self.decode(toks)
        if text is None:
            text = " ".join(str(int(t)) for t in toks[: max(width // 2, 16)])
        text = text.replace("\n", "⏎").replace("\t", "→")
        return text if len(text) <= width else text[: width - 1] + "…"
