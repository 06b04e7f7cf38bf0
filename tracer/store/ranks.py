"""Per-rank serving traces opened as one logical trace.

A server with data parallelism (``--dp-size N``) runs N scheduler replicas, each serving its own
requests; the recorder writes one store per replica, ``<SPECDIFF_TRACE>/dp<r>``
(tracer/engines/sglang/plugin.py). ``open_trace(<SPECDIFF_TRACE>)`` finds those rank stores and returns a
``RankedTrace``: the union of their sequences, each tensor's rows rank after rank.

Tensor-parallel ranks of one replica record nothing of their own: they run the same batch, their
hidden states are all-reduced and their logits all-gathered, so every tensor the recorder reads is
the same on each TP rank; only TP rank 0 records (sglang_plugin.load).

Sequence ids: rank r's ``seq`` ids are shifted by the ids of the ranks before it (rank 0 keeps
its own), so ids stay unique; rids are unique across replicas already (each request goes to one).
"""

from __future__ import annotations

import re

import fsspec
import numpy as np

from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.errors import TraceError
from specdiff.tracer.store.base import TraceReader
from specdiff.tracer.store.chunks import join
from specdiff.tracer.store.damage import Damage

RANK_DIR = re.compile(r"^dp(\d+)$")
#: contract facts that belong to one rank (what it saw or spent), merged rather than compared;
#: every other fact says which model and settings ran and must be the same on every rank.
PER_RANK_FACTS = ("dropped_records", "crash", "recorder_hook_s", "recorder_iter_s", "recorder_writer_s",
                  "recorder_writer_cpu_s", "recorder_writer", "recorder_caught_up_at", "bos_added", "unobservable",
                  "findings")


def rank_stores(path: str) -> list[tuple[str, str]]:
    """``[(label, path)]`` of the rank stores under ``path`` (``dp<r>`` holding a ``zarr.json``),
    by rank; empty when ``path`` is not a directory of rank stores."""
    fs, root = fsspec.core.url_to_fs(path)
    try:
        entries = fs.ls(root, detail=False)
    except (FileNotFoundError, NotADirectoryError, OSError):
        return []
    found = []
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        m = RANK_DIR.match(name)
        if m and fs.exists(f"{root.rstrip('/')}/{name}/zarr.json"):
            found.append((int(m.group(1)), name))
    return [(name, join(path, name)) for _, name in sorted(found)]


def _merged_contract(path: str, labels: list[str], contracts: list[dict]) -> dict:
    keys = sorted(set().union(*contracts))
    merged = dict(contracts[0])
    for key in keys:
        values = [c.get(key) for c in contracts]
        if key == "dropped_records":
            merged[key] = UNKNOWN if UNKNOWN in values else sum(v or 0 for v in values)
        elif key == "crash":
            merged[key] = next((v for v in values if v is not None), None)
        elif key == "recorder_writer_cpu_s":  # every rank's writer process ran on its own
            merged[key] = UNKNOWN if UNKNOWN in values else sum(v or 0 for v in values)
        elif key == "recorder_writer":  # each rank's own writer; one may have fallen back to the thread
            same = all(v == values[0] for v in values)
            merged[key] = values[0] if same else {"per_rank": dict(zip(labels, values, strict=True))}
        elif key == "recorder_caught_up_at":  # every rank has written all it was handed before the earliest
            if any(key not in c for c in contracts):
                merged.pop(key, None)  # a rank that does not mark (thread writer): the watcher's clock counts
            else:
                marks = [v for v in values if isinstance(v, (int, float))]  # None: that rank's writer is done
                merged[key] = min(marks) if marks else None
        elif key == "bos_added":
            known = {repr(v): v for v in values if v not in (None, UNKNOWN)}
            if len(known) > 1:
                raise TraceError(f"{path}: rank stores disagree on bos_added "
                                 f"({', '.join(f'{lb}: {v!r}' for lb, v in zip(labels, values, strict=True))}); "
                                 "open each rank on its own")
            merged[key] = next(iter(known.values())) if known else values[0]
        elif key in PER_RANK_FACTS:
            continue
        else:
            for label, value in zip(labels[1:], values[1:], strict=True):
                if value != values[0]:
                    raise TraceError(f"{path}: rank stores disagree on {key} ({labels[0]}: {values[0]!r}, "
                                     f"{label}: {value!r}), so they are not ranks of one server; "
                                     "open each rank on its own")
    return {k: v for k, v in merged.items() if v is not None}


