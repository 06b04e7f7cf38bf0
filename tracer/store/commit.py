"""Commit rows to a tensor's zarr arrays in one trip to zarr's event loop, copying the payload once.

zarr's ``setitem`` over several chunks builds each chunk in a fresh array, and its crc32c codec
appends the checksum with ``np.append`` (another fresh array): on a VM where page faults make a
copy into new memory ~10x slower than one into memory already touched, those copies, not the
encoding, were most of the write time (issue 14). So:

- whole chunks of an array stored raw (zarr v3 codecs ``bytes`` little endian + ``crc32c``, what
  ``layout.data_codecs`` gives float tensors) are encoded here, into a staging buffer reused across
  commits, and handed to the array's store: chunk bytes, then the crc32c of those bytes as uint32
  little endian (zarr v3 crc32c codec spec), under the key zarr itself would use. zarr reads them
  back through its own codecs (which check the crc), so a mistake here is a read error, not a
  silent change (tests/test_store.py);
- whole chunks of other arrays go to zarr one chunk per ``setitem`` (zarr then encodes the values
  as they are, without building a chunk array); partial chunks (first and last of a commit) go
  through zarr's read-modify-write.
"""

from __future__ import annotations

import asyncio
import sys

import google_crc32c
import numpy as np
from zarr.codecs import BytesCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype

_CRC_BYTES = 4


def stored_raw(array) -> bool:
    """Whether a chunk of the zarr ``AsyncArray`` is stored as its C-order bytes + crc32c, so this
    module can encode it (little-endian host, codecs exactly ``bytes`` (little) + ``crc32c``)."""
    codecs = array.metadata.codecs
    return (sys.byteorder == "little" and len(codecs) == 2 and isinstance(codecs[0], BytesCodec)
            and (codecs[0].endian is None or codecs[0].endian.value == "little")
            and isinstance(codecs[1], Crc32cCodec))


class Staging:
    """A byte buffer reused by every commit of a writer (grown when a commit needs more)."""

    def __init__(self):
        self.buf = np.empty(0, np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        """uint8 [nbytes], contents undefined."""
        if self.buf.nbytes < nbytes:
            self.buf = np.empty(nbytes, np.uint8)
        return self.buf[:nbytes]


async def _set_raw(array, *, index: int, values: np.ndarray, out: np.ndarray) -> None:
    """Encode whole chunk ``index`` of ``array`` (``values``: its rows) into ``out`` (its bytes + 4) and store it."""
    raw = values.reshape(-1).view(np.uint8)
    out[:-_CRC_BYTES] = raw
    out[-_CRC_BYTES:] = np.frombuffer(google_crc32c.value(raw).to_bytes(4, "little"), np.uint8)
    key = array.metadata.encode_chunk_key((index,) + (0,) * (array.ndim - 1))
    await (array.store_path / key).set(default_buffer_prototype().buffer.from_array_like(out))


def _chunk_writes(array, values: np.ndarray, *, start: int, staging: Staging | None) -> list:
    """Coroutines writing ``values`` (rows [start, start + len(values)) of ``array``); whole raw
    chunks are encoded into ``staging`` (None: all through zarr)."""
    stop = start + values.shape[0]
    rows = array.chunks[0]
    first, end = -(-start // rows), stop // rows  # chunks [first, end) lie wholly inside
    if first >= end:
        return [array.setitem(slice(start, stop), values)]
    writes = []
    if start < first * rows:
        writes.append(array.setitem(slice(start, first * rows), values[:first * rows - start]))
    if staging is not None and stored_raw(array) and values.flags.c_contiguous:
        size = rows * values[0].nbytes + _CRC_BYTES
        buf = staging.get((end - first) * size)
        for j, i in enumerate(range(first, end)):
            part = values[i * rows - start:(i + 1) * rows - start]
            writes.append(_set_raw(array, index=i, values=part, out=buf[j * size:(j + 1) * size]))
    else:
        writes += [array.setitem(slice(i * rows, (i + 1) * rows), values[i * rows - start:(i + 1) * rows - start])
                   for i in range(first, end)]
    if end * rows < stop:
        writes.append(array.setitem(slice(end * rows, stop), values[end * rows - start:]))
    return writes


async def grow_and_write(targets: list, *, start: int, staging: Staging) -> None:
    """Grow each zarr ``AsyncArray`` of ``targets`` ([(array, values [n, ...])]) to ``start + n``
    rows, then write ``values`` to rows [start, start + n). Raises what the store raises."""
    stop = start + targets[0][1].shape[0]
    await asyncio.gather(*(a.resize((stop, *a.shape[1:])) for a, _ in targets))
    # Only the data array (the first) is worth encoding here; the key columns are small and compressed.
    writes = _chunk_writes(targets[0][0], targets[0][1], start=start, staging=staging)
    for array, values in targets[1:]:
        writes += _chunk_writes(array, values, start=start, staging=None)
    await asyncio.gather(*writes)
