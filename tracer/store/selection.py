"""A trace seen as if it held only some of its sequences: ``select_sequences`` -> ``Selection``.

``specdiff watch`` diffs one request at a time out of a serving trace (and the watch's own
training trace) that grows with every request. ``select_sequences(trace, ids)`` is the trace the
diff reads for one request: its sequences are ``ids``; its rows of each tensor are those keyed to
them and those keyed to no sequence (seq < 0: trace-wide tensors such as ``draft.d2t``), in
recorded order, numbered from 0; every tensor name of the trace stays (with 0 rows where the
request has none). Rows are read from the trace on demand (``take``): only the chunks that hold them.

Which rows those are comes from the trace's ``row_index`` (``SequenceRows``). ``TraceFollower``
keeps one up to date from the journal's ``rec`` entries as it decodes them (each entry states its
rows' ``seq`` keys), so a selection costs the selected rows, not the trace. A trace without one
(opened by ``open_trace``, closed, per-rank) gets one built from its ``seq`` key columns at its first
selection: one read of every tensor's ``seq`` column, then every selection of that trace is cheap.
"""

from __future__ import annotations

import sys
from array import array

import numpy as np

from specdiff.tracer.store.base import TraceReader
from specdiff.tracer.store.layout import KEY_COLUMNS

SEQ_DTYPE = np.dtype(dict(KEY_COLUMNS)["seq"])


class SequenceRows:
    """Which rows of each tensor each ``seq`` key holds: name -> seq -> row spans, appended in
    row order (a tensor's rows are appended in order, so every seq's spans ascend).

    Memory: 16 bytes per span (adjacent rows of one seq merge into one span): a serving trace's
    decode rows are one span each (a batch interleaves its requests). ``forget`` drops a
    sequence's spans once nothing will select it again (the watch forgets each request it diffed).
    """

    def __init__(self):
        self._spans: dict[str, dict[int, array]] = {}  # name -> seq -> int64 [start, stop, start, stop, ...]
        self._unkeyed: dict[str, set[int]] = {}  # name -> its seq keys < 0 (rows of no sequence)
        self._forgotten: set[int] = set()

    def feed(self, entries) -> SequenceRows:
        """Take journal entries (``tracer.store.journal``), in journal order; ``rec`` entries add
        their rows (``row0`` .. ``row0 + n - 1``, keyed by their ``seq`` bytes); returns self."""
        for e in entries:
            if e.get("t") == "rec" and "seq" in e:
                key = e["seq"]
                if len(key) == SEQ_DTYPE.itemsize:  # one row (a decode step's): no array needed
                    row = int(e["row0"])
                    self._add_run(e["name"], int.from_bytes(key, sys.byteorder, signed=True), row, row + 1)
                else:
                    self.add(e["name"], int(e["row0"]), np.frombuffer(key, SEQ_DTYPE))
        return self

    @classmethod
    def from_keys(cls, trace) -> SequenceRows:
        """The index of an opened trace from its ``seq`` key columns (reads each one whole)."""
        index = cls()
        for name in trace.names:
            index.add(name, 0, trace.keys(name, columns=("seq",))["seq"])
        return index

    def add(self, name: str, row0: int, seq: np.ndarray) -> None:
        """Rows ``row0 .. row0 + len(seq) - 1`` of ``name``, keyed ``seq`` (int [n]), appended after
        every row added before (a forgotten sequence's rows are not kept)."""
        n = len(seq)
        if not n:
            return
        if seq[0] == seq[-1] and (n == 1 or bool((seq == seq[0]).all())):  # one record, one sequence
            self._add_run(name, int(seq[0]), row0, row0 + n)
            return
        if n <= 64:  # a decode step's batch: a Python scan costs less than numpy's calls
            values = seq.tolist()
            edges = [i for i in range(1, n) if values[i] != values[i - 1]]
        else:
            edges = (np.flatnonzero(seq[1:] != seq[:-1]) + 1).tolist()
            values = None
        bounds = [0, *edges, n]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            self._add_run(name, values[a] if values is not None else int(seq[a]), row0 + a, row0 + b)

    def _add_run(self, name: str, seq: int, start: int, stop: int) -> None:
        """Rows [start, stop) of ``name`` keyed ``seq``."""
        spans = self._spans.get(name)
        if spans is None:
            spans = self._spans[name] = {}
        got = spans.get(seq)
        if got is None:
            if seq in self._forgotten:
                return
            spans[seq] = got = array("q")
            if seq < 0:
                self._unkeyed.setdefault(name, set()).add(seq)
        if got and got[-1] == start:  # continues its last span
            got[-1] = stop
        else:
            got.extend((start, stop))

    def rows(self, name: str, seq_ids, *, stop: int) -> np.ndarray:
        """int64 [k], ascending: the rows of ``name`` below ``stop`` keyed to one of ``seq_ids`` or
        to no sequence (seq < 0).

        Raises:
            KeyError: a sequence in ``seq_ids`` was forgotten (its rows are no longer known).
        """
        gone = self._forgotten.intersection(int(s) for s in seq_ids)
        if gone:
            raise KeyError(f"sequences {sorted(gone)} were forgotten by this row index")
        spans = self._spans.get(name, {})
        wanted = {int(s) for s in seq_ids} | self._unkeyed.get(name, set())
        parts = [np.array(spans[s], np.int64).reshape(-1, 2) for s in wanted if s in spans]
        if not parts:
            return np.zeros(0, np.int64)
        runs = np.concatenate(parts)
        runs = runs[np.argsort(runs[:, 0], kind="stable")]
        runs = runs[runs[:, 0] < stop]
        runs[:, 1] = np.minimum(runs[:, 1], stop)
        lengths = runs[:, 1] - runs[:, 0]
        # each span start, repeated over its rows, plus the row's offset within its span
        offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return np.repeat(runs[:, 0], lengths) + offsets

    def forget(self, seq_ids) -> None:
        """Drop the rows of ``seq_ids`` (and any added later): selecting them raises from now on."""
        ids = {int(s) for s in seq_ids}
        self._forgotten |= ids
        for spans in self._spans.values():
            for s in ids:
                spans.pop(s, None)


