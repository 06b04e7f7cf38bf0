"""Damage found in a trace store, each described as one line: what, where, which rows, what to do.

A trace is damaged when bytes it wrote cannot be read back: a chunk file that is missing, cut
short, changed after writing (its crc32c checksum fails), undecodable or unreadable (permissions,
I/O), a journal cut or corrupt, or a zarr.json that is not valid metadata. ``tracer.store`` finds
it (at open, on read, or everywhere with ``Trace.verify``) and keeps going with the rest; readers
see the damaged rows filled (NaN floats, zero ints, row key seq -1) and ``Trace.unreadable``
says which rows those are.
"""

from __future__ import annotations

from dataclasses import dataclass

import google_crc32c  # zarr's own crc32c dependency (zarr.codecs.Crc32cCodec)

#: What to do about bytes that are gone or changed: the recorded values exist nowhere else.
RECOPY = "copy the trace again from where it was recorded, or re-record it"
#: What to do about bytes that are there but cannot be read.
READABLE = "make the file readable (permissions, disk) and run again"
_BLOSC_HEADER = 16  # c-blosc frame header: version, flags, typesize, nbytes, blocksize, cbytes (u32 LE at 12)


@dataclass(frozen=True)
class Damage:
    """One damaged part of a trace.

    Attributes:
        trace: the trace path as the user gave it.
        key: store key relative to the trace (``tensors/target.aux.0/data/c/0/0``,
            ``journal.msgpack``, ``zarr.json``).
        problem: what is wrong with it, e.g. ``"is truncated (10 of 4133 bytes)"``.
        consequence: what the reader lost or did instead, e.g. ``"rows 0-401 are unreadable"``.
        action: what the user can do (``RECOPY`` / ``READABLE`` / a sentence).
        tensor: canonical tensor name, or None for the journal and the group metadata.
        column: ``data`` or a row key column (``seq``/``pos``/``depth``/``iter``), or None.
        rows: rows ``[start, stop)`` of ``tensor`` that are unreadable, or None.
        lost: recorded values are unavailable (False when another copy was read instead).
    """

    trace: str
    key: str
    problem: str
    consequence: str
    action: str
    tensor: str | None = None
    column: str | None = None
    rows: tuple[int, int] | None = None
    lost: bool = True

    def message(self) -> str:
        """The one line the CLI, the report and the app show."""
        if self.tensor is None:
            what = f"chunk {self.key}" if self.rows is not None and not self.key.endswith("zarr.json") else self.key
        else:
            chunk = self.rows is not None and not self.key.endswith("zarr.json")
            what = f"tensor {self.tensor}, {'chunk ' if chunk else ''}{self.key}"
        return f"{self.trace}: {what} {self.problem}: {self.consequence}; {self.action}"


def rows_text(start: int, stop: int) -> str:
    return f"row {start}" if stop - start == 1 else f"rows {start}-{stop - 1}"


def chunk_consequence(column: str, start: int, stop: int) -> str:
    """What losing a chunk of ``column`` costs the diff."""
    if column == "sequences":
        return "the sequence table is read from the record journal instead"
    if column == "data":
        return f"{rows_text(start, stop)} are unreadable and not compared"
    return f"the {column} keys of {rows_text(start, stop)} are unreadable, so those rows are not aligned or compared"


def truncation(length: int, head: bytes, *, checksummed: bool, blosc: bool, size: int | None) -> str | None:
    """The problem "is truncated (...)" when a chunk file of ``length`` bytes is shorter than its array's chunks
    must be, else None. Needs no value: ``head`` is the file's first 16 bytes (a blosc frame's header
    says how long the frame is; unused otherwise), ``size`` the length every chunk file of an
    uncompressed array has (None when compressed); a crc32c trailer adds 4 bytes."""
    extra = 4 if checksummed else 0
    if blosc:
        if length - extra < _BLOSC_HEADER:
            return f"is truncated ({length} bytes, shorter than its header)"
        cbytes = int.from_bytes(head[12:16], "little")
        if cbytes > length - extra:
            return f"is truncated ({length} of {cbytes + extra} bytes)"
    if size is not None and length < size:
        return f"is truncated ({length} of {size} bytes)"
    return None


def chunk_problem(raw: bytes | None, exc: BaseException | None, *, checksummed: bool, blosc: bool,
                  size: int | None = None) -> tuple[str, str]:
    """(problem, action) for a chunk whose decode failed, or that is absent.

    Args:
        raw: the chunk file's bytes; None when the file does not exist.
        exc: the exception reading or decoding raised (an ``OSError`` means the file could not be read).
        checksummed: the array's codecs end with crc32c (checksum = last 4 bytes, little endian,
            over the bytes before it; zarr v3 crc32c codec spec).
        blosc: the compressor is blosc (its 16-byte header says how long the frame is).
        size: the length every chunk file of the array has (uncompressed chunks: the chunk's
            bytes + 4 of crc32c), None when compressed.
    """
    if raw is None:
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            return f"cannot be read ({exc.strerror or exc})", READABLE
        return "is missing", RECOPY
    if not raw:
        return "is empty (0 bytes)", RECOPY
    inner = raw[:-4] if checksummed else raw
    crc_ok = checksummed and len(raw) >= 4 and google_crc32c.value(inner).to_bytes(4, "little") == raw[-4:]
    cut = None if crc_ok else truncation(len(raw), raw[:_BLOSC_HEADER], checksummed=checksummed, blosc=blosc,
                                         size=size)
    if cut is not None:
        return cut, RECOPY
    if checksummed and not crc_ok:
        return "fails its crc32c checksum (its bytes changed after writing)", RECOPY
    reason = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown reason"
    return f"cannot be decoded ({reason.splitlines()[0][:120]})", RECOPY
