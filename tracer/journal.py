"""The append-only msgpack record journal of a trace (write-ahead log).

Every journal entry is one msgpack map written with a single ``write`` + ``flush``, so a process
killed at any moment leaves a journal whose complete entries all decode; only the last entry
can be cut. Entry types (key ``t``):

- ``header``  ``{format, side, created}`` — always first;
- ``contract`` ``{contract}`` — the contract facts (last one wins);
- ``seq``     ``{id, tokens (int32 bytes), prompt_len, rid}`` — sequence table (last one per id wins);
- ``rec``     ``{name, row0, n, dtype, shape, seq, pos, depth, iter, data}`` — one appended record:
  its key columns and its tensor bytes. ``row0`` is the tensor's row index of the first row;
- ``commit``  ``{name, rows}`` — rows [0, rows) of ``name`` are durable in the zarr arrays, so
  their ``rec`` payloads need not be replayed;
- ``close``   ``{records}`` — the writer closed cleanly.

No pickle: msgpack with ``raw=False`` and no ext hooks; arrays travel as raw bytes + dtype + shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fsspec
import msgpack

JOURNAL_NAME = "journal.msgpack"


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


def compact_journal(url: str) -> None:
    """Drop the tensor payloads of ``rec`` entries once every row is committed to zarr.

    Called by a writer that closed cleanly: the payloads are a crash copy only, and dropping
    them halves the trace on disk. The new journal is written beside the old one and moved over
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
