"""The append-only msgpack record journal of a trace (write-ahead log).

Every journal entry is one msgpack map written with a single ``write`` + ``flush``, so a process
killed at any moment leaves a journal whose complete entries all decode; only the last entry
can be cut. Entry types (key ``t``):

- ``header``  ``{format, side, created}`` — always first;
- ``contract`` ``{contract}`` — the contract facts (last one wins);
- ``seq``     ``{id, tokens (int32 bytes), prompt_len, rid}`` — sequence table (last one per id wins);
- ``rec``     ``{name, row0, n, dtype, shape, seq, pos, depth, iter}`` — one appended record: its
  key columns. ``row0`` is the tensor's row index of the first row. Its tensor bytes are in the
  tensor's spill file (below); journals written before spill files (no ``payload`` in the header)
  carry them inline as ``data``;
- ``commit``  ``{name, rows, spill}`` — rows [0, rows) of ``name`` are durable in the zarr arrays,
  and rows from ``rows`` on are in spill file generation ``spill``;
- ``close``   ``{records}`` — the writer closed cleanly.

Spill files (``journal.spill/<name>.<gen>``, header ``payload: "spill"``) hold each tensor's
uncommitted rows as raw bytes, row after row: the file of generation g starts at the rows of the
commit that named g (0 for generation 0). A commit writes the rows it leaves uncommitted to
generation g+1, journals the commit, then deletes generation g: the payload is written to disk
once (to zarr) plus at most the rows of one chunk per commit, and every journalled row is at all
times in zarr or in the spill file the journal names. A spill write always precedes its ``rec``
entry, so a ``rec`` that decodes has its bytes in the spill file.

No pickle: msgpack with ``raw=False`` and no ext hooks; arrays travel as raw bytes + dtype + shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fsspec
import msgpack

JOURNAL_NAME = "journal.msgpack"
SPILL_DIR = "journal.spill"
#: header ``payload`` value of a journal whose ``rec`` payloads live in spill files
SPILL_PAYLOAD = "spill"


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
        self._fh.close()


class SpillWriter:
    """One tensor's spill file: the raw bytes of its uncommitted rows (see the module docstring).

    Args:
        url: the file (local path or fsspec URL); created empty (or truncated).
    """

    def __init__(self, url: str):
        self.url = url
        fs, path = fsspec.core.url_to_fs(url)
        fs.makedirs(fs._parent(path), exist_ok=True)
        self._fh = fs.open(path, "wb")
        self.size = 0

    def write(self, data) -> None:
        """Write the rows' bytes (a C-contiguous array or bytes) and flush to the OS before the
        caller journals the ``rec`` entry that refers to them (survives SIGKILL)."""
        view = memoryview(data).cast("B")
        self._fh.write(view)
        self._fh.flush()
        self.size += view.nbytes

    def close_and_remove(self) -> None:
        """Close and delete the file (its rows are committed to zarr or in the next generation)."""
        self._fh.close()
        fs, path = fsspec.core.url_to_fs(self.url)
        fs.rm(path)


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
    entries once every row is committed to zarr.

    Called by a writer that closed cleanly: they are a crash copy only. The new journal is written beside the old one and moved over
    it, so a crash here leaves one of the two, both valid.
    """
    fs, path = fsspec.core.url_to_fs(url)
    tmp = path + ".compact"
    packer = msgpack.Packer(use_bin_type=True)
    with fs.open(path, "rb") as src, fs.open(tmp, "wb") as dst:
        for entry in msgpack.Unpacker(src, raw=False, strict_map_key=False, max_buffer_size=0):
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
    consumed = 0
    try:
        for entry in unpacker:
            if not isinstance(entry, dict) or "t" not in entry:
                scan.problem = f"is corrupt at byte {consumed} (an entry that is not a specdiff record)"
                break
            scan.entries.append(entry)
            consumed = unpacker.tell()
    except (msgpack.UnpackException, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        scan.problem = f"is corrupt at byte {consumed} ({why})"
    if scan.problem is None:
        scan.cut_tail_bytes = len(raw) - consumed
    if not scan.usable and scan.problem is None:
        scan.problem = (f"is truncated before its header ({len(raw)} bytes)" if len(raw) == 0 or scan.cut_tail_bytes
                        else "does not start with a specdiff header")
    return scan
