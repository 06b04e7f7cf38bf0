"""Read a trace: ``open_trace`` -> ``Trace`` (rows by tensor, keys, sequences, contract, damage)."""

from __future__ import annotations

import os

import numpy as np
import zarr

from specdiff.tracer.errors import TraceError
from specdiff.tracer.schema import ordered
from specdiff.tracer.store.arrays import STORAGE_DTYPES
from specdiff.tracer.store.base import TraceReader
from specdiff.tracer.store.chunks import ArrayReader, metadata_problem, open_arrays, read_bytes
from specdiff.tracer.store.chunks import join as _join
from specdiff.tracer.store.damage import Damage
from specdiff.tracer.store.journal import (
    JOURNAL_NAME,
    JournalFollower,
    read_journal,
)
from specdiff.tracer.store.layout import (
    FORMAT_VERSION,
    KEY_COLUMNS,
    SEQUENCE_ARRAYS,
    local_path,
    open_store,
)
from specdiff.tracer.store.recover import Contents, JournalReplay, from_journal, from_zarr, zarr_tensors
from specdiff.tracer.store.selection import SequenceRows


class Trace(TraceReader):
    """A trace opened for reading (see ``open_trace``).

    Attributes:
        path, side, format, contract, sequences (list[Sequence]), records (appends recorded),
        closed (the writer closed cleanly), cut_tail_bytes (bytes of a cut last journal entry).

    Damage (``tracer.store.damage``) never stops reading: rows in a damaged chunk read as NaN (floats),
    -1 (ints, row keys) or False, ``unreadable`` says which rows those are, and ``damage`` lists
    what was found so far (at open: journal, metadata, missing chunk files; on read: chunks that
    fail to decode). ``verify`` reads every chunk.
    """

    def __init__(self, path: str, store, contents: Contents, damage: list[Damage]):
        self.path = path
        self.open_store = store
        self.format = contents.format
        self.side = contents.side
        self.contract = contents.contract
        self.sequences = contents.sequences
        self.records = contents.records
        self.closed = contents.closed
        self.cut_tail_bytes = contents.cut_tail_bytes
        self._committed = contents.committed
        self._layout = contents.layout
        self._tail = contents.tail
        self._damage = list(damage)
        self._readers: dict[str, dict[str, ArrayReader]] = {}
        written = [name for name, rows in self._committed.items() if rows]
        opened = open_arrays(store, [f"tensors/{name}/{k}" for name in written for k in ("data", *dict(KEY_COLUMNS))])
        for name in written:
            self._readers[name] = self._open_arrays(name, self._committed[name], opened)
        self._sequence_readers: list[ArrayReader] = []

    def _open_arrays(self, name: str, rows: int, opened: dict) -> dict[str, ArrayReader]:
        dtype_name, shape = self._layout[name]
        key = f"tensors/{name}/data"
        out = {"data": ArrayReader(trace=self.path, store=self.open_store, key=key, tensor=name, column="data",
                                   rows=rows, dtype=STORAGE_DTYPES[dtype_name], shape=shape,
                                   fill=damaged_fill(dtype_name), opened=opened[key])}
        for k, kd in KEY_COLUMNS:
            key = f"tensors/{name}/{k}"
            out[k] = ArrayReader(trace=self.path, store=self.open_store, key=key, tensor=name, column=k, rows=rows,
                                 dtype=np.dtype(kd), shape=(), fill=-1, opened=opened[key])
        return out

    # ---- damage -----------------------------------------------------------------------------
    @property
    def damage(self) -> list[Damage]:
        """Every damage found so far: journal and metadata first, then tensors in dataflow order."""
        out = list(self._damage)
        for name in ordered(self._readers):
            for reader in self._readers[name].values():
                out += [d for _, d in sorted(reader.damage.copy().items())]
        for reader in self._sequence_readers:
            out += [d for _, d in sorted(reader.damage.copy().items())]
        return out

    def unreadable(self, name: str, rows: np.ndarray) -> np.ndarray:
        """bool [len(rows)]: which of ``rows`` of ``name`` lie in damaged chunks (data or row keys)."""
        rows = np.asarray(rows, np.int64)
        out = np.zeros(len(rows), bool)
        for reader in self._readers.get(name, {}).values():
            if reader.damage:
                out |= reader.bad(rows) & (rows < self._committed.get(name, 0))
        return out

    def check_sizes(self) -> list[Damage]:
        """Find the damage chunk files' sizes show without reading a value (missing files, files cut
        short: ``ArrayReader.check_sizes``) in every tensor's arrays, and return ``damage``.
        ``verify`` reads every chunk."""
        for name in ordered(self._readers):
            for reader in self._readers[name].values():
                reader.check_sizes()
        return self.damage

    def verify(self) -> list[Damage]:
        """Read every chunk of every array (tensors, row keys, the sequence table) and return
        ``damage``. Memory: one chunk at a time."""
        for name in ordered(self._readers):
            for reader in self._readers[name].values():
                reader.verify()
        if self.closed and self.sequences and not self._sequence_readers:
            for k, kd in SEQUENCE_ARRAYS:
                if k == "id" and read_bytes(self.path, "sequences/id/zarr.json") is None:
                    continue  # written since specdiff stores sequence ids in zarr; older traces lack it
                reader = ArrayReader(trace=self.path, store=self.open_store, key=f"sequences/{k}", tensor=None,
                                     column="sequences", rows=None, dtype=np.dtype(kd), shape=(), fill=-1)
                reader.verify()
                self._sequence_readers.append(reader)
        return self.damage

    def rows(self, name: str) -> int:
        """Rows of ``name`` written so far (committed plus the journalled tail); 0 if absent."""
        tail = self._tail.get(name)
        return self._committed.get(name, 0) + (tail[0].shape[0] if tail else 0)

    def chunks(self, name: str, *, per_range: int = 4) -> list[tuple[int, int]]:
        """Row ranges aligned to the stored chunks, ``per_range`` chunks each (memory bounded by
        that many chunks, ~16 MiB by default); several chunks per read let zarr decode them in
        parallel (benchmarks/store_throughput.py: ~1.7x over one chunk per read)."""
        total, done = self.rows(name), self._committed.get(name, 0)
        reader = self._readers[name]["data"] if done else None
        if reader is not None and reader.array is not None:
            step = reader.chunk_rows * max(per_range, 1)
        else:
            step = max(total, 1)
        bounds = list(range(0, done, step)) + [done] if done else [0]
        ranges = [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
        if total > done:
            ranges.append((done, total))
        return ranges

    def _read(self, name: str, column: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        done = self._committed.get(name, 0)
        parts = []
        if start < done:
            parts.append(self._readers[name][column].read(start, min(stop, done), out if stop <= done else None))
        if stop > done:
            data, keys = self._tail[name]
            src = data if column == "data" else keys[column]
            # A copy: the tail is this trace's own (maybe read-only) buffer, not the caller's to change.
            parts.append(src[max(start - done, 0):stop - done].copy())
        if not parts:  # no rows asked for (a tensor written with none, or start == stop)
            return self._empty(name, column)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def take(self, name: str, rows: np.ndarray, *, column: str = "data") -> np.ndarray:
        """Rows at the given indices (any order), reading only the chunks that hold them.

        Returns storage dtype for ``column="data"`` (bf16 as raw uint16; see ``read``).
        """
        rows = np.asarray(rows, dtype=np.int64)
        done = self._committed.get(name, 0)
        out = None
        head = rows < done
        if head.any():
            part = self._readers[name][column].take(rows[head])
            out = np.empty((len(rows), *part.shape[1:]), part.dtype)
            out[head] = part
        if (~head).any():
            data, keys = self._tail[name]
            src = data if column == "data" else keys[column]
            part = src[rows[~head] - done]
            if out is None:
                out = np.empty((len(rows), *part.shape[1:]), part.dtype)
            out[~head] = part
        return self._empty(name, column) if out is None else out



def damaged_fill(dtype_name: str):
    """What a row of a damaged chunk reads as, in storage dtype: NaN floats (bf16 NaN bits 0x7FC0),
    -1 ints, False flags, so a damaged row can never pass for a recorded value of 0."""
    if dtype_name == "bfloat16":
        return 0x7FC0
    if dtype_name.startswith("float"):
        return np.nan
    return False if dtype_name == "bool" else -1



def _is_rank_parent(path: str) -> bool:
    """``path`` holds no trace of its own but per-rank traces (tracer.store.ranks)."""
    try:
        if read_bytes(path, "zarr.json") is not None:
            return False
    except OSError:
        return False
    from specdiff.tracer.store.ranks import rank_stores

    return bool(rank_stores(path))


def open_trace(path: str) -> Trace:
    """Open a trace for reading (local path or fsspec URL); a directory of per-rank traces
    (``dp<r>``, written by a data-parallel server) opens as one ``tracer.store.ranks.RankedTrace``.

    A damaged journal or group metadata is read around when the other copy holds the same facts
    (a closed trace's zarr metadata holds everything; the journal holds everything but the
    arrays), and listed in ``Trace.damage``; damaged chunks cost only their own rows.

    Raises:
        TraceError: one line naming ``path`` and what was found: not a zarr store, a zarr store
            that is not a specdiff trace, another format version, or damage that leaves no copy
            of the trace's facts (e.g. the journal of a trace whose writer never closed it cut
            before its header).
    """
    path = local_path(str(path))
    if "://" not in path and not os.path.exists(path):
        raise TraceError(f"{path}: no such trace (the path does not exist)")
    if _is_rank_parent(path):
        from specdiff.tracer.store.ranks import RankedTrace, rank_stores

        return RankedTrace(path, [(label, open_trace(sub)) for label, sub in rank_stores(path)])
    store = open_store(path)
    attrs, root_exc = None, None
    try:
        attrs = dict(zarr.open_group(store=store, mode="r").attrs)
    except Exception as exc:  # zarr raises many types for missing or foreign bytes
        root_exc = exc
    scan = read_journal(_join(path, JOURNAL_NAME))
    damage: list[Damage] = []
    if attrs is None:
        if not scan.usable or scan.problem:
            if isinstance(root_exc, (FileNotFoundError, zarr.errors.GroupNotFoundError,
                                     zarr.errors.NodeTypeValidationError)):
                raise TraceError(f"{path}: not a specdiff trace (no zarr group found)") from None
            if scan.size:  # both copies of the trace's facts are damaged
                problem, _ = metadata_problem(path, "zarr.json", root_exc)
                raise TraceError(f"{path}: zarr.json {problem} and {JOURNAL_NAME} {scan.problem}, so no intact copy "
                                 "of the trace's facts is left; copy the trace again from where it was recorded")
            raise TraceError(f"{path}: not a specdiff trace (zarr could not open it: {root_exc})") from None
        problem, action = metadata_problem(path, "zarr.json", root_exc)
        damage.append(Damage(path, "zarr.json", problem, "the trace's facts are read from its record journal "
                             "(nothing lost)", "copy the trace again to repair it", lost=False))
        meta = {"format": scan.entries[0].get("format"), "side": scan.entries[0].get("side")}
    else:
        meta = attrs.get("specdiff")
        if not isinstance(meta, dict) or "format" not in meta:
            raise TraceError(f"{path}: is a zarr store but not a specdiff trace (no 'specdiff' attributes)")
    if meta["format"] != FORMAT_VERSION:
        raise TraceError(f"{path}: specdiff trace format {meta['format']} is not supported "
                         f"(this specdiff reads format {FORMAT_VERSION}); use a matching specdiff version")
    closed = bool(attrs and attrs.get("closed"))
    ends_closed = scan.usable and scan.entries[-1].get("t") == "close"
    journal_bad = scan.problem is not None or (closed and not ends_closed)
    if journal_bad and closed:
        problem = scan.problem or (f"is truncated ({scan.size} bytes, it ends before its close entry)")
        contents, more = from_zarr(path, store, attrs)
        damage.append(Damage(path, JOURNAL_NAME, problem, "the trace was closed cleanly, so it is read from its "
                             "zarr arrays (nothing lost)", "copy the trace again to repair the journal",
                             lost=False))
        damage += more
    elif scan.problem is not None and not scan.usable:
        raise TraceError(f"{path}: record journal {scan.problem} and the writer never closed the trace, so no "
                         "other copy of its sequences exists; the trace cannot be opened (re-record it)")
    else:
        if scan.entries[0].get("format") != FORMAT_VERSION:
            raise TraceError(f"{path}: journal format {scan.entries[0].get('format')} does not match "
                             f"the store's format {FORMAT_VERSION}")
        zarr_rows = None
        if scan.problem is not None:  # unclosed trace, journal corrupt after its header
            zarr_rows, more = zarr_tensors(path, store)
            damage.append(Damage(path, JOURNAL_NAME, scan.problem, "the writer never closed this trace, so records "
                                 "journaled after that byte and not yet in zarr are lost", "re-record the trace"))
            damage += more
        for tries_left in range(3, -1, -1):
            try:
                contents = from_journal(path, scan.entries, cut_tail_bytes=scan.cut_tail_bytes, zarr_rows=zarr_rows)
                break
            except TraceError:
                # A live writer can commit between our journal read and a spill file read, and delete
                # that file (its rows are in zarr now): its journal then has grown. Read it again (a
                # few times: a busy writer keeps it growing); one that has not grown means the rows
                # are really gone.
                again = read_journal(_join(path, JOURNAL_NAME))
                if (not tries_left or ends_closed or zarr_rows is not None or again.problem is not None
                        or again.size <= scan.size):
                    raise
                scan = again
    return Trace(path, store, contents, damage)



class TraceFollower:
    """Follows a trace a live writer is appending to: ``poll()`` returns the trace as it stands,
    like ``open_trace``, but decodes only the journal bytes appended since the previous poll (the
    watch polls a serving trace every second for as long as the server runs; opening it in full
    each time costs the whole journal each time, so a day's trace would be read a day's worth of
    times).

    The first poll, and every poll once the trace is closed, damaged, replaced (a closing writer
    compacts its journal into a new file), on an fsspec URL or a data-parallel parent, is a full
    ``open_trace``: following covers only the healthy, growing, local case.

    A followed poll's trace carries ``row_index`` (``tracer.store.selection.SequenceRows``, kept
    from every ``rec`` entry the follower decodes, committed or not), so selecting one request's
    rows from it (``select_sequences``) costs that request's rows; ``forget`` drops the rows of
    sequences no one will select again (the index grows with the trace otherwise).

    Raises (``poll``):
        TraceError: as ``open_trace``.
    """

    def __init__(self, path: str):
        self.path = local_path(str(path))
        self._journal: JournalFollower | None = None
        self._replay: JournalReplay | None = None
        self._store = None
        self._index: SequenceRows | None = None
        self._forgotten: set[int] = set()  # of the trace whose journal header is ``_header``
        self._header: dict | None = None
        self.full_opens = 0  # polls that opened the trace in full

    def poll(self) -> Trace:
        """The trace as it stands now (see the class docstring for when this is a full open)."""
        if self._replay is not None:
            trace = self._follow()
            if trace is not None:
                return trace
        return self._open()

    def forget(self, seq_ids) -> None:
        """Rows of ``seq_ids`` will not be selected again: the row index drops them (and rows
        journalled for them later); selecting them from a later poll's trace raises KeyError."""
        self._forgotten |= {int(s) for s in seq_ids}
        if self._index is not None:
            self._index.forget(seq_ids)

    def _open(self) -> Trace:
        self._journal = self._replay = self._index = None
        trace = open_trace(self.path)
        self.full_opens += 1
        if "://" in self.path or not isinstance(trace, Trace) or trace.closed or trace.damage:
            return trace
        journal = JournalFollower(_join(self.path, JOURNAL_NAME))
        entries = journal.read_new()
        if journal.problem is None and entries and entries[0].get("t") == "header":
            replay = JournalReplay(self.path, entries[0]).feed(entries[1:])
            if replay.closed:  # closed since open_trace: compacted, its rec entries lack the row keys
                return trace  # no row index (selections build theirs from the keys); the next poll opens it
            self._journal, self._store, self._replay = journal, trace.open_store, replay
            if entries[0] != self._header:  # another trace at this path (its header holds its creation time)
                self._header, self._forgotten = entries[0], set()
            self._index = SequenceRows()
            self._index.forget(self._forgotten)
            # rows the journal holds past the trace opened above are cut by each selection's ``stop``
            trace.row_index = self._index.feed(entries[1:])
        return trace

    def _follow(self) -> Trace | None:
        """The trace from the journal's new entries; None when a full open must decide."""
        for _ in range(3):
            try:
                entries = self._journal.read_new()
                self._replay.feed(entries)
            except (OSError, TraceError):
                return None
            self._index.feed(entries)
            if self._journal.problem or self._journal.replaced or self._replay.closed:
                return None
            try:
                contents = self._replay.contents(cut_tail_bytes=self._journal.cut_tail_bytes)
            except TraceError:
                # a commit between our journal read and a spill file read removed the file (its
                # rows are in zarr now and the commit is journalled): read the new entries again
                continue
            trace = Trace(self.path, self._store, contents, [])
            trace.row_index = self._index
            return trace
        return None
