"""Write a trace: ``TraceWriter`` (journal first, chunks to zarr as they fill, sequences at close)."""

from __future__ import annotations

import os
import time
from collections import defaultdict

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from specdiff.tracer.arrays import STORAGE_DTYPES, to_storage
from specdiff.tracer.chunks import join as _join
from specdiff.tracer.contract import validate_contract
from specdiff.tracer.errors import TraceError
from specdiff.tracer.journal import (
    JOURNAL_NAME,
    SPILL_PAYLOAD,
    JournalWriter,
    SpillWriter,
    compact_journal,
    remove_spill_dir,
    spill_key,
)
from specdiff.tracer.schema import spec_for
from specdiff.tracer.store import layout
from specdiff.tracer.store.commit import Staging, grow_and_write
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
    local_path,
)


class _Pending:
    """Rows appended to one tensor but not yet committed to zarr, in one buffer reused across commits.

    Appends copy into the buffer and a commit hands zarr views of it: on this VM a copy into
    memory already touched runs at ~7 GB/s but one into a fresh allocation at ~0.5 GB/s (page
    faults), so a new array per commit (``np.concatenate``) cost more than the rows' copy itself.

    Args:
        dtype: storage dtype; ``shape``: feature shape of one row; ``capacity``: rows to reserve
            (grown by doubling when an append does not fit).
    """

    def __init__(self, dtype: np.dtype, *, shape: tuple[int, ...], capacity: int):
        self.data = np.empty((capacity, *shape), dtype)
        self.keys = {k: np.empty(capacity, kd) for k, kd in KEY_COLUMNS}
        self.rows = 0

    def add(self, data: np.ndarray, keys: dict[str, np.ndarray]) -> None:
        need = self.rows + data.shape[0]
        if need > self.data.shape[0]:
            cap = max(need, 2 * self.data.shape[0])
            grown = np.empty((cap, *self.data.shape[1:]), self.data.dtype)
            grown[:self.rows] = self.data[:self.rows]
            self.data = grown
            self.keys = {k: np.concatenate([v[:self.rows], np.empty(cap - self.rows, v.dtype)])
                         for k, v in self.keys.items()}
        self.data[self.rows:need] = data
        for k, v in keys.items():
            self.keys[k][self.rows:need] = v
        self.rows = need

    def head(self, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Views of the first n rows (valid until the next ``add`` or ``drop``)."""
        return self.data[:n], {k: v[:n] for k, v in self.keys.items()}

    def tail(self, n: int) -> np.ndarray:
        """View of the rows after the first n."""
        return self.data[n:self.rows]

    def drop(self, n: int) -> None:
        """Forget the first n rows; the rest move to the front."""
        rest = self.rows - n
        if rest:
            self.data[:rest] = self.data[n:self.rows]
            for v in self.keys.values():
                v[:rest] = v[n:self.rows]
        self.rows = rest


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
        self._staging = Staging()
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
        chunk_rows = self._chunk_rows(name)
        if name not in self._pending:
            self._pending[name] = _Pending(STORAGE_DTYPES[dtype_name], shape=layout[1],
                                          capacity=(COMMIT_CHUNKS + 1) * chunk_rows)
        pending = self._pending[name]
        pending.add(arr, keys)
        # Commit COMMIT_CHUNKS whole chunks (or a multiple) at once: zarr writes them in parallel, the
        # rows rewritten to the next spill file are few (appends smaller than a chunk leave less than
        # one), and each commit fills whole key chunks (layout.KEY_CHUNK_FACTOR). The spill file
        # already holds every row, so buffering longer costs memory, not safety.
        unit = COMMIT_CHUNKS * chunk_rows
        if pending.rows >= unit:
            self._commit(name, (pending.rows // unit) * unit)

    def _chunk_rows(self, name: str) -> int:
        dtype_name, shape = self._layout[name]
        row_bytes = STORAGE_DTYPES[dtype_name].itemsize * int(np.prod(shape, dtype=np.int64))
        return int(min(max(self.chunk_bytes // max(row_bytes, 1), 16), 1 << 16))

    def _commit(self, name: str, n: int) -> None:
        pending = self._pending[name]
        data, keys = pending.head(n)
        start = self._committed[name]
        stop = start + n
        if start == 0:
            self._arrays[name] = self._create_arrays(name)
        arrays = self._arrays[name]
        # One trip to zarr's event loop for the data and the four key arrays (grown, then written),
        # not ten: under load each trip costs more than encoding a small key chunk.
        zarr_sync(grow_and_write([(arrays[key].async_array, values) for key, values in (("data", data), *keys.items())],
                                 start=start, staging=self._staging))
        self._committed[name] = stop
        # Order for crash safety: zarr rows, then the next spill file with the rows still
        # uncommitted, then the commit entry naming it (the switch), then the old file goes.
        gen, old = self._spills[name]
        new = SpillWriter(_join(self.path, spill_key(name, gen + 1)))
        if pending.rows > n:
            new.write(np.ascontiguousarray(pending.tail(n)))
        self._journal.write({"t": "commit", "name": name, "rows": stop, "spill": gen + 1})
        old.close_and_remove()
        self._spills[name] = (gen + 1, new)
        pending.drop(n)

    def _create_arrays(self, name: str) -> dict:
        grp = self._group.require_group(f"tensors/{name}")
        spec = spec_for(name)
        dtype_name, shape = self._layout[name]
        chunk_rows = self._chunk_rows(name)
        dtype = STORAGE_DTYPES[dtype_name]
        arrays = {"data": grp.create_array(
            "data", shape=(0, *shape), chunks=(chunk_rows, *shape), dtype=dtype,
            compressors=layout.data_codecs(dtype_name), dimension_names=("row", *spec.dims),
            attributes={"specdiff_dtype": dtype_name, "specdiff_tensor": name}, config=ARRAY_CONFIG)}
        for k, kd in KEY_COLUMNS:
            # Keys are tiny: one key chunk per commit's data chunks keeps key reads few.
            arrays[k] = grp.create_array(k, shape=(0,), chunks=(min(chunk_rows * KEY_CHUNK_FACTOR, MAX_KEY_CHUNK_ROWS),), dtype=kd,
                                         compressors=layout.compressors(np.dtype(kd)),
                                         dimension_names=("row",), config=ARRAY_CONFIG)
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
                                 compressors=layout.compressors(values.dtype), config=ARRAY_CONFIG)
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


