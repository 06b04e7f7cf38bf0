"""Copy a trace written before chunk checksums into one with them (and with ``sequences/id``).

Traces without the crc32c codec still read (a damaged chunk is found when it fails to decode), but
bytes changed in place can decode to wrong values unnoticed; upgrading adds the checksum so such a
change reads as damage. The source is verified first (every chunk read) and never modified::

    python -m specdiff.tracer.store.upgrade OLD.trace NEW.trace
"""

from __future__ import annotations

import sys

import fsspec
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from specdiff.tracer.errors import TraceError
from specdiff.tracer.store import ARRAY_CONFIG, KEY_COLUMNS, SEQUENCE_ARRAYS, open_trace


def _rewrite(src, dst, key: str) -> None:
    """Rewrite array ``key`` of group ``dst`` from the same array of group ``src`` with crc32c
    appended to its compressors (same chunks, dtype, dims, attributes and values), one chunk at a
    time; already checksummed arrays are left alone."""
    arr = src[key]
    if any(isinstance(c, Crc32cCodec) for c in arr.compressors):
        return
    parent, name = key.rsplit("/", 1)
    new = dst[parent].create_array(
        name, shape=arr.shape, chunks=arr.chunks, dtype=arr.dtype, fill_value=arr.fill_value,
        compressors=[*arr.compressors, Crc32cCodec()], dimension_names=arr.metadata.dimension_names,
        attributes=dict(arr.attrs), config=ARRAY_CONFIG, overwrite=True)
    step = arr.chunks[0]
    for a in range(0, arr.shape[0], step):
        new[a:a + step] = arr[a:a + step]


def upgrade(src: str, dst: str) -> int:
    """Copy trace ``src`` to ``dst`` with crc32c on every chunk and a ``sequences/id`` array.

    Returns the number of arrays rewritten.

    Raises:
        TraceError: ``src`` is damaged (the damage lines), or ``dst`` exists.
    """
    trace = open_trace(src)
    damage = trace.verify()
    if damage:
        raise TraceError(f"{src}: damaged, not upgraded: {damage[0].message()}")
    fs, src_path = fsspec.core.url_to_fs(src)
    dst_path = fsspec.core.url_to_fs(dst)[1]
    if fs.exists(dst_path):
        raise TraceError(f"{dst}: already exists; choose another path")
    fs.copy(src_path, dst_path, recursive=True)  # same filesystem: a trace is upgraded beside itself
    group = zarr.open_group(store=dst, mode="r+")
    source = zarr.open_group(store=src, mode="r")
    keys = [f"tensors/{name}/{col}" for name in trace.names if trace.rows(name)
            for col in ("data", *(k for k, _ in KEY_COLUMNS)) if f"tensors/{name}/{col}" in group]
    if trace.closed and trace.sequences:
        if "sequences/id" not in group:
            group["sequences"].create_array("id", data=np.array([s.id for s in trace.sequences], np.int32),
                                            dimension_names=("seq",), compressors=[Crc32cCodec()],
                                            config=ARRAY_CONFIG)
        keys += [f"sequences/{k}" for k, _ in SEQUENCE_ARRAYS if k != "id"]
    for key in keys:
        _rewrite(source, group, key)
    if open_trace(dst).verify():
        raise TraceError(f"{dst}: the upgraded copy does not verify; keep {src}")
    return len(keys)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m specdiff.tracer.store.upgrade OLD.trace NEW.trace", file=sys.stderr)
        return 2
    try:
        n = upgrade(args[0], args[1])
    except TraceError as exc:
        print(f"specdiff: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args[1]}: {n} arrays rewritten with crc32c checksums")
    return 0


if __name__ == "__main__":
    sys.exit(main())
