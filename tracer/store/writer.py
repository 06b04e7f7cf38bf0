"""Write a trace: ``TraceWriter`` (journal first, chunks to zarr as they fill, sequences at close)."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from specdiff.tracer.contract import validate_contract
from specdiff.tracer.errors import TraceError
from specdiff.tracer.schema import spec_for
from specdiff.tracer.store import layout
from specdiff.tracer.store.arrays import STORAGE_DTYPES, ZARR_DTYPES, as_stored, to_storage
from specdiff.tracer.store.chunks import chunk_key, stored_raw
from specdiff.tracer.store.chunks import join as _join
from specdiff.tracer.store.commit import grow_and_write
from specdiff.tracer.store.journal import (
    JOURNAL_NAME,
    SPILL_PAYLOAD,
    JournalWriter,
    SpillWriter,
    compact_journal,
    read_spill,
    remove_spill_dir,
    spill_key,
)
from specdiff.tracer.store.layout import (
    ARRAY_CONFIG,
    CHUNK_BYTES,
    COMMIT_CHUNKS,
    FLOAT_DTYPES,
    FORMAT_VERSION,
    KEY_CHUNK_FACTOR,
    KEY_COLUMNS,
    MAX_KEY_CHUNK_ROWS,
    SEQUENCE_ARRAYS,
    SIDES,
    Sequence,
    consolidate,
    local_path,
)


class _Pending:
    """Rows appended to one tensor but not yet committed to zarr, in buffers reused across commits.

    Appends copy into the buffers and a commit hands zarr views of them: on a VM a copy into
    memory already touched runs at ~7 GB/s but one into a fresh allocation at ~0.5 GB/s (page
    faults), so a new array per commit (``np.concatenate``) cost more than the rows' copy itself.

    Args:
        dtype: storage dtype of the rows, or None to keep only their keys (a raw float tensor,
            whose rows go from its spill files straight to zarr chunks); ``shape``: feature shape
            of one row; ``capacity``: rows to reserve (grown by doubling when an append does not fit).
    """

    def __init__(self, dtype: np.dtype | None, *, shape: tuple[int, ...], capacity: int):
        self.data = None if dtype is None else np.empty((capacity, *shape), dtype)
        self.keys = {k: np.empty(capacity, kd) for k, kd in KEY_COLUMNS}
        self.rows = 0

    def add(self, data: np.ndarray | None, keys: dict[str, np.ndarray]) -> None:
        need = self.rows + len(keys["seq"])
        cap = len(self.keys["seq"])
        if need > cap:
            cap = max(need, 2 * cap)
            if self.data is not None:
                grown = np.empty((cap, *self.data.shape[1:]), self.data.dtype)
                grown[:self.rows] = self.data[:self.rows]
                self.data = grown
            self.keys = {k: np.concatenate([v[:self.rows], np.empty(cap - self.rows, v.dtype)])
                         for k, v in self.keys.items()}
        if self.data is not None:
            self.data[self.rows:need] = data
        for k, v in keys.items():
            self.keys[k][self.rows:need] = v
        self.rows = need

    def head(self, n: int) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """Views of the first n rows (valid until the next ``add`` or ``drop``); data None when not kept."""
        return None if self.data is None else self.data[:n], {k: v[:n] for k, v in self.keys.items()}

    def drop(self, n: int) -> None:
        """Forget the first n rows; the rest move to the front."""
        rest = self.rows - n
        if rest:
            for v in ([] if self.data is None else [self.data]) + list(self.keys.values()):
                v[:rest] = v[n:self.rows]
        self.rows = rest


def _key_column(v, dtype, n: int) -> np.ndarray:
    """Row key ``v`` (a scalar, or [n] / [1] values) as a ``dtype`` array [n]; it may be ``v``
    itself: ``append`` journals its bytes and ``_Pending.add`` copies it at once, keeping no view."""
    a = np.asarray(v, dtype=dtype)
    if a.shape == (n,):
        return a
    out = np.empty(n, dtype)
    out[:] = a  # a scalar or [1]; any other shape raises (as broadcasting would)
    return out


class TraceWriter:
    """Write a trace. Not thread-safe: one thread appends (the SGLang plugin's writer thread).

    Args:
        path: local directory or fsspec URL (``memory://``, ``s3://``...) of the new trace.
        side: ``"serve"`` or ``"train"``.
        contract: contract facts (tracer.contract); more can be added with ``set_contract``.
        chunk_bytes: target bytes of one chunk's rows, before any compression (a chunk holds
            at least 16 rows and at most 65536).
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
        self._spills: dict[str, tuple[int, SpillWriter]] = {}  # name -> (generation = chunk, its open file)
        self._full_spills: dict[str, list[tuple[int, SpillWriter]]] = defaultdict(list)  # blosc: until committed
        self._raw: dict[str, bool] = {}  # name -> data chunks stored raw (moved in from spill files)
        self._chunk_rows_of: dict[str, int] = {}
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdiff-commit")
        self._in_flight: tuple | None = None  # (name, rows, chunk rows, future) of the commit zarr is writing
        self._failed: TraceError | None = None  # a commit zarr could not write: the writer stops
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

    def journal_progress(self, caught_up_at: float | None) -> None:
        """Journal how far a serving writer has got: ``caught_up_at`` (Unix seconds) is a moment it
        had written every capture the server handed it before then; None: it has written all it
        will (the server is gone). A reader of the unclosed trace sees the latest as the contract
        fact ``recorder_caught_up_at`` (``recover.JournalReplay``); a closed trace does not list
        it. Small entries, not ``set_contract`` (which journals the whole contract)."""
        self._journal.write({"t": "progress", "caught_up_at": caught_up_at})

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
        if self._failed:
            raise self._failed
        self._settle(block=False)
        spec = spec_for(name)
        arr, dtype_name = to_storage(data)
        if spec.kind == "int" and dtype_name != "int64":
            arr, dtype_name = arr.astype(np.int64), "int64"
        elif spec.kind == "bool" and dtype_name != "bool":
            arr, dtype_name = arr.astype(bool), "bool"
        elif spec.kind == "float" and dtype_name not in FLOAT_DTYPES:
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
        keys = {k: _key_column(v, kd, n) for (k, kd), v in zip(KEY_COLUMNS, (seq, pos, depth, iter), strict=True)}
        row0 = self._rows[name]
        arr = np.ascontiguousarray(arr)
        if name not in self._arrays:
            self._arrays[name] = self._create_arrays(name)
            self._raw[name] = stored_raw(self._arrays[name]["data"])
        chunk_rows = self._chunk_rows(name)
        self._spill(name, arr, row0, chunk_rows)  # before its rec entry: a rec that decodes has its bytes
        self._journal.write({"t": "rec", "name": name, "row0": row0, "n": n, "dtype": dtype_name,
                             "shape": list(arr.shape), "chunk_rows": chunk_rows,
                             **{k: v.tobytes() for k, v in keys.items()}})
        self._rows[name] = row0 + n
        self.records += 1
        if name not in self._pending:
            self._pending[name] = _Pending(None if self._raw[name] else STORAGE_DTYPES[dtype_name], shape=layout[1],
                                          capacity=(COMMIT_CHUNKS + 1) * chunk_rows)
        self._pending[name].add(None if self._raw[name] else arr, keys)
        # Commit COMMIT_CHUNKS whole chunks (or a multiple) at once: one trip to zarr's event loop
        # grows the arrays and fills whole key chunks (layout.KEY_CHUNK_FACTOR). The spill files
        # (or, raw, the chunks moved in from them) already hold every row, so committing later
        # costs memory (keys; blosc rows), not safety.
        unit = COMMIT_CHUNKS * chunk_rows
        full, done = (row0 + n) // chunk_rows * chunk_rows, self._committed[name]
        if full - done >= unit:
            self._commit(name, done + (full - done) // unit * unit)

    def _spill(self, name: str, arr: np.ndarray, row0: int, chunk_rows: int) -> None:
        """Write rows [row0, row0 + len(arr)) to the spill files of their chunks (journal.py): a
        chunk's file, once full, becomes its zarr chunk (raw arrays: crc32c appended, file moved,
        so the rows are written once) or waits for the commit that writes its rows (blosc)."""
        pos, n = 0, arr.shape[0]
        while pos < n:
            row = row0 + pos
            gen = row // chunk_rows
            take = min(n - pos, (gen + 1) * chunk_rows - row)
            if name not in self._spills:
                self._spills[name] = (gen, SpillWriter(_join(self.path, spill_key(name, gen)), checksum=self._raw[name]))
            spill = self._spills[name][1]
            spill.write(arr[pos:pos + take])
            if (row + take) % chunk_rows == 0:  # chunk gen is full
                del self._spills[name]
                if self._raw[name]:
                    spill.finish_as_chunk(_join(self.path, chunk_key(self._arrays[name]["data"], f"tensors/{name}/data", gen)))
                else:
                    spill.close()
                    self._full_spills[name].append((gen, spill))
            pos += take

    def _chunk_rows(self, name: str) -> int:
        if name in self._chunk_rows_of:
            return self._chunk_rows_of[name]
        dtype_name, shape = self._layout[name]
        row_bytes = STORAGE_DTYPES[dtype_name].itemsize * int(np.prod(shape, dtype=np.int64))
        rows = self._chunk_rows_of[name] = int(min(max(self.chunk_bytes // max(row_bytes, 1), 16), 1 << 16))
        return rows

    def _commit(self, name: str, upto: int) -> None:
        """Make rows [committed, upto) durable in zarr: grow the arrays, write the key columns and
        the rows not yet in chunk files (blosc rows; a raw tensor's partial last chunk, at close).

        The zarr work runs on a thread of this writer while appends go on (one commit in flight at
        a time; its values are copies); the commit entry is journalled, and the spill files it
        made redundant removed, once zarr holds the rows (``_settle``).
        """
        self._settle(block=True)
        pending = self._pending[name]
        start, chunk_rows = self._committed[name], self._chunk_rows(name)
        data, keys = pending.head(upto - start)
        arrays = self._arrays[name]
        writes = [(arrays[k].async_array, start, v.copy()) for k, v in keys.items()]
        if data is not None:
            writes.append((arrays["data"].async_array, start, as_stored(data.copy(), self._layout[name][0])))
        elif upto % chunk_rows:  # raw, at close: the last chunk's rows are only in its spill file
            edge = upto // chunk_rows * chunk_rows
            gen, spill = self._spills[name]
            dtype_name, shape = self._layout[name]
            tail = np.frombuffer(read_spill(spill.url) or b"", STORAGE_DTYPES[dtype_name]).reshape(-1, *shape)
            if gen != edge // chunk_rows or len(tail) != upto - edge:
                raise TraceError(f"{spill.url}: holds {len(tail)} rows of chunk {gen} of {name}, "
                                 f"expected {upto - edge}; the trace's directory was changed while it was written")
            writes.append((arrays["data"].async_array, edge, as_stored(tail, dtype_name)))
        # One trip to zarr's event loop for the grows and the writes: under load each trip costs
        # more than encoding a small key chunk.
        work = grow_and_write([a.async_array for a in arrays.values()], rows=upto, writes=writes)
        self._in_flight = (name, upto, chunk_rows, self._committer.submit(zarr_sync, work))
        self._committed[name] = upto
        pending.drop(upto - start)

    def _settle(self, *, block: bool) -> None:
        """Finish the commit in flight, if any (and, unless ``block``, only if zarr is done with
        it): journal its commit entry, then remove the spill files whose rows it committed.

        Raises:
            TraceError: zarr could not write the commit's rows (disk full, a store error). The
                writer then refuses every later call: its next commits would journal rows as
                durable that zarr does not hold. Every journalled row stays in its spill file or
                moved chunk, and the unclosed trace opens with all of them.
        """
        if self._in_flight is None or (not block and not self._in_flight[3].done()):
            return
        name, upto, chunk_rows, future = self._in_flight
        self._in_flight = None
        try:
            future.result()
        except Exception as exc:
            self._failed = TraceError(
                f"{self.path}: writing rows of {name} to zarr failed ({type(exc).__name__}: {exc}); the trace is "
                "left unclosed with every journalled row in its spill files, and opens as it is: free the disk "
                "(or fix the store) and record again to go on")
            raise self._failed from exc
        self._journal.write({"t": "commit", "name": name, "rows": upto, "spill": upto // chunk_rows})
        keep = []
        for gen, spill in self._full_spills.pop(name, []):
            if gen < upto // chunk_rows:
                spill.close_and_remove()
            else:
                keep.append((gen, spill))
        if keep:
            self._full_spills[name] = keep

    def _create_arrays(self, name: str) -> dict:
        grp = self._group.require_group(f"tensors/{name}")
        spec = spec_for(name)
        dtype_name, shape = self._layout[name]
        chunk_rows = self._chunk_rows(name)
        arrays = {"data": grp.create_array(
            "data", shape=(0, *shape), chunks=(chunk_rows, *shape), dtype=ZARR_DTYPES[dtype_name],
            compressors=layout.data_codecs(dtype_name), dimension_names=("row", *spec.dims),
            attributes={"specdiff_dtype": dtype_name, "specdiff_tensor": name}, config=ARRAY_CONFIG)}
        for k, kd in KEY_COLUMNS:
            # Keys are tiny: one key chunk per commit's data chunks keeps key reads few.
            arrays[k] = grp.create_array(k, shape=(0,), chunks=(min(chunk_rows * KEY_CHUNK_FACTOR, MAX_KEY_CHUNK_ROWS),), dtype=kd,
                                         compressors=layout.compressors(np.dtype(kd)),
                                         dimension_names=("row",), config=ARRAY_CONFIG)
        return arrays

    def flush(self) -> None:
        """Wait for the commit in flight and journal it: a reader opening the trace now finds every
        row committed so far in zarr (it reads the rest from the spill files either way)."""
        self._settle(block=True)

    def close(self) -> None:
        """Commit every buffered row, write the sequence table, and mark the trace closed."""
        if self.closed:
            return
        if self._failed:
            raise self._failed
        for name, pending in self._pending.items():
            if pending.rows:
                self._commit(name, self._rows[name])
        self._settle(block=True)
        self._committer.shutdown()
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
                                 compressors=layout.compressors(values.dtype), config=ARRAY_CONFIG)
        self._group.attrs.update({"contract": self._contract, "closed": True, "records": self.records,
                                  "sequence_rids": [s.rid for s in seqs]})
        consolidate(self._group.store)
        self._journal.write({"t": "close", "records": self.records})
        self._journal.close()
        for _, spill in self._spills.values():  # every row is committed: a last partial chunk's file
            spill.close_and_remove()
        remove_spill_dir(self.path, _join)
        compact_journal(self._journal.url)
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


