"""The append-only msgpack record journal of a trace (write-ahead log).

Every journal entry is one msgpack map written with a single ``write`` + ``flush``, so a process
killed at any moment leaves a journal whose complete entries all decode; only the last entry
can be cut. Entry types (key ``t``):

- ``header``  ``{format, side, created, payload}`` — always first; ``payload`` says where ``rec``
  bytes are (below);
- ``contract`` ``{contract}`` — the contract facts (last one wins);
- ``seq``     ``{id, tokens (int32 bytes), prompt_len, rid}`` — sequence table (last one per id wins);
- ``rec``     ``{name, row0, n, dtype, shape, chunk_rows, seq, pos, depth, iter}`` — one appended
  record: its key columns. ``row0`` is the tensor's row index of the first row. Its tensor bytes are in the
  tensor's spill file (below); journals written before spill files (no ``payload`` in the header)
  carry them inline as ``data``;
- ``commit``  ``{name, rows, spill}`` — rows [0, rows) of ``name`` are durable in the zarr arrays;
  ``spill`` is the generation of the spill file holding the chunk of row ``rows``;
- ``close``   ``{records}`` — the writer closed cleanly.

Spill files (``journal.spill/<name>.<gen>``, header ``payload: "chunks"``) hold each tensor's
uncommitted rows as raw bytes, row after row, one file per chunk of the tensor's data array:
generation g holds the rows of chunk g, rows [g * R, (g + 1) * R) with R the chunk rows that every
``rec`` of the tensor states (``chunk_rows``). A spill write always precedes its ``rec`` entry, so
a ``rec`` that decodes has its bytes in a spill file. When a chunk's file is full:

- raw float arrays (bytes + crc32c codecs): the crc32c of its bytes, kept as they were written, is
  appended and the file is moved to the chunk's zarr key: the chunk file *is* the spill file, so
  its rows are written once. Until the ``commit`` that covers it, the moved chunk is where a reader
  finds those rows (its spill file is gone);
- other arrays (blosc): the file stays until the ``commit`` that writes its rows to zarr.

Journals with ``payload: "spill"`` (specdiff before this) hold one file per commit instead:
generation g starts at row ``rows`` of the commit that named it and holds every later row.
Spill files carry no checksum of their own (like the journal): a float chunk gets its crc32c
when it is moved in; bytes changed in a spill file before that are read as they are.

No pickle: msgpack with ``raw=False`` and no ext hooks; arrays travel as raw bytes + dtype + shape.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

import fsspec
import google_crc32c
import msgpack
import numpy as np
from fsspec.implementations.local import LocalFileSystem

JOURNAL_NAME = "journal.msgpack"
SPILL_DIR = "journal.spill"
#: header ``payload`` value of a journal whose ``rec`` payloads live in one spill file per chunk
SPILL_PAYLOAD = "chunks"
#: the ``payload`` of journals written before: one spill file per commit, from its first row on
COMMIT_SPILL_PAYLOAD = "spill"
#: at most this often a live serving trace's journal gets a ``progress`` entry
#: (``TraceWriter.journal_progress``): a moment before which the writer process
#: (tracer/engines/writer/child.py) had written every capture handed to it: the put time of the
#: record it has just written (records come in the order put), or, with the ring empty, when it
#: looked. A watcher must not take a request whose tokens stopped growing for finished while that
#: writer is behind: at nice 19 on a loaded machine it has lagged 45 s behind 34 iterations
#: (replay/watch/follow.py waits this long twice). Written busy or idle, for as long as the writer
#: runs (~35 bytes a second; dropped from the journal at close).
PROGRESS_EVERY_S = 1.0


def spill_key(name: str, gen: int) -> str:
    """Store key of generation ``gen`` of tensor ``name``'s spill file."""
    return f"{SPILL_DIR}/{name}.{gen}"


class JournalWriter:
    """Appends entries to ``<store>/journal.msgpack`` through fsspec (local or ``memory://``)."""

    def __init__(self, url: str):
        self.url = url
        self._fh = fsspec.open(url, "ab").open()
        self._packer = msgpack.Packer(use_bin_type=True)

    def write(self, entry: dict) -> None:
        """Write one entry and flush it to the OS (survives SIGKILL of this process)."""
        self._fh.write(self._packer.pack(entry))
        self._fh.flush()

    def close(self) -> None:
        """Close the file, kept until a commit writes its rows through zarr (blosc arrays)."""
        self._fh.close()


