"""The specdiff trace store: a zarr v3 group plus an append-only msgpack journal.

Layout (traces/FORMAT.md has the full description)::

    <trace>/zarr.json                      group; attrs: specdiff {format, side}, contract, closed
    <trace>/journal.msgpack                write-ahead record journal (tracer.journal)
    <trace>/tensors/<name>/data            [row, *dims]  the tensor rows, compressed chunks
    <trace>/tensors/<name>/{seq,pos,depth,iter}  [row] int32/int16 row keys (schema.py)
    <trace>/sequences/{tokens,offsets,prompt_len}  written at close, for plain-zarr readers

``TraceWriter.append`` writes the record at once (its bytes to the tensor's spill file, then its
keys to the journal, so a SIGKILL loses nothing already appended) and buffers rows per tensor;
whole chunks go to zarr as they fill, a ``commit`` entry marks them durable and the spill file
is replaced by one holding only the rows still uncommitted (tracer.journal), so the trace's bytes
reach the disk once. ``open_trace`` reads committed rows from zarr and the uncommitted tail from
the spill files the journal names.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass

import fsspec
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.sync import sync as zarr_sync

from specdiff.tracer.arrays import STORAGE_DTYPES, from_storage, to_storage, to_torch
from specdiff.tracer.chunks import ArrayReader, metadata_problem, read_bytes
from specdiff.tracer.chunks import join as _join
from specdiff.tracer.contract import validate_contract
from specdiff.tracer.damage import Damage
from specdiff.tracer.errors import TraceError
from specdiff.tracer.journal import (
    JOURNAL_NAME,
    SPILL_PAYLOAD,
    JournalWriter,
    SpillWriter,
    compact_journal,
    read_journal,
    read_spill,
    remove_spill_dir,
    spill_key,
)
from specdiff.tracer.schema import ordered, spec_for

FORMAT_VERSION = 1
KEY_COLUMNS = (("seq", "int32"), ("pos", "int32"), ("depth", "int16"), ("iter", "int32"))
#: the sequence table written at close (sequence s = tokens[offsets[s]:offsets[s+1]], its seq key id[s])
SEQUENCE_ARRAYS = (("id", "int32"), ("tokens", "int32"), ("offsets", "int64"), ("prompt_len", "int32"))
CHUNK_BYTES = 4 << 20
KEY_CHUNK_FACTOR = 16
COMMIT_CHUNKS = 4
MAX_KEY_CHUNK_ROWS = 1 << 16  # edge chunks are stored whole: keep them small
SIDES = ("serve", "train")
# Chunks equal to the fill value must still be written: a missing chunk means a damaged store.
_ARRAY_CONFIG = {"write_empty_chunks": True}


def _compressors(dtype: np.dtype):
    # lz4 at level 1: hidden states barely compress, so speed beats ratio (benchmarks/store_throughput.py).
    # crc32c (zarr v3 codec) over the compressed bytes: a changed or cut chunk reads as damage, not
    # as a blosc error or, worse, as silently different values.
    shuffle = "bitshuffle" if dtype.itemsize <= 2 else "shuffle"
    return [BloscCodec(cname="lz4", clevel=1, shuffle=shuffle, typesize=dtype.itemsize), Crc32cCodec()]


@dataclass
class Sequence:
    """One token sequence of a trace.

    Attributes:
        id: the ``seq`` key of its rows.
        tokens: int32 [len] prompt + generated (serving) or the replayed sequence (training).
        prompt_len: tokens that came from the prompt.
        rid: the serving request id, or a training sample id.
    """

    id: int
    tokens: np.ndarray
    prompt_len: int
    rid: str | None


def local_path(path: str) -> str:
    """``file://`` URLs as plain paths: zarr's LocalStore creates parent directories where
    fsspec's local filesystem, by default, does not (so a ``file://`` trace could not be written)."""
    return path[len("file://"):] if path.startswith("file://") else path