class RankedTrace(TraceReader):
    """The rank stores of one server (``rank_stores``) read as one trace; same reading interface
    as ``tracer.store.Trace`` (their shared base: ``tracer.store.base.TraceReader``).

    Attributes:
        ranks: ``[(label, Trace)]`` by rank (``label`` is ``dp<r>``).
        path, side, format, contract (merged: ``PER_RANK_FACTS`` combined, every other fact equal
        on all ranks), sequences (union, ids shifted per rank), records, closed (every rank closed),
        cut_tail_bytes (sum).

    Rows of a tensor: rank 0's rows, then rank 1's, ... (row ``i`` of rank r is row
    ``offset_r + i``); ``seq`` keys come back shifted like the sequences.

    Raises (at construction):
        TraceError: the ranks disagree on side, format, a model/settings fact, or a tensor's dtype
            or shape (one line naming both ranks and the fact).
    """

    def __init__(self, path: str, ranks: list):
        self.path = path
        self.ranks = ranks
        labels = [label for label, _ in ranks]
        traces = [t for _, t in ranks]
        for attr in ("side", "format"):
            values = [getattr(t, attr) for t in traces]
            if len(set(values)) > 1:
                raise TraceError(f"{path}: rank stores disagree on {attr} ({labels[0]}: {values[0]!r}, "
                                 f"{labels[values.index(next(v for v in values if v != values[0]))]}: "
                                 f"{next(v for v in values if v != values[0])!r}); open each rank on its own")
        self.side, self.format = traces[0].side, traces[0].format
        self.contract = _merged_contract(path, labels, [t.contract for t in traces])
        self._layout: dict[str, tuple[str, tuple[int, ...]]] = {}
        for label, t in ranks:
            for name in t.names:
                info = t.info(name)
                known = self._layout.setdefault(name, (info.dtype, info.shape))
                if known != (info.dtype, info.shape):
                    raise TraceError(f"{path}: rank stores disagree on tensor {name} ({labels[0]}: {known}, "
                                     f"{label}: {(info.dtype, info.shape)}); open each rank on its own")
        self._seq_base, base = [], 0
        self.sequences = []
        for t in traces:
            self._seq_base.append(base)
            for s in t.sequences:
                self.sequences.append(type(s)(s.id + base, s.tokens, s.prompt_len, s.rid))
            base += max((s.id for s in t.sequences), default=-1) + 1
        self.records = sum(t.records for t in traces)
        self.closed = all(t.closed for t in traces)
        self.cut_tail_bytes = sum(t.cut_tail_bytes for t in traces)

    # ---- rows across ranks -------------------------------------------------------------------
    def _offsets(self, name: str) -> np.ndarray:
        """int64 [ranks + 1]: first row of each rank in the logical tensor, then the total."""
        rows = [t.rows(name) if name in t.names else 0 for _, t in self.ranks]
        return np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)

    def _spans(self, name: str, start: int, stop: int):
        off = self._offsets(name)
        for r, (_, t) in enumerate(self.ranks):
            a, b = max(start, off[r]), min(stop, off[r + 1])
            if a < b:
                yield r, t, int(a - off[r]), int(b - off[r])

    def _shift(self, r: int, column: str, values: np.ndarray) -> np.ndarray:
        if column != "seq" or not self._seq_base[r]:
            return values
        return np.where(values >= 0, values + self._seq_base[r], values).astype(values.dtype)  # -1: damaged

    def rows(self, name: str) -> int:
        """Rows of ``name`` over every rank."""
        return int(self._offsets(name)[-1])

    def chunks(self, name: str, *, per_range: int = 4) -> list[tuple[int, int]]:
        """Each rank's chunk-aligned ranges (``Trace.chunks``), shifted to logical rows."""
        off = self._offsets(name)
        out = []
        for r, (_, t) in enumerate(self.ranks):
            if off[r + 1] > off[r]:
                out += [(int(a + off[r]), int(b + off[r])) for a, b in t.chunks(name, per_range=per_range)]
        return out or [(0, 0)]

    def _read(self, name: str, column: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        # ``out`` unused: rows are gathered from the ranks' stores into a new array
        parts = []
        for r, t, a, b in self._spans(name, start, stop):
            parts.append(self._shift(r, column, t._read(name, column, a, b)))
        if not parts:
            return self._empty(name, column)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def take(self, name: str, rows: np.ndarray, *, column: str = "data") -> np.ndarray:
        """Rows at the given logical indices (any order); storage dtype like ``Trace.take``."""
        rows = np.asarray(rows, np.int64)
        off = self._offsets(name)
        rank = np.searchsorted(off, rows, side="right") - 1
        out = None
        for r in np.unique(rank).tolist():
            sel = rank == r
            part = self._shift(r, column, self.ranks[r][1].take(name, rows[sel] - off[r], column=column))
            if out is None:
                out = np.empty((len(rows), *part.shape[1:]), part.dtype)
            out[sel] = part
        return self._empty(name, column) if out is None else out

    # ---- damage ------------------------------------------------------------------------------
    @property
    def damage(self) -> list[Damage]:
        """Every rank's damage (each line names its rank store)."""
        return [d for _, t in self.ranks for d in t.damage]

    def unreadable(self, name: str, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        off = self._offsets(name)
        rank = np.searchsorted(off, rows, side="right") - 1
        out = np.zeros(len(rows), bool)
        for r in np.unique(rank).tolist():
            sel = rank == r
            out[sel] = self.ranks[r][1].unreadable(name, rows[sel] - off[r])
        return out

    def check_sizes(self) -> list[Damage]:
        """Every rank's ``Trace.check_sizes`` (chunk files missing or cut short, no value read)."""
        for _, t in self.ranks:
            t.check_sizes()
        return self.damage

    def verify(self) -> list[Damage]:
        for _, t in self.ranks:
            t.verify()
        return self.damage


__all__ = ["RankedTrace", "rank_stores", "PER_RANK_FACTS"]
