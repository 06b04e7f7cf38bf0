"""Read one stored array of a trace without losing its readable rows to a damaged chunk.

zarr raises on the first chunk that fails to decode (losing the whole read) and returns the fill
value for a chunk file that is not there (hiding the loss). ``ArrayReader`` reads in bulk while
nothing is known to be wrong; when a read fails it reads chunk by chunk, records each failing
chunk as a ``Damage`` and fills its rows, so every other row still arrives. Missing chunk files are
found by listing the array's chunk keys against the rows the trace says were written, once, when
the array is first read or its damage is first asked for: opening a trace costs no listing, so a
diff's first answer does not wait for the chunk files of tensors it has not reached.
``ArrayReader.check_sizes`` (``specdiff info``) also finds chunk files cut short without reading a
value: a size per file, and the 16-byte header of a compressed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading

import fsspec
import google_crc32c
import numpy as np
import zarr
from zarr.api import asynchronous as zarr_async
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec
from zarr.core.buffer.cpu import NDBuffer
from zarr.core.sync import sync as zarr_sync

from specdiff.tracer.store.arrays import as_storage
from specdiff.tracer.store.damage import RECOPY, Damage, chunk_consequence, chunk_problem, truncation


def stored_raw(array) -> bool:
    """Whether chunks of the zarr array (``Array`` or ``AsyncArray``) are stored as their C-order
    bytes then their crc32c (uint32 little endian), which specdiff writes itself (a full spill file
    moved to its chunk key, journal.py): little-endian host, codecs exactly ``bytes`` (little) +
    ``crc32c``, as ``store.layout.data_codecs`` gives float tensors."""
    codecs = array.metadata.codecs
    return (sys.byteorder == "little" and len(codecs) == 2 and isinstance(codecs[0], BytesCodec)
            and (codecs[0].endian is None or codecs[0].endian.value == "little")
            and isinstance(codecs[1], Crc32cCodec))


def crc32c_holds(data, trailer: bytes) -> bool:
    """Whether ``trailer`` (4 bytes, uint32 little endian: zarr v3's crc32c codec) is the crc32c of
    ``data`` (bytes, or a read-only array: google_crc32c takes nothing writable)."""
    return len(trailer) == 4 and google_crc32c.value(data) == int.from_bytes(trailer, "little")


def chunk_key(array, path: str, index: int) -> str:
    """Store key of row-chunk ``index`` of the zarr ``array`` (``Array`` or ``AsyncArray``) kept at
    ``path`` in its store (e.g. ``tensors/<name>/data``), as zarr encodes it (v3 default: ``c/i/0``)."""
    return f"{path}/{array.metadata.encode_chunk_key((index,) + (0,) * (array.ndim - 1))}"


def _read_ahead(files) -> None:
    """Ask the kernel to read these whole files now (Linux ``POSIX_FADV_WILLNEED``), all at once:
    a cold read of one 4 MiB chunk file after another otherwise restarts readahead at each file
    and waits on small reads (2.5-4.9 s for 1 GiB here, where one big file read in 0.5 s)."""
    if hasattr(os, "posix_fadvise"):
        for fh in files:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)


def join(path: str, *parts: str) -> str:
    """``path/part/...`` for a local path or an fsspec URL."""
    if "://" in path:
        return "/".join([path.rstrip("/"), *parts])
    import os

    return os.path.join(path, *parts)


def read_bytes(path: str, key: str) -> bytes | None:
    """Raw bytes of ``key`` in the trace at ``path``; None when absent. OSError when unreadable."""
    try:
        with fsspec.open(join(path, key), "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def metadata_problem(path: str, key: str, exc: BaseException) -> tuple[str, str]:
    """(problem, action) for a zarr.json that zarr could not open."""
    try:
        raw = read_bytes(path, key)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})", "make the file readable (permissions, disk) and run again"
    if raw is None:
        return "is missing", RECOPY
    try:
        json.loads(raw)
    except ValueError as err:
        return f"is corrupt (not valid JSON: {err})", RECOPY
    first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    return f"is corrupt (not zarr metadata: {first})", RECOPY


def _chunk_files(root: str) -> set[str]:
    """Paths of the files under ``root`` (a local directory or fsspec URL), relative, "/"-separated.

    Files only: zarr reads a directory where a chunk belongs as an absent chunk. A local tree is
    walked with ``os.scandir`` (zarr's default chunk keys put each chunk in a directory of its own,
    and fsspec's local ``find`` stats every entry: ~1 ms a directory); URLs go through fsspec.
    """
    if "://" not in root:
        out: set[str] = set()
        stack = [("", root)]
        while stack:
            rel, path = stack.pop()
            try:
                with os.scandir(path) as entries:
                    for e in entries:
                        name = f"{rel}{e.name}"
                        if e.is_dir(follow_symlinks=False):
                            stack.append((name + "/", e.path))
                        else:
                            out.add(name)
            except OSError:
                continue
        return out
    fs, path = fsspec.core.url_to_fs(root)
    try:
        return {p[len(path.rstrip("/")) + 1:].replace("\\", "/") for p in fs.find(path)}
    except OSError:
        return set()


def _chunk_sizes(root: str) -> dict[str, int]:
    """Relative path -> size in bytes of the files under ``root`` (as ``_chunk_files``); a file whose
    size cannot be read is left out (reading it will say why)."""
    if "://" not in root:
        out: dict[str, int] = {}
        for name in _chunk_files(root):
            try:
                out[name] = os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
        return out
    fs, path = fsspec.core.url_to_fs(root)
    try:
        found = fs.find(path, detail=True)
    except OSError:
        return {}
    return {p[len(path.rstrip("/")) + 1:].replace("\\", "/"): int(v.get("size") or 0) for p, v in found.items()}


def _head(path: str, key: str, n: int) -> bytes:
    """The first ``n`` bytes of ``key`` in the trace at ``path``. OSError when unreadable."""
    opener = open if "://" not in path else fsspec.open  # a local file without fsspec's per-open cost
    with opener(join(path, key), "rb") as fh:
        return fh.read(n)


def open_arrays(store, keys: list[str]) -> dict[str, object]:
    """key -> the zarr ``Array`` at ``key`` in ``store``, or the exception opening it raised, all opened
    in one trip to zarr's event loop: ``zarr.open_array`` makes a trip for each, and a trace has five
    arrays a tensor (125 trips were a quarter of ``specdiff info``'s CPU time on the shipped trace)."""
    async def opened():
        return await asyncio.gather(*(zarr_async.open_array(store=store, path=k, mode="r") for k in keys),
                                    return_exceptions=True)

    return {k: got if isinstance(got, BaseException) else zarr.Array(got)
            for k, got in zip(keys, zarr_sync(opened()), strict=True)}


class ArrayReader:
    """One array of a trace (a tensor's ``data`` or a row-key column), read damage-tolerantly.

    Args:
        trace: the trace path (local or fsspec URL) as the user gave it.
        store: the zarr store of the trace.
        key: the array's path in the store, e.g. ``tensors/target.aux.0/data``.
        tensor, column: what the array holds (for the damage lines).
        rows: rows the trace says were written (journal commits, or the array's own shape).
        dtype: storage dtype; ``shape``: per-row feature shape; ``fill``: what damaged rows read as.
        opened: what ``open_arrays`` gave for ``key`` (the array, or the exception opening it
            raised); None: opened here.
    """

    def __init__(self, *, trace: str, store, key: str, tensor: str, column: str, rows: int | None,
                 dtype: np.dtype, shape: tuple[int, ...], fill, opened=None):
        self.trace, self.key, self.tensor, self.column = trace, key, tensor, column
        self.dtype, self.shape, self.fill = np.dtype(dtype), tuple(shape), fill
        self._damage: dict[int, Damage] = {}  # chunk index -> damage; -1: the whole array
        self._scanned = False
        self._scan_lock = threading.Lock()
        self.array = None
        self.direct = None
        try:
            if isinstance(opened, BaseException):
                raise opened
            self.array = opened if opened is not None else zarr.open_array(store=store, path=key, mode="r")
        except Exception as exc:  # zarr raises many types for bad metadata
            problem, action = metadata_problem(trace, f"{key}/zarr.json", exc)
            self.rows = rows or 0
            consequence = chunk_consequence(column, 0, self.rows) if self.rows or column == "sequences" else \
                f"tensor {tensor} cannot be read"
            self._add(-1, Damage(trace, f"{key}/zarr.json", problem, consequence, action, tensor, column,
                                 (0, self.rows) if self.rows else None, lost=column != "sequences"))
            return
        self.rows = self.array.shape[0] if rows is None else rows
        self.chunk_rows = self.array.chunks[0]
        self.checksummed = any(isinstance(c, Crc32cCodec) for c in self.array.compressors)
        self.blosc = any(isinstance(c, BloscCodec) for c in self.array.compressors)
        # Uncompressed chunks all have one length, so a cut one can say how much it lost.
        self.size = None if self.array.compressors != (Crc32cCodec(),) else \
            self.chunk_rows * int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize + 4
        # Chunk files read by path (``_read_direct``): absolute, so a later chdir cannot misdirect them.
        self.direct = os.path.abspath(trace) if "://" not in trace and stored_raw(self.array) else None

    # ---- damage ---------------------------------------------------------------------------
    @property
    def damage(self) -> dict[int, Damage]:
        """chunk index -> ``Damage`` found so far (-1: the whole array; -2: rows never stored);
        the first access lists the chunk files (missing ones are damage)."""
        if not self._scanned:
            with self._scan_lock:
                if not self._scanned:
                    if self.array is not None:
                        self._find_missing()
                    self._scanned = True
        return self._damage

    def _add(self, index: int, damage: Damage) -> None:
        self._damage.setdefault(index, damage)

    def _chunk_key(self, i: int) -> str:
        return chunk_key(self.array, self.key, i)

    def _chunk_rows_of(self, i: int) -> tuple[int, int]:
        return i * self.chunk_rows, min((i + 1) * self.chunk_rows, self.rows)

    def _find_missing(self) -> None:
        stored = self.array.shape[0]
        if stored < self.rows:
            self._add(-2, Damage(self.trace, f"{self.key}/zarr.json",
                                 f"holds {stored} rows but {self.rows} were written",
                                 chunk_consequence(self.column, stored, self.rows), RECOPY, self.tensor,
                                 self.column, (stored, self.rows)))
        need = -(-min(stored, self.rows) // self.chunk_rows)
        if not need:
            return
        present = _chunk_files(join(self.trace, self.key))
        for i in range(need):
            key = self._chunk_key(i)
            if key[len(self.key) + 1:] not in present:
                problem, action = chunk_problem(None, None, checksummed=self.checksummed, blosc=self.blosc, size=self.size)
                self._chunk_damage(i, problem, action)

    def check_sizes(self) -> None:
        """Find, without reading a value, the damage a chunk file's size shows: missing files (as
        ``damage`` does) and files cut short: an uncompressed array's chunk files all have one
        length; a blosc frame's 16-byte header says how long it is (``damage.truncation``). Costs a
        listing with sizes and, for compressed arrays, 16 bytes of each chunk file; ``verify`` reads
        everything (checksums, decoding)."""
        if self.array is None or self._is_bad(-1):
            return
        if self.size is None and not self.blosc:
            return  # another codec: nothing a size can say
        need = -(-min(self.rows, self.array.shape[0]) // self.chunk_rows)
        sizes = _chunk_sizes(join(self.trace, self.key)) if need else {}
        for i in range(need):
            key = self._chunk_key(i)
            length = sizes.get(key[len(self.key) + 1:])
            if length is None or self._is_bad(i):
                continue
            try:
                head = _head(self.trace, key, 16) if self.blosc else b""
            except OSError:
                continue  # unreadable: reading it says why
            problem = truncation(length, head, checksummed=self.checksummed, blosc=self.blosc, size=self.size)
            if problem is not None:
                self._chunk_damage(i, problem, RECOPY)

    def _chunk_damage(self, i: int, problem: str, action: str) -> None:
        a, b = self._chunk_rows_of(i)
        self._add(i, Damage(self.trace, self._chunk_key(i), problem, chunk_consequence(self.column, a, b),
                            action, self.tensor, self.column, (a, b), lost=self.column != "sequences"))

    def _record(self, i: int, exc: BaseException) -> None:
        try:
            raw = read_bytes(self.trace, self._chunk_key(i))
        except OSError as err:
            raw, exc = None, err
        problem, action = chunk_problem(raw, exc, checksummed=self.checksummed, blosc=self.blosc, size=self.size)
        self._chunk_damage(i, problem, action)

    def bad(self, rows: np.ndarray) -> np.ndarray:
        """bool [len(rows)]: rows lying in damaged chunks (or past what the array holds)."""
        rows = np.asarray(rows, np.int64)
        out = np.zeros(len(rows), bool)
        for d in list(self.damage.values()):  # the app's worker may add damage meanwhile
            if d.rows is not None:
                out |= (rows >= d.rows[0]) & (rows < d.rows[1])
        return out

    def _is_bad(self, i: int) -> bool:
        return i in self.damage or -1 in self.damage

    # ---- reading --------------------------------------------------------------------------
    def _buffer(self, out: np.ndarray) -> NDBuffer:
        """``out`` (storage dtype) as a buffer zarr reads this array's values into: a view in the
        array's declared dtype (bf16 arrays declare ``bfloat16``, held as uint16 bits here)."""
        return NDBuffer.from_numpy_array(out.view(self.array.dtype) if out.dtype != self.array.dtype else out)

    def _filled(self, n: int) -> np.ndarray:
        return np.full((n, *self.shape), self.fill, self.dtype)

    def read(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) (storage dtype); damaged rows hold ``fill``.

        ``out``: an array of the rows' shape and storage dtype to read into when nothing is known
        to be damaged (a reused buffer: no fresh pages to fault in); returned then, else a new array.
        """
        if self.array is None:
            return self._filled(stop - start)
        hi = min(stop, self.array.shape[0])
        if start >= hi:
            return self._filled(stop - start)
        first, last = start // self.chunk_rows, (hi - 1) // self.chunk_rows
        clean = hi == stop and -1 not in self.damage and not any(first <= i <= last for i in list(self.damage) if i >= 0)
        if clean:
            try:
                if out is None or out.shape != (stop - start, *self.shape) or out.dtype != self.dtype:
                    out = None if not self.direct else np.empty((stop - start, *self.shape), self.dtype)
                if self.direct:
                    return self._read_direct(start, stop, out)
                if out is not None:
                    self.array.get_basic_selection(slice(start, stop), out=self._buffer(out))
                    return out
                return as_storage(self.array[start:stop], self.dtype)
            except MemoryError:
                raise
            except Exception:  # a damaged chunk: find it below, keep the rest
                pass
        out = self._filled(stop - start)
        for i in range(first, last + 1):
            if self._is_bad(i):
                continue
            a, b = max(start, i * self.chunk_rows), min(hi, (i + 1) * self.chunk_rows)
            try:
                out[a - start:b - start] = as_storage(self.array[a:b], self.dtype)
            except MemoryError:
                raise
            except Exception as exc:
                self._record(i, exc)
        return out

    def _read_direct(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Rows [start, stop) of a raw array on a local disk into ``out`` (C-contiguous, their
        shape): each whole chunk read from its file straight into ``out`` and its crc32c checked
        there (the rows of a partial chunk at either end through zarr).

        zarr's sync reads pass every chunk's checksum and copy through its one event-loop thread
        (holding the GIL), so the diff's block threads could not read on two cores at once; the
        layout read here is the one zarr's ``bytes`` + ``crc32c`` codecs define (FORMAT.md).

        Raises:
            OSError, ValueError: a chunk file missing, cut, or failing its checksum (the caller
                then reads chunk by chunk through zarr, which records the damage).
        """
        n, rows = stop - start, self.chunk_rows
        first, end = -(-start // rows), stop // rows  # chunks [first, end) lie wholly inside
        # Rows of a chunk only partly wanted: zarr (its crc covers the whole chunk).
        edges = [(start, min(first * rows, stop)), (max(end * rows, start), stop)] if first < end else [(start, stop)]
        for a, b in edges:
            if a < b:
                self.array.get_basic_selection(slice(a, b), out=self._buffer(out[a - start:b - start]))
        flat = out.reshape(n, -1).view(np.uint8)
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open(os.path.join(self.direct, self._chunk_key(i)), "rb", buffering=0))
                     for i in range(first, end)]
            _read_ahead(files)
            for i, fh in zip(range(first, end), files, strict=True):
                dest = flat[i * rows - start:(i + 1) * rows - start].reshape(-1)
                got = fh.readinto(dest)
                crc = fh.read(5)
                if got != dest.nbytes or len(crc) != 4:
                    raise ValueError(f"{fh.name}: {got + len(crc)} bytes where a chunk has {dest.nbytes + 4}")
                frozen = dest.view()
                frozen.flags.writeable = False
                if not crc32c_holds(frozen, crc):
                    raise ValueError(f"{fh.name}: fails its crc32c checksum")
        return out

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows at the given indices (any order); damaged rows hold ``fill``."""
        rows = np.asarray(rows, np.int64)
        if self.array is None:
            return self._filled(len(rows))
        rest = (slice(None),) * (self.array.ndim - 1)
        inside = rows < self.array.shape[0]
        chunk = rows // self.chunk_rows
        if inside.all() and -1 not in self.damage and not any(i >= 0 and (chunk == i).any() for i in list(self.damage)):
            try:
                return as_storage(self.array.get_orthogonal_selection((rows,) + rest), self.dtype)
            except MemoryError:
                raise
            except Exception:
                pass
        out = self._filled(len(rows))
        for i in np.unique(chunk[inside]).tolist():
            if self._is_bad(i):
                continue
            sel = inside & (chunk == i)
            try:
                out[sel] = as_storage(self.array.get_orthogonal_selection((rows[sel],) + rest), self.dtype)
            except MemoryError:
                raise
            except Exception as exc:
                self._record(i, exc)
        return out

    def verify(self) -> None:
        """Read every chunk once (one at a time); each one that fails becomes a ``Damage``."""
        if self.array is None:
            return
        n = min(self.rows, self.array.shape[0])
        for i in range(-(-n // self.chunk_rows)):
            if not self._is_bad(i):
                a, b = self._chunk_rows_of(i)
                try:
                    self.array[a:b]
                except MemoryError:
                    raise
                except Exception as exc:
                    self._record(i, exc)


__all__ = ["ArrayReader", "join", "read_bytes", "metadata_problem"]