class _Pending:
    """Rows appended to one tensor but not yet committed to zarr."""

    def __init__(self):
        self.data: list[np.ndarray] = []
        self.keys: dict[str, list[np.ndarray]] = defaultdict(list)
        self.rows = 0

    def add(self, data: np.ndarray, keys: dict[str, np.ndarray]) -> None:
        self.data.append(data)
        for k, v in keys.items():
            self.keys[k].append(v)
        self.rows += data.shape[0]

    def take(self, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Remove and return the first n rows."""
        data = np.concatenate(self.data) if len(self.data) > 1 else self.data[0]
        keys = {k: np.concatenate(v) for k, v in self.keys.items()}
        head, tail = data[:n], data[n:]
        self.data = [tail] if tail.shape[0] else []
        self.keys = defaultdict(list, {k: [v[n:]] for k, v in keys.items()} if tail.shape[0] else {})
        self.rows -= n
        return head, {k: v[:n] for k, v in keys.items()}


async def _grow_and_write(targets, start: int, stop: int) -> None:
    """Grow each zarr ``AsyncArray`` to ``stop`` rows and write ``values`` to rows [start, stop)."""

    async def one(array, values):
        await array.resize((stop, *array.shape[1:]))
        await array.setitem(slice(start, stop), values)

    await asyncio.gather(*(one(a, v) for a, v in targets))


class TraceWriter:
    """Write a trace. Not thread-safe: one thread appends (the SGLang plugin's writer thread).

    Args:
        path: local directory or fsspec URL (``memory://``, ``s3://``...) of the new trace.
        side: ``"serve"`` or ``"train"``.
        contract: contract facts (tracer.contract); more can be added with ``set_contract``.
        chunk_bytes: target size of one compressed-chunk's raw rows.
        overwrite: replace an existing trace at ``path``.

    Raises:
        TraceError: ``path`` already holds something and ``overwrite`` is False; bad side.
    """

    def __init__(self, path: str, *, side: str, contract: dict | None = None,
                 chunk_bytes: int = CHUNK_BYTES, overwrite: bool = False):
        if side not in SIDES:
            raise TraceError(f"{path}: side must be one of {SIDES}, got {side!r}")
        self.path = local_path(str(path))
        self.side = side
        self.chunk_bytes = chunk_bytes
        try:
            self._group = zarr.open_group(store=self.path, mode="w" if overwrite else "w-", zarr_format=3)
        except (FileExistsError, zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError):
            raise TraceError(f"{self.path}: already exists; choose another path or pass overwrite") from None
        self._contract = validate_contract(dict(contract or {}, side=side), where=self.path)
        self._group.attrs.update({"specdiff": {"format": FORMAT_VERSION, "side": side},
                                  "contract": self._contract, "closed": False})
        journal_url = _join(self.path, JOURNAL_NAME)
        if overwrite and "://" not in self.path and os.path.exists(journal_url):
            os.remove(journal_url)
        self._journal = JournalWriter(journal_url)
        self._journal.write({"t": "header", "format": FORMAT_VERSION, "side": side, "created": time.time(),
                             "payload": SPILL_PAYLOAD})
        self._journal.write({"t": "contract", "contract": self._contract})
        self._pending: dict[str, _Pending] = {}
        self._layout: dict[str, tuple[str, tuple[int, ...]]] = {}  # name -> (dtype, feature shape)
        self._rows: dict[str, int] = defaultdict(int)
        self._committed: dict[str, int] = defaultdict(int)
        self._arrays: dict[str, dict] = {}
        self._spills: dict[str, tuple[int, SpillWriter]] = {}  # name -> (generation, file)
        self._sequences: dict[int, Sequence] = {}
        self.records = 0
        self.closed = False

    # ---- contract and sequences -------------------------------------------------------------
    @property
    def contract(self) -> dict:
        return dict(self._contract)

    def set_contract(self, **facts) -> None:
        """Merge contract facts (validated) and journal them."""
        merged = validate_contract({**self._contract, **facts}, where=self.path)
        self._contract = merged
        self._journal.write({"t": "contract", "contract": merged})

    def add_sequence(self, tokens, *, prompt_len: int | None = None, rid: str | None = None,
                     seq_id: int | None = None) -> int:
        """Register (or replace, with ``seq_id``) a token sequence; returns its ``seq`` id.

        Args:
            tokens: int [len] token ids (prompt + generated on the serving side).
            prompt_len: tokens that came from the prompt (default: all).
            rid: request id / sample id.
        """
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        sid = len(self._sequences) if seq_id is None else int(seq_id)
        plen = len(toks) if prompt_len is None else int(prompt_len)
        self._sequences[sid] = Sequence(sid, toks, plen, rid)
        self._journal.write({"t": "seq", "id": sid, "tokens": toks.tobytes(), "prompt_len": plen,
                             "rid": rid})
        return sid

    # ---- tensors ----------------------------------------------------------------------------
    def append(self, name: str, data, *, seq, pos, depth=0, iter=-1) -> None:
        """Append rows of one canonical tensor.

        Args:
            name: canonical name (tracer.schema), e.g. ``"target.aux.0"``.
            data: torch tensor or numpy array [n, *dims] on the host (a scalar-per-row tensor may
                be [n]); dtype fixed by the first append of ``name``.
            seq, pos, depth, iter: int or int array [n] row keys (schema.py).

        Raises:
            UnknownTensorError: ``name`` is not canonical.
            TraceError: dtype/shape differs from earlier rows, or the writer is closed.
        """
        if self.closed:
            raise TraceError(f"{self.path}: append after close")
        spec = spec_for(name)
        arr, dtype_name = to_storage(data)
        if spec.kind == "int" and dtype_name != "int64":
            arr, dtype_name = arr.astype(np.int64), "int64"
        elif spec.kind == "bool" and dtype_name != "bool":
            arr, dtype_name = arr.astype(bool), "bool"
        elif spec.kind == "float" and dtype_name not in ("bfloat16", "float16", "float32", "float64"):
            raise TraceError(f"{name}: float tensor expected, got {dtype_name}")
        if arr.ndim == len(spec.dims):  # a single row
            arr = arr[None]
        if arr.ndim != len(spec.dims) + 1:
            raise TraceError(f"{name}: expected [row, {', '.join(spec.dims) or '-'}], got shape {arr.shape}")
        n = arr.shape[0]
        layout = (dtype_name, tuple(arr.shape[1:]))
        known = self._layout.setdefault(name, layout)
        if known != layout:
            raise TraceError(f"{name}: rows of {layout} after rows of {known}; a tensor keeps one dtype and shape")
        keys = {k: np.broadcast_to(np.asarray(v, dtype=kd), (n,)).copy()
                for (k, kd), v in zip(KEY_COLUMNS, (seq, pos, depth, iter), strict=True)}
        row0 = self._rows[name]
        arr = np.ascontiguousarray(arr)
        if name not in self._spills:
            self._spills[name] = (0, SpillWriter(_join(self.path, spill_key(name, 0))))
        self._spills[name][1].write(arr)  # before its rec entry: a rec that decodes has its bytes
        self._journal.write({"t": "rec", "name": name, "row0": row0, "n": n, "dtype": dtype_name,
                             "shape": list(arr.shape), **{k: v.tobytes() for k, v in keys.items()}})
        self._rows[name] = row0 + n
        self.records += 1
        pending = self._pending.setdefault(name, _Pending())
        pending.add(arr, keys)
        chunk_rows = self._chunk_rows(name)
        # Commit several whole chunks at once so zarr encodes them in parallel (and the rows
        # rewritten to the next spill file are at most 1/COMMIT_CHUNKS of those committed); the
        # spill file already holds every row, so buffering longer costs memory, not safety.
        if pending.rows >= COMMIT_CHUNKS * chunk_rows:
            self._commit(name, (pending.rows // chunk_rows) * chunk_rows)

    def _chunk_rows(self, name: str) -> int:
        dtype_name, shape = self._layout[name]
        row_bytes = STORAGE_DTYPES[dtype_name].itemsize * int(np.prod(shape, dtype=np.int64))
        return int(min(max(self.chunk_bytes // max(row_bytes, 1), 16), 1 << 16))

    def _commit(self, name: str, n: int) -> None:
        data, keys = self._pending[name].take(n)
        start = self._committed[name]
        stop = start + n
        if start == 0:
            self._arrays[name] = self._create_arrays(name)
        arrays = self._arrays[name]
        # One trip to zarr's event loop for the data and the four key arrays (grown, then written),
        # not ten: under load each trip costs more than encoding a small key chunk.
        zarr_sync(_grow_and_write([(arrays[key].async_array, values)
                                             for key, values in (("data", data), *keys.items())], start, stop))
        self._committed[name] = stop
        # Order for crash safety: zarr rows, then the next spill file with the rows still
        # uncommitted, then the commit entry naming it (the switch), then the old file goes.
        gen, old = self._spills[name]
        new = SpillWriter(_join(self.path, spill_key(name, gen + 1)))
        for part in self._pending[name].data:
            new.write(np.ascontiguousarray(part))
        self._journal.write({"t": "commit", "name": name, "rows": stop, "spill": gen + 1})
        old.close_and_remove()
        self._spills[name] = (gen + 1, new)

    def _create_arrays(self, name: str) -> dict:
        grp = self._group.require_group(f"tensors/{name}")
        spec = spec_for(name)
        dtype_name, shape = self._layout[name]
        chunk_rows = self._chunk_rows(name)
        dtype = STORAGE_DTYPES[dtype_name]
        arrays = {"data": grp.create_array(
            "data", shape=(0, *shape), chunks=(chunk_rows, *shape), dtype=dtype,
            compressors=_compressors(dtype), dimension_names=("row", *spec.dims),
            attributes={"specdiff_dtype": dtype_name, "specdiff_tensor": name}, config=_ARRAY_CONFIG)}
        for k, kd in KEY_COLUMNS:
            # Keys are tiny: 16 data chunks per key chunk keeps key reads few (a commit rewrites <= 1).
            arrays[k] = grp.create_array(k, shape=(0,), chunks=(min(chunk_rows * KEY_CHUNK_FACTOR, MAX_KEY_CHUNK_ROWS),), dtype=kd,
                                         compressors=_compressors(np.dtype(kd)),
                                         dimension_names=("row",), config=_ARRAY_CONFIG)
        return arrays

    def close(self) -> None:
        """Commit every buffered row, write the sequence table, and mark the trace closed."""
        if self.closed:
            return
        for name, pending in self._pending.items():
            if pending.rows:
                self._commit(name, pending.rows)
        seqs = [self._sequences[i] for i in sorted(self._sequences)]
        if seqs:
            grp = self._group.require_group("sequences")
            columns = {"id": [s.id for s in seqs], "tokens": np.concatenate([s.tokens for s in seqs]),
                       "offsets": np.cumsum([0] + [len(s.tokens) for s in seqs]),
                       "prompt_len": [s.prompt_len for s in seqs]}
            dims = {"tokens": "token", "offsets": "seq_edge"}
            for key, kd in SEQUENCE_ARRAYS:
                values = np.asarray(columns[key], dtype=kd)
                grp.create_array(key, data=values, dimension_names=(dims.get(key, "seq"),), overwrite=True,
                                 compressors=_compressors(values.dtype), config=_ARRAY_CONFIG)
        self._group.attrs.update({"contract": self._contract, "closed": True, "records": self.records,
                                  "sequence_rids": [s.rid for s in seqs]})
        self._journal.write({"t": "close", "records": self.records})
        self._journal.close()
        for _, spill in self._spills.values():  # empty: every row is committed
            spill.close_and_remove()
        remove_spill_dir(self.path, _join)
        compact_journal(self._journal.url)
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass(frozen=True)
class TensorInfo:
    """Shape facts of one tensor in a trace: ``rows`` x ``shape`` of ``dtype`` (storage name)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    rows: int
    dims: tuple[str, ...]


class Trace:
    """A trace opened for reading (see ``open_trace``).

    Attributes:
        path, side, format, contract, sequences (list[Sequence]), records (appends recorded),
        closed (the writer closed cleanly), cut_tail_bytes (bytes of a cut last journal entry).

    Damage (``tracer.damage``) never stops reading: rows in a damaged chunk read as NaN (floats),
    -1 (ints, row keys) or False, ``unreadable`` says which rows those are, and ``damage`` lists
    what was found so far (at open: journal, metadata, missing chunk files; on read: chunks that
    fail to decode). ``verify`` reads every chunk.
    """

    def __init__(self, path: str, store, contents: _Contents, damage: list[Damage]):
        self.path = path
        self._store = store
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
        for name, rows in self._committed.items():
            if rows:
                self._readers[name] = self._open_arrays(name, rows)
        self._sequence_readers: list[ArrayReader] = []

    def _open_arrays(self, name: str, rows: int) -> dict[str, ArrayReader]:
        dtype_name, shape = self._layout[name]
        out = {"data": ArrayReader(trace=self.path, store=self._store, key=f"tensors/{name}/data", tensor=name,
                                   column="data", rows=rows, dtype=STORAGE_DTYPES[dtype_name], shape=shape,
                                   fill=damaged_fill(dtype_name))}
        for k, kd in KEY_COLUMNS:
            out[k] = ArrayReader(trace=self.path, store=self._store, key=f"tensors/{name}/{k}", tensor=name,
                                 column=k, rows=rows, dtype=np.dtype(kd), shape=(), fill=-1)
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
                reader = ArrayReader(trace=self.path, store=self._store, key=f"sequences/{k}", tensor=None,
                                     column="sequences", rows=None, dtype=np.dtype(kd), shape=(), fill=-1)
                reader.verify()
                self._sequence_readers.append(reader)
        return self.damage

    # ---- tensor access ----------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Tensor names in dataflow order (schema.ordered)."""
        return ordered(self._layout)

    def info(self, name: str) -> TensorInfo:
        """Shape facts of ``name``. Raises KeyError if absent."""
        dtype, shape = self._layout[name]
        return TensorInfo(name, dtype, shape, self.rows(name), spec_for(name).dims)

    def rows(self, name: str) -> int:
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

    def _read(self, name: str, column: str, start: int, stop: int) -> np.ndarray:
        done = self._committed.get(name, 0)
        parts = []
        if start < done:
            parts.append(self._readers[name][column].read(start, min(stop, done)))
        if stop > done:
            data, keys = self._tail[name]
            src = data if column == "data" else keys[column]
            parts.append(src[max(start - done, 0):stop - done])
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
        if out is None:
            dtype, shape = self._layout[name]
            out = np.empty((0, *shape), STORAGE_DTYPES[dtype])
        return out

    def take_float(self, name: str, rows: np.ndarray) -> np.ndarray:
        """``take`` with bf16 upcast exactly and every float as float32 (for comparisons)."""
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

    def read_storage(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of ``name`` in storage dtype (bf16 as raw uint16 bits; no upcast copy)."""
        stop = self.rows(name) if stop is None else stop
        return self._read(name, "data", start, stop)

    def read_torch(self, name: str, start: int = 0, stop: int | None = None):
        """Rows [start, stop) as a torch tensor in the recorded dtype (bf16 restored bit for bit)."""
        stop = self.rows(name) if stop is None else stop
        return to_torch(self._read(name, "data", start, stop), self._layout[name][0])

    def sequence(self, seq_id: int) -> Sequence:
        for s in self.sequences:
            if s.id == seq_id:
                return s
        raise KeyError(seq_id)


def damaged_fill(dtype_name: str):
    """What a row of a damaged chunk reads as, in storage dtype: NaN floats (bf16 NaN bits 0x7FC0),
    -1 ints, False flags, so a damaged row can never pass for a recorded value of 0."""
    if dtype_name == "bfloat16":
        return 0x7FC0
    if dtype_name.startswith("float"):
        return np.nan
    return False if dtype_name == "bool" else -1


@dataclass
class _Contents:
    """What a trace holds, read from its journal or (damaged journal, closed trace) its zarr metadata."""

    format: int
    side: str
    contract: dict
    sequences: list[Sequence]
    records: int
    closed: bool
    committed: dict[str, int]
    layout: dict[str, tuple[str, tuple[int, ...]]]
    tail: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]
    cut_tail_bytes: int = 0


def _from_journal(path: str, entries: list[dict], *, cut_tail_bytes: int,
                  zarr_rows: dict[str, tuple[str, tuple[int, ...], int]] | None = None) -> _Contents:
    """Contents from journal entries. ``zarr_rows`` (name -> dtype, shape, rows in zarr) is given
    when the journal lost entries: rows zarr holds count as committed even without their entry."""
    header = entries[0]
    contract: dict = {}
    seqs: dict[int, Sequence] = {}
    committed: dict[str, int] = {}
    spills: dict[str, tuple[int, int]] = {}  # name -> (spill generation, its first row)
    recs: dict[str, list[dict]] = defaultdict(list)
    closed, records = False, 0
    for e in entries[1:]:
        t = e.get("t")
        if t == "rec":
            recs[e["name"]].append(e)
            records += 1
        elif t == "commit":
            committed[e["name"]] = e["rows"]
            if "spill" in e:
                spills[e["name"]] = (e["spill"], e["rows"])
        elif t == "seq":
            seqs[e["id"]] = Sequence(e["id"], np.frombuffer(e["tokens"], np.int32), e["prompt_len"], e["rid"])
        elif t == "contract":
            contract = validate_contract(e["contract"], where=path)
        elif t == "close":
            closed = True
    layout: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (dtype, shape, rows) in (zarr_rows or {}).items():
        layout[name] = (dtype, shape)
        committed[name] = max(committed.get(name, 0), rows)
    tail: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    spilled = header.get("payload") == SPILL_PAYLOAD
    for name, entries_of in recs.items():
        first = entries_of[0]
        layout.setdefault(name, (first["dtype"], tuple(first["shape"][1:])))
        done = committed.get(name, 0)
        # A commit can end inside a record (commits are whole chunks): keep that record's later rows.
        pending = [e for e in entries_of if e["row0"] + e["n"] > done]
        if not pending:
            continue
        if any(c not in e for e in pending for c, _ in KEY_COLUMNS) or (not spilled and any("data" not in e for e in pending)):
            raise TraceError(f"{path}: rows of {name} from {done} on are neither committed nor in the "
                             "journal; the store is damaged (copy it again)")
        dt = STORAGE_DTYPES[first["dtype"]]
        skip = [max(done - e["row0"], 0) for e in pending]
        keys = {c: np.concatenate([np.frombuffer(e[c], kd)[k:] for e, k in zip(pending, skip, strict=True)])
                for c, kd in KEY_COLUMNS}
        if spilled:
            gen, base = spills.get(name, (0, 0))
            data = _spilled_rows(path, name, gen=gen, base=base, start=done, stop=pending[-1]["row0"] + pending[-1]["n"],
                                 dtype=dt, shape=layout[name][1], lost_ok=zarr_rows is not None)
            keys = {c: v[:len(data)] for c, v in keys.items()}
        else:
            data = np.concatenate([np.frombuffer(e["data"], dt).reshape(e["shape"])[k:] for e, k in zip(pending, skip, strict=True)])
        tail[name] = (data, keys)
    return _Contents(header["format"], header["side"], contract, [seqs[i] for i in sorted(seqs)], records,
                     closed, committed, layout, tail, cut_tail_bytes)


def _spilled_rows(path: str, name: str, *, gen: int, base: int, start: int, stop: int, dtype: np.dtype,
                  shape: tuple[int, ...], lost_ok: bool) -> np.ndarray:
    """Rows [start, stop) of ``name`` from its spill file of generation ``gen`` (whose first row is
    ``base``): [rows, *shape] of ``dtype``; fewer rows only with ``lost_ok`` (the journal is
    damaged and already reported as losing uncommitted records).

    Raises:
        TraceError: the file is missing or shorter than the journal says (the store was damaged
            after the writer wrote it: a spill write always precedes its ``rec`` entry).
    """
    key = spill_key(name, gen)
    elems = int(np.prod(shape, dtype=np.int64))
    row_bytes = dtype.itemsize * elems
    raw = read_spill(_join(path, key))
    held = stop if not row_bytes else base + len(raw or b"") // row_bytes
    if held < stop and not lost_ok:
        what = "is missing" if raw is None else f"holds {max(held - start, 0)} of them"
        raise TraceError(f"{path}: rows {start}-{stop - 1} of {name} were journalled but not committed, and {key} "
                         f"{what}; the store is damaged (copy it again from where it was recorded)")
    stop = min(stop, held)
    if stop <= start:
        return np.empty((0, *shape), dtype)
    return np.frombuffer(raw or b"", dtype, count=(stop - base) * elems).reshape(stop - base, *shape)[start - base:]


def _zarr_tensors(path: str, store) -> tuple[dict[str, tuple[str, tuple[int, ...], int]], list[Damage]]:
    """name -> (dtype, feature shape, rows) of every tensor whose ``data`` array opens; damage for the rest."""
    fs, root = fsspec.core.url_to_fs(_join(path, "tensors"))
    try:
        names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root, detail=True)
                       if e["type"] == "directory")
    except (FileNotFoundError, NotADirectoryError):
        names = []
    out, damage = {}, []
    for name in names:
        key = f"tensors/{name}/data"
        try:
            arr = zarr.open_array(store=store, path=key, mode="r")
            out[name] = (str(arr.attrs["specdiff_dtype"]), tuple(arr.shape[1:]), arr.shape[0])
        except Exception as exc:  # zarr raises many types for bad metadata
            problem, action = metadata_problem(path, f"{key}/zarr.json", exc)
            damage.append(Damage(path, f"{key}/zarr.json", problem, f"tensor {name} cannot be read", action, name))
    return out, damage


def _from_zarr(path: str, store, attrs: dict) -> tuple[_Contents, list[Damage]]:
    """Contents of a closed trace from its zarr metadata alone (its journal is damaged)."""
    tensors, damage = _zarr_tensors(path, store)
    rids = attrs.get("sequence_rids")
    cols = {k: np.zeros(0, kd) for k, kd in SEQUENCE_ARRAYS}
    cols["offsets"] = np.zeros(1, np.int64)
    if rids is None or len(rids):
        try:
            cols = {k: zarr.open_array(store=store, path=f"sequences/{k}", mode="r")[:] for k, _ in SEQUENCE_ARRAYS}
        except Exception as exc:  # zarr raises many types for bad bytes
            why = ("it has no sequences/id array (written before specdiff stored sequence ids in zarr)"
                   if isinstance(exc, (FileNotFoundError, zarr.errors.ArrayNotFoundError)) else
                   f"its sequence table in zarr cannot be read either ({type(exc).__name__})")
            raise TraceError(f"{path}: record journal is damaged and {why}; the trace cannot be opened "
                             "(copy it again from where it was recorded)") from None
    rids = rids or [None] * len(cols["prompt_len"])
    off = cols["offsets"]
    seqs = [Sequence(int(cols["id"][i]), cols["tokens"][off[i]:off[i + 1]], int(cols["prompt_len"][i]), rids[i])
            for i in range(len(cols["prompt_len"]))]
    meta = attrs["specdiff"]
    contents = _Contents(meta["format"], meta["side"], validate_contract(attrs.get("contract", {}), where=path),
                         seqs, int(attrs.get("records", 0)), True,
                         {n: r for n, (_, _, r) in tensors.items()},
                         {n: (d, s) for n, (d, s, _) in tensors.items()}, {})
    return contents, damage


def _store(path: str):
    if "://" in path:
        return zarr.storage.FsspecStore.from_url(path, read_only=True)
    return zarr.storage.LocalStore(path, read_only=True)


def _is_rank_parent(path: str) -> bool:
    """``path`` holds no trace of its own but per-rank traces (tracer.ranks)."""
    try:
        if read_bytes(path, "zarr.json") is not None:
            return False
    except OSError:
        return False
    from specdiff.tracer.ranks import rank_stores

    return bool(rank_stores(path))


def open_trace(path: str) -> Trace:
    """Open a trace for reading (local path or fsspec URL); a directory of per-rank traces
    (``dp<r>``, written by a data-parallel server) opens as one ``tracer.ranks.RankedTrace``.

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
        from specdiff.tracer.ranks import RankedTrace, rank_stores

        return RankedTrace(path, [(label, open_trace(sub)) for label, sub in rank_stores(path)])
    store = _store(path)
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
        contents, more = _from_zarr(path, store, attrs)
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
            zarr_rows, more = _zarr_tensors(path, store)
            damage.append(Damage(path, JOURNAL_NAME, scan.problem, "the writer never closed this trace, so records "
                                 "journaled after that byte and not yet in zarr are lost", "re-record the trace"))
            damage += more
        contents = _from_journal(path, scan.entries, cut_tail_bytes=scan.cut_tail_bytes, zarr_rows=zarr_rows)
    return Trace(path, store, contents, damage)
