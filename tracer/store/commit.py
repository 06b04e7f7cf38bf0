"""Commit rows to a tensor's zarr arrays in one trip to zarr's event loop.

A raw float tensor's whole chunks are not written here: each is its spill file, moved to its zarr
key once full (journal.py), so its rows are written once. What a commit writes through zarr is
small or compressed: the key columns, a blosc tensor's rows, a raw tensor's partial last chunk.
zarr's ``setitem`` over several chunks builds each chunk in a fresh array, so whole chunks go one
per ``setitem`` (zarr then encodes the values as they are); partial chunks (first and last of a
write) go through zarr's read-modify-write.
"""

from __future__ import annotations

import asyncio

import numpy as np


def _chunk_writes(array, values: np.ndarray, *, start: int) -> list:
    """Coroutines writing ``values`` to rows [start, start + len(values)) of the zarr ``AsyncArray``."""
    stop = start + values.shape[0]
    rows = array.chunks[0]
    first, end = -(-start // rows), stop // rows  # chunks [first, end) lie wholly inside
    if first >= end:
        return [array.setitem(slice(start, stop), values)]
    writes = []
    if start < first * rows:
        writes.append(array.setitem(slice(start, first * rows), values[:first * rows - start]))
    writes += [array.setitem(slice(i * rows, (i + 1) * rows), values[i * rows - start:(i + 1) * rows - start])
               for i in range(first, end)]
    if end * rows < stop:
        writes.append(array.setitem(slice(end * rows, stop), values[end * rows - start:]))
    return writes


async def grow_and_write(arrays: list, *, rows: int, writes: list) -> None:
    """Grow each zarr ``AsyncArray`` of ``arrays`` to ``rows`` rows (chunks past the old shape are
    kept: a raw tensor's moved-in chunks are there already), then run ``writes``
    ([(array, start, values [n, ...])]: rows [start, start + n)). Raises what the store raises."""
    await asyncio.gather(*(a.resize((rows, *a.shape[1:]), delete_outside_chunks=False) for a in arrays))
    await asyncio.gather(*(w for array, start, values in writes for w in _chunk_writes(array, values, start=start)))