class SpillWriter:
    """One spill file: the raw bytes of a tensor's uncommitted rows (see the module docstring).

    Args:
        url: the file (local path or fsspec URL); created empty (or truncated).
        checksum: keep the crc32c of the bytes written (``finish_as_chunk`` needs it).
    """

    def __init__(self, url: str, *, checksum: bool = False):
        self.url = url
        self._fs, self._path = fsspec.core.url_to_fs(url)
        self._fs.makedirs(self._fs._parent(self._path), exist_ok=True)
        self._fh = self._fs.open(self._path, "wb")
        self.crc = 0 if checksum else None

    def write(self, data) -> None:
        """Write the rows' bytes (a C-contiguous array or bytes) and flush to the OS before the
        caller journals the ``rec`` entry that refers to them (survives SIGKILL)."""
        view = memoryview(data).cast("B")
        self._fh.write(view)
        self._fh.flush()
        if self.crc is not None:
            frozen = np.frombuffer(view, np.uint8)  # google_crc32c takes read-only buffers only (no copy)
            frozen.flags.writeable = False
            self.crc = google_crc32c.extend(self.crc, frozen)

    def finish_as_chunk(self, chunk_url: str) -> None:
        """Append the crc32c of the bytes written (uint32 little endian: zarr v3's crc32c codec),
        close, and move the file to ``chunk_url``: a raw zarr chunk of exactly these bytes."""
        self._fh.write(self.crc.to_bytes(4, "little"))
        self._fh.flush()
        if isinstance(self._fs, LocalFileSystem):
            start_writeback(self._fh.fileno())
        self._fh.close()
        fs, dest = fsspec.core.url_to_fs(chunk_url)
        fs.makedirs(fs._parent(dest), exist_ok=True)
        if isinstance(fs, LocalFileSystem):
            os.replace(self._path, dest)  # atomic: a reader sees the spill file or the chunk, whole
        else:
            fs.mv(self._path, dest)

    def close(self) -> None:
        self._fh.close()

    def close_and_remove(self) -> None:
        """Close and delete the file (its rows are committed to zarr)."""
        self._fh.close()
        self._fs.rm(self._path)


def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of dirty pages, do not wait