class Selection(TraceReader):
    """An opened trace restricted to some sequences (see the module docstring); the same reading
    interface as ``Trace``. Row ``i`` of ``name`` here is row ``base_rows[name][i]`` of ``base``.

    Attributes:
        base: the trace selected from.
        base_rows: name -> int64 [rows here], the base trace's row of each row here (ascending).
        path, side, format, contract, records, closed, cut_tail_bytes: the base trace's.
        sequences: the selected sequences.
    """

    def __init__(self, base, base_rows: dict[str, np.ndarray], sequences: list):
        self.base, self.base_rows, self.sequences = base, base_rows, sequences
        for attr in ("path", "side", "format", "contract", "records", "closed", "cut_tail_bytes"):
            setattr(self, attr, getattr(base, attr))
        self._layout = base._layout
        self._keys: dict[tuple[str, str], np.ndarray] = {}  # the diff reads a tensor's keys several times

    def rows(self, name: str) -> int:
        """Selected rows of ``name``; 0 if absent."""
        got = self.base_rows.get(name)
        return 0 if got is None else len(got)

    def _read(self, name: str, column: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        if column == "data":  # ``out`` unused: the rows are gathered from the base trace's chunks
            return self.take(name, np.arange(start, stop, dtype=np.int64))
        got = self._keys.get((name, column))
        if got is None:
            got = self._keys[(name, column)] = self.take(name, np.arange(self.rows(name), dtype=np.int64),
                                                         column=column)
        return got[start:stop].copy()

    def take(self, name: str, rows: np.ndarray, *, column: str = "data") -> np.ndarray:
        """Selected rows at the given indices (any order), storage dtype like ``Trace.take``."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return self._empty(name, column)
        return self.base.take(name, self.base_rows[name][rows], column=column)

    def chunks(self, name: str, *, per_range: int = 4) -> list[tuple[int, int]]:
        """The selected rows cut where the base trace's chunk ranges (``Trace.chunks``) are."""
        n = self.rows(name)
        if not n:
            return [(0, 0)]
        starts = np.array([a for a, _ in self.base.chunks(name, per_range=per_range)], np.int64)
        cuts = np.unique(np.searchsorted(self.base_rows[name], starts))
        cuts = cuts[(cuts > 0) & (cuts < n)].tolist()
        return list(zip([0, *cuts], [*cuts, n], strict=True))

    @property
    def damage(self) -> list:
        """The base trace's damage (found at open and by every read, this selection's included)."""
        return self.base.damage

    def unreadable(self, name: str, rows: np.ndarray) -> np.ndarray:
        """bool [len(rows)]: which of the selected ``rows`` lie in damaged chunks of the base trace."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return np.zeros(0, bool)
        return self.base.unreadable(name, self.base_rows[name][rows])

    def verify(self) -> list:
        """``verify`` of the base trace (every chunk, not just the selected rows')."""
        return self.base.verify()


def select_sequences(trace, seq_ids) -> Selection:
    """``trace`` as if it held only the sequences ``seq_ids`` (module docstring): costs the
    selected rows when ``trace.row_index`` is set (``TraceFollower``); otherwise that index is
    built from the trace's ``seq`` key columns first, once per trace object.

    Raises:
        KeyError: a sequence the trace does not list, or one ``trace.row_index`` forgot
            (``SequenceRows.forget``).
    """
    index = trace.row_index
    if index is None:
        index = trace.row_index = SequenceRows.from_keys(trace)
    keep = list(dict.fromkeys(int(s) for s in seq_ids))
    sequences = [trace.sequence(s) for s in keep]
    rows = {name: index.rows(name, keep, stop=trace.rows(name)) for name in trace.names}
    return Selection(trace, rows, sequences)


__all__ = ["SequenceRows", "Selection", "select_sequences"]
