"""The read interface shared by ``Trace`` (one store) and ``RankedTrace`` (per-rank stores).

A subclass holds ``_layout`` (name -> (storage dtype name, feature shape)) and ``sequences``, and
implements the row primitives ``rows``, ``_read`` and ``take``; everything a reader calls on top
of them (names, info, keys, read, read_storage, read_torch, take_float, sequence) is written once
here, so the two trace kinds cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.tracer.schema import ordered, spec_for
from specdiff.tracer.store.arrays import STORAGE_DTYPES, from_storage, to_torch
from specdiff.tracer.store.layout import KEY_COLUMNS, Sequence


@dataclass(frozen=True)
class TensorInfo:
    """Shape facts of one tensor in a trace: ``rows`` x ``shape`` of ``dtype`` (storage name)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    rows: int
    dims: tuple[str, ...]


class TraceReader:
    """Rows of a trace's tensors by name; see ``Trace`` and ``tracer.store.ranks.RankedTrace``.

    Subclasses set ``_layout`` and ``sequences`` and implement ``rows(name) -> int``,
    ``_read(name, column, start, stop, out=None)`` (rows [start, stop) of ``column`` --
    ``"data"`` or a key column -- in storage dtype) and ``take(name, rows, *, column="data")``.
    """

    _layout: dict[str, tuple[str, tuple[int, ...]]]
    sequences: list[Sequence]
    #: which rows each sequence holds (``tracer.store.selection.SequenceRows``), when known: kept
    #: by ``TraceFollower`` from the journal; ``selection.select_sequences`` builds it otherwise
    row_index = None

    def rows(self, name: str) -> int:
        raise NotImplementedError

    def _read(self, name: str, column: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def take(self, name: str, rows: np.ndarray, *, column: str = "data") -> np.ndarray:
        raise NotImplementedError

    def _empty(self, name: str, column: str = "data") -> np.ndarray:
        """No rows of ``column`` of ``name``: [0, *shape] storage dtype (data) or [0] (a key)."""
        if column == "data":
            dtype, shape = self._layout[name]
            return np.empty((0, *shape), STORAGE_DTYPES[dtype])
        return np.empty(0, dict(KEY_COLUMNS)[column])

    @property
    def names(self) -> list[str]:
        """Tensor names in dataflow order (schema.ordered)."""
        return ordered(self._layout)

    def info(self, name: str) -> TensorInfo:
        """Shape facts of ``name``. Raises KeyError if absent."""
        dtype, shape = self._layout[name]
        return TensorInfo(name, dtype, shape, self.rows(name), spec_for(name).dims)

    def take_float(self, name: str, rows: np.ndarray) -> np.ndarray:
        """``take`` with bf16 upcast exactly and every float as float32 (for comparisons):
        float32 [len(rows), *shape] (ints and bools unchanged)."""
        return from_storage(self.take(name, rows), self._layout[name][0], as_float32=True)

    def keys(self, name: str, start: int = 0, stop: int | None = None, *,
             columns=("seq", "pos", "depth", "iter")) -> dict[str, np.ndarray]:
        """Row keys of ``name``: ``{"seq","pos","depth","iter"}`` (or ``columns``) -> int arrays [rows]."""
        stop = self.rows(name) if stop is None else stop
        return {k: self._read(name, k, start, stop) for k in columns}

    def read(self, name: str, start: int = 0, stop: int | None = None, *, as_float32: bool = False) -> np.ndarray:
        """Rows [start, stop) of ``name`` as numpy: [n, *shape]. bf16 comes back as exact float32."""
        stop = self.rows(name) if stop is None else stop
        return from_storage(self._read(name, "data", start, stop), self._layout[name][0], as_float32=as_float32)

    def read_storage(self, name: str, start: int = 0, stop: int | None = None, *,
                     out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) of ``name`` in storage dtype (bf16 as raw uint16 bits; no upcast copy).

        ``out``: a buffer of the rows' shape and storage dtype that rows may be read into (and
        returned); a new array comes back when the reader cannot use it.
        """
        stop = self.rows(name) if stop is None else stop
        return self._read(name, "data", start, stop, out)

    def read_torch(self, name: str, start: int = 0, stop: int | None = None):
        """Rows [start, stop) as a torch tensor in the recorded dtype (bf16 restored bit for bit)."""
        stop = self.rows(name) if stop is None else stop
        return to_torch(self._read(name, "data", start, stop), self._layout[name][0])

    def sequence(self, seq_id: int) -> Sequence:
        """The sequence whose ``seq`` key is ``seq_id``. Raises KeyError if absent.

        A lookup in a table built at the first call (and again when ``sequences`` is replaced or
        grows): the watch looks up one request at a time in a trace of thousands."""
        table = self.__dict__.get("_sequence_table")
        if table is None or table[0] is not self.sequences or table[1] != len(self.sequences):
            by_id: dict[int, Sequence] = {}
            for s in self.sequences:
                by_id.setdefault(int(s.id), s)  # the first one, as the scan this replaced found
            table = self._sequence_table = (self.sequences, len(self.sequences), by_id)
        return table[2][int(seq_id)]


__all__ = ["TensorInfo", "TraceReader"]