def start_writeback(fd: int) -> None:
    """Start writing a full chunk file's dirty pages to disk, without waiting and keeping them
    cached (Linux ``sync_file_range``; elsewhere nothing): the disk writes while rows keep coming,
    instead of all at once at a sync or when the kernel's dirty limit stalls the writer."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def remove_spill_dir(store_url: str, join) -> None:
    """Delete the (empty) spill directory of a closed trace; ``join`` builds ``store_url/key``."""
    fs, path = fsspec.core.url_to_fs(join(store_url, SPILL_DIR))
    try:
        if not fs.ls(path):
            fs.rmdir(path)
    except (FileNotFoundError, NotADirectoryError):
        pass


def read_spill(url: str) -> bytes | None:
    """The bytes of a spill file, None when it is missing."""
    try:
        with fsspec.open(url, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def compact_journal(url: str) -> None:
    """Drop the row keys (and, in journals before spill files, the tensor payloads) of ``rec``
    entries once every row is committed to zarr, and the ``progress`` entries.

    Called by a writer that closed cleanly: they are a crash copy only. The new journal is written beside the old one and moved over
    it, so a crash here leaves one of the two, both valid.
    """
    fs, path = fsspec.core.url_to_fs(url)
    tmp = path + ".compact"
    packer = msgpack.Packer(use_bin_type=True)
    with fs.open(path, "rb") as src, fs.open(tmp, "wb") as dst:
        for entry in msgpack.Unpacker(src, raw=False, strict_map_key=False, max_buffer_size=0):
            if entry.get("t") == "progress":  # a live writer's progress (~1 a second): nothing left to follow
                continue
            if entry.get("t") == "rec":
                entry = {k: v for k, v in entry.items() if k not in ("data", "seq", "pos", "depth", "iter")}
            dst.write(packer.pack(entry))
    fs.mv(tmp, path)


@dataclass
class JournalScan:
    """What a journal holds: its complete entries before any damage, and what is wrong with it.

    Attributes:
        entries: decoded entries, in order, up to the first damage.
        size: the journal's length in bytes (0 when missing).
        cut_tail_bytes: bytes of an incomplete last entry (a writer killed mid-write, or a cut file).
        problem: None for a readable journal, else what is wrong, as the end of a sentence
            starting with the file name (``"is corrupt at byte 120 (...)"``); entries after it are lost.
        usable: the journal starts with a specdiff header (so its entries can be trusted).
    """

    entries: list[dict] = field(default_factory=list)
    size: int = 0
    cut_tail_bytes: int = 0
    problem: str | None = None

    @property
    def usable(self) -> bool:
        return bool(self.entries) and self.entries[0].get("t") == "header"


def _decode(unpacker, out: list[dict], consumed: int) -> tuple[int, str | None]:
    """Decode the complete entries in ``unpacker`` into ``out``: (bytes of the stream they end at,
    counting from the unpacker's start; what is wrong, or None). msgpack's own ``tell()`` also
    counts the bytes of a cut last entry, so the end of the last whole entry is kept here."""
    try:
        for entry in unpacker:
            if not isinstance(entry, dict) or "t" not in entry:
                return consumed, "an entry that is not a specdiff record"
            out.append(entry)
            consumed = unpacker.tell()
    except (msgpack.UnpackException, ValueError) as exc:
        return consumed, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return consumed, None


class JournalFollower:
    """Decodes a growing journal a piece at a time: each ``read_new`` reads only the bytes appended
    since the previous call and returns the entries they complete (a cut last entry waits for its
    remaining bytes). ``problem`` is set, and nothing more is returned, once a decoded entry is not
    a specdiff record or the bytes do not decode; ``read_journal`` then says what is wrong.

    Only a local file is followed. ``replaced`` is set when the path holds another journal now: a
    closing writer compacts the journal into a new file (``compact_journal``), and a trace deleted
    and recorded again at the same path can get the same inode back, so a new inode, a file shorter
    than what was read, or other first bytes (the header entry, which holds its creation time) all
    count. ``read_new`` raises FileNotFoundError when the file is gone.
    """

    def __init__(self, path: str):
        self.path = path
        self.offset = 0  # bytes read so far
        self.problem: str | None = None
        self.replaced = False
        self._inode: int | None = None
        self._head = b""  # the header entry's bytes
        self._consumed = 0  # bytes of the entries decoded
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)

    @property
    def cut_tail_bytes(self) -> int:
        """Bytes read that do not complete an entry yet."""
        return self.offset - self._consumed

    def read_new(self) -> list[dict]:
        """The entries completed by the bytes appended since the last call, in order ([] once
        ``problem`` or ``replaced`` is set).

        Raises:
            FileNotFoundError: the journal is gone. OSError: it cannot be read.
        """
        if self.problem is not None or self.replaced:
            return []
        with open(self.path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if self._inode is not None and (st.st_ino != self._inode or st.st_size < self.offset
                                            or (self._head and fh.read(len(self._head)) != self._head)):
                self.replaced = True
                return []
            self._inode = st.st_ino
            fh.seek(self.offset)
            raw = fh.read()
        self.offset += len(raw)
        self._unpacker.feed(raw)
        out: list[dict] = []
        self._consumed, self.problem = _decode(self._unpacker, out, self._consumed)
        if not self._head and out:
            self._head = raw[:self._first_entry_end(raw)]
        return out

    @staticmethod
    def _first_entry_end(raw: bytes) -> int:
        u = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)
        u.feed(raw)
        u.skip()
        return u.tell()


def read_journal(url: str) -> JournalScan:
    """Decode every complete entry of a journal; damage is described, not raised.

    A cut last entry alone is what a killed writer leaves (``cut_tail_bytes``), not a problem here;
    the store decides whether a cut is expected (the trace was not closed) or damage.
    """
    scan = JournalScan()
    try:
        with fsspec.open(url, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        scan.problem = "is missing"
        return scan
    except OSError as exc:
        scan.problem = f"cannot be read ({exc.strerror or exc})"
        return scan
    scan.size = len(raw)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)
    unpacker.feed(raw)
    consumed, why = _decode(unpacker, scan.entries, 0)
    if why is not None:
        scan.problem = f"is corrupt at byte {consumed} ({why})"
    if scan.problem is None:
        scan.cut_tail_bytes = len(raw) - consumed
    if not scan.usable and scan.problem is None:
        scan.problem = (f"is truncated before its header ({len(raw)} bytes)" if len(raw) == 0 or scan.cut_tail_bytes
                        else "does not start with a specdiff header")
    return scan
