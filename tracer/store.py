"""The specdiff trace store: a zarr v3 group plus an append-only msgpack journal.

Layout (traces/FORMAT.md has the full description)::

    <trace>/zarr.json                      group; attrs: specdiff {format, side}, contract, closed
    <trace>/journal.msgpack                write-ahead record journal (tracer.journal)
    <trace>/tensors/<name>/data            [row, *dims]  the tensor rows, compressed chunks
    <trace>/tensors/<name>/{seq,pos,depth,iter}  [row] int32/int16 row keys (schema.py)
    <trace>/sequences/{tokens,offsets,prompt_len}  written at close, for plain-zarr readers

``TraceWriter.append`` writes the record to the journal at once (so a SIGKILL loses nothing
already appended) and buffers rows per tensor; whole chunks go to zarr as they fill and a
``commit`` entry marks them durable. ``open_trace`` reads committed rows from zarr and replays
the uncommitted tail from the journal.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import BloscCodec

from .arrays import STORAGE_DTYPES, from_storage, to_storage, to_torch
from .contract import validate_contract
from .errors import TraceError
from .journal import JOURNAL_NAME, JournalWriter, compact_journal, read_journal
from .schema import ordered, spec_for

FORMAT_VERSION = 1
KEY_COLUMNS = (("seq", "int32"), ("pos", "int32"), ("depth", "int16"), ("iter", "int32"))
CHUNK_BYTES = 4 << 20
KEY_CHUNK_FACTOR = 16
COMMIT_CHUNKS = 4
MAX_KEY_CHUNK_ROWS = 1 << 16  # edge chunks are stored whole: keep them small
SIDES = ("serve", "train")
# Chunks equal to the fill value must still be written: a missing chunk means a damaged store.
_ARRAY_CONFIG = {"write_empty_chunks": True}


def _join(path: str, *parts: str) -> str:
    if "://" in path:
        return "/".join([path.rstrip("/"), *parts])
    return os.path.join(path, *parts)


def _compressors(dtype: np.dtype):
    # lz4 at level 1: hidden states barely compress, so speed beats ratio (benchmarks/store_throughput.py).
    shuffle = "bitshuffle" if dtype.itemsize <= 2 else "shuffle"
    return [BloscCodec(cname="lz4", clevel=1, shuffle=shuffle, typesize=dtype.itemsize)]


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
        self.path = str(path)
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
        self._journal.write({"t": "header", "format": FORMAT_VERSION, "side": side, "created": time.time()})
        self._journal.write({"t": "contract", "contract": self._contract})
        self._pending: dict[str, _Pending] = {}
        self._layout: dict[str, tuple[str, tuple[int, ...]]] = {}  # name -> (dtype, feature shape)
        self._rows: dict[str, int] = defaultdict(int)
        self._committed: dict[str, int] = defaultdict(int)
        self._arrays: dict[str, dict] = {}
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
        self._journal.write({"t": "rec", "name": name, "row0": row0, "n": n, "dtype": dtype_name,
                             "shape": list(arr.shape), **{k: v.tobytes() for k, v in keys.items()},
                             "data": arr.tobytes()})
        self._rows[name] = row0 + n
        self.records += 1
        pending = self._pending.setdefault(name, _Pending())
        pending.add(arr, keys)
        chunk_rows = self._chunk_rows(name)
        # Commit several whole chunks at once so zarr encodes them in parallel; the journal
        # already holds every row, so buffering longer costs memory, not safety.
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
        for key, values in (("data", data), *keys.items()):
            target = arrays[key]
            target.resize((stop, *target.shape[1:]))
            target[start:stop] = values
        self._committed[name] = stop
        self._journal.write({"t": "commit", "name": name, "rows": stop})

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
            toks = np.concatenate([s.tokens for s in seqs]) if seqs else np.zeros(0, np.int32)
            offsets = np.cumsum([0] + [len(s.tokens) for s in seqs]).astype(np.int64)
            grp.create_array("tokens", data=toks, dimension_names=("token",), overwrite=True)
            grp.create_array("offsets", data=offsets, dimension_names=("seq_edge",), overwrite=True)
            grp.create_array("prompt_len", data=np.array([s.prompt_len for s in seqs], np.int32),
                             dimension_names=("seq",), overwrite=True)
        self._group.attrs.update({"contract": self._contract, "closed": True, "records": self.records,
                                  "sequence_rids": [s.rid for s in seqs]})
        self._journal.write({"t": "close", "records": self.records})
        self._journal.close()
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
    """

    def __init__(self, path: str, group, scan):
        self.path = path
        self._group = group
        header = scan.entries[0]
        self.format = header["format"]
        self.side = header["side"]
        self.cut_tail_bytes = scan.cut_tail_bytes
        self.contract: dict = {}
        seqs: dict[int, Sequence] = {}
        committed: dict[str, int] = {}
        recs: dict[str, list[dict]] = defaultdict(list)
        self.closed = False
        self.records = 0
        for e in scan.entries[1:]:
            t = e["t"]
            if t == "rec":
                recs[e["name"]].append(e)
                self.records += 1
            elif t == "commit":
                committed[e["name"]] = e["rows"]
            elif t == "seq":
                seqs[e["id"]] = Sequence(e["id"], np.frombuffer(e["tokens"], np.int32), e["prompt_len"], e["rid"])
            elif t == "contract":
                self.contract = validate_contract(e["contract"], where=path)
            elif t == "close":
                self.closed = True
        self.sequences = [seqs[i] for i in sorted(seqs)]
        self._committed = committed
        self._layout: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._tail: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        for name, entries in recs.items():
            first = entries[0]
            self._layout[name] = (first["dtype"], tuple(first["shape"][1:]))
            done = committed.get(name, 0)
            tail = [e for e in entries if e["row0"] >= done]
            if any("data" not in e for e in tail):
                raise TraceError(f"{path}: rows of {name} from {done} on are neither committed nor in the "
                                 "journal; the store is damaged")
            if tail:
                dt = STORAGE_DTYPES[first["dtype"]]
                data = np.concatenate([np.frombuffer(e["data"], dt).reshape(e["shape"]) for e in tail])
                keys = {k: np.concatenate([np.frombuffer(e[k], kd) for e in tail]) for k, kd in KEY_COLUMNS}
                self._tail[name] = (data, keys)
        self._check_chunks()

    def _check_chunks(self) -> None:
        for name, rows in self._committed.items():
            node = f"tensors/{name}"
            try:
                grp = self._group[node]
                arrays = [grp["data"]] + [grp[k] for k, _ in KEY_COLUMNS]
            except KeyError:
                raise TraceError(f"{self.path}: tensor {name} has {rows} committed rows but its zarr "
                                 f"arrays are missing; the store is incomplete") from None
            for arr in arrays:
                need = -(-rows // arr.chunks[0])
                have = arr.nchunks_initialized
                if arr.shape[0] < rows or have < need:
                    raise TraceError(f"{self.path}: {node}/{arr.basename} is missing {need - have} of {need} "
                                     f"chunks; the store is incomplete (copy it again)")

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
        if done:
            step = self._group[f"tensors/{name}/data"].chunks[0] * max(per_range, 1)
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
            parts.append(self._group[f"tensors/{name}/{column}"][start:min(stop, done)])
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
            arr = self._group[f"tensors/{name}/{column}"]
            part = arr.get_orthogonal_selection((rows[head],) + (slice(None),) * (arr.ndim - 1))
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

    def read_torch(self, name: str, start: int = 0, stop: int | None = None):
        """Rows [start, stop) as a torch tensor in the recorded dtype (bf16 restored bit for bit)."""
        stop = self.rows(name) if stop is None else stop
        return to_torch(self._read(name, "data", start, stop), self._layout[name][0])

    def sequence(self, seq_id: int) -> Sequence:
        for s in self.sequences:
            if s.id == seq_id:
                return s
        raise KeyError(seq_id)


def open_trace(path: str) -> Trace:
    """Open a trace for reading (local path or fsspec URL).

    Raises:
        TraceError: one line naming ``path`` and what was found: not a zarr store, a zarr store
            that is not a specdiff trace, another format version, a corrupt or truncated journal,
            missing chunks.
    """
    path = str(path)
    if "://" not in path and not os.path.exists(path):
        raise TraceError(f"{path}: no such trace (the path does not exist)")
    try:
        group = zarr.open_group(store=path, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError):
        raise TraceError(f"{path}: not a specdiff trace (no zarr group found)") from None
    except Exception as exc:  # zarr raises many types for foreign bytes
        raise TraceError(f"{path}: not a specdiff trace (zarr could not open it: {exc})") from None
    meta = group.attrs.get("specdiff")
    if not isinstance(meta, dict) or "format" not in meta:
        raise TraceError(f"{path}: is a zarr store but not a specdiff trace (no 'specdiff' attributes)")
    if meta["format"] != FORMAT_VERSION:
        raise TraceError(f"{path}: specdiff trace format {meta['format']} is not supported "
                         f"(this specdiff reads format {FORMAT_VERSION}); use a matching specdiff version")
    scan = read_journal(_join(path, JOURNAL_NAME), where=path)
    if scan.entries[0].get("format") != FORMAT_VERSION:
        raise TraceError(f"{path}: journal format {scan.entries[0].get('format')} does not match "
                         f"the store's format {FORMAT_VERSION}")
    return Trace(path, group, scan)
