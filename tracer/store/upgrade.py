"""Copy a trace written by an older specdiff into one in today's layout: ``specdiff upgrade OLD NEW``.

What older traces lack, and what the copy adds (values unchanged, bit for bit):
- crc32c on every chunk: traces without it still read (a damaged chunk is found when it fails to
  decode), but bytes changed in place can decode to wrong values unnoticed;
- ``sequences/id``;
- bf16 tensors declared as zarr's ``bfloat16`` data type instead of their ``uint16`` bits
  (tracer/store/arrays.py), so zarr and xarray read real bfloat16 values;
- consolidated metadata (tracer/store/layout.py ``consolidate``): one read opens the trace, no
  listing (object stores), no warning from zarr about the journal.

The source is verified first (every chunk read) and never modified. Also
``python -m specdiff.tracer.store.upgrade OLD.trace NEW.trace``.
"""

from __future__ import annotations

import os
import sys

import fsspec
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from specdiff.tracer.errors import TraceError
from specdiff.tracer.store import ARRAY_CONFIG, KEY_COLUMNS, SEQUENCE_ARRAYS, open_trace
from specdiff.tracer.store.arrays import bf16
from specdiff.tracer.store.layout import consolidate


def _rewrite(src, dst, key: str, *, compact: bool = False) -> bool:
    """Rewrite array ``key`` of group ``dst`` from the same array of group ``src`` with crc32c
    appended to its compressors and bf16 bits declared ``bfloat16`` (same dims, attributes and
    bits), one chunk at a time; with ``compact``, chunks of no more rows than the array holds.
    Returns False (nothing written) for an array that needs none of it."""
    arr = src[key]
    checksummed = any(isinstance(c, Crc32cCodec) for c in arr.compressors)
    bits = arr.attrs.get("specdiff_dtype") == "bfloat16" and arr.dtype == np.uint16
    chunks = arr.chunks
    if compact and 0 < arr.shape[0] < chunks[0]:
        chunks = (arr.shape[0], *chunks[1:])
    if checksummed and not bits and chunks == arr.chunks:
        return False
    parent, name = key.rsplit("/", 1)
    new = dst[parent].create_array(
        name, shape=arr.shape, chunks=chunks, dtype=bf16() if bits else arr.dtype,
        fill_value=0 if bits else arr.fill_value,
        compressors=[*arr.compressors] if checksummed else [*arr.compressors, Crc32cCodec()],
        dimension_names=arr.metadata.dimension_names, attributes=dict(arr.attrs), config=ARRAY_CONFIG,
        overwrite=True)
    step = chunks[0]
    for a in range(0, arr.shape[0], step):
        new[a:a + step] = arr[a:a + step].view(bf16()) if bits else arr[a:a + step]
    return True


def upgrade(src: str, dst: str, *, compact: bool = False) -> int:
    """Copy trace ``src`` to ``dst`` in today's layout (module docstring: crc32c on every chunk,
    ``sequences/id``, bf16 as ``bfloat16``, consolidated metadata). A ranked trace (``dp<r>``
    stores) is not upgraded: upgrade each rank store. ``compact``: also shrink every array's chunks
    to the rows it holds (a raw float chunk is stored whole, ~4 MiB, however few rows it has: a
    small trace meant to be shipped, like traces/examples, is otherwise mostly padding).

    Returns the number of arrays rewritten (0: ``src`` had today's arrays; ``dst`` is a copy with
    consolidated metadata).

    ``dst`` appears whole or not at all: the copy is made and verified at ``<dst>.partial-<pid>``
    and then moved to ``dst``; a failure or an interrupt (KeyboardInterrupt) removes the partial copy.

    Raises:
        TraceError: ``src`` is damaged (the first damage line), unclosed, per-rank, ``dst`` exists,
            or ``dst``'s folder does not exist (a local path).
    """
    trace = open_trace(src)
    if hasattr(trace, "ranks"):
        raise TraceError(f"{src}: holds per-rank traces ({', '.join(lb for lb, _ in trace.ranks)}); "
                         "upgrade each one on its own")
    if not trace.closed:
        raise TraceError(f"{src}: the writer never closed this trace; open it as it is (specdiff reads "
                         "unclosed traces) rather than upgrading a copy of a trace still being written")
    damage = trace.verify()
    if damage:
        raise TraceError(f"{src}: damaged, not upgraded: {damage[0].message()}")
    fs, src_path = fsspec.core.url_to_fs(src)
    dst_path = fsspec.core.url_to_fs(dst)[1]
    if fs.exists(dst_path):
        raise TraceError(f"{dst}: already exists; choose another path")
    parent = os.path.dirname(os.path.abspath(dst_path))
    if "file" in fs.protocol and not os.path.isdir(parent):
        raise TraceError(f"{dst}: folder {parent} does not exist; create it or choose another path")
    partial = f"{dst.rstrip('/')}.partial-{os.getpid()}"
    partial_path = fsspec.core.url_to_fs(partial)[1]
    if fs.exists(partial_path):
        raise TraceError(f"{partial}: already exists (a killed upgrade's copy?); remove it and run again")
    try:
        n = _upgrade_copy(trace, src, partial, compact=compact)
        if open_trace(partial).verify():
            raise TraceError(f"{dst}: the upgraded copy does not verify; keep {src}")
        fs.mv(partial_path, dst_path, recursive=True)
    except BaseException:
        if fs.exists(partial_path):
            fs.rm(partial_path, recursive=True)
        raise
    return n


def _upgrade_copy(trace, src: str, dst: str, *, compact: bool) -> int:
    """``upgrade``'s copy of the opened, verified ``trace`` (at ``src``) to ``dst``, which does not exist."""
    fs, src_path = fsspec.core.url_to_fs(src)
    fs.copy(src_path, fsspec.core.url_to_fs(dst)[1], recursive=True)  # same filesystem: upgraded beside itself
    group = zarr.open_group(store=dst, mode="r+")
    source = zarr.open_group(store=src, mode="r")
    keys = [f"tensors/{name}/{col}" for name in trace.names if trace.rows(name)
            for col in ("data", *(k for k, _ in KEY_COLUMNS)) if f"tensors/{name}/{col}" in group]
    if trace.sequences:  # closed: refused above otherwise
        if "sequences/id" not in group:
            group["sequences"].create_array("id", data=np.array([s.id for s in trace.sequences], np.int32),
                                            dimension_names=("seq",), compressors=[Crc32cCodec()],
                                            config=ARRAY_CONFIG)
        keys += [f"sequences/{k}" for k, _ in SEQUENCE_ARRAYS if k != "id"]
    rewritten = sum(_rewrite(source, group, key, compact=compact) for key in keys)
    consolidate(group.store)
    return rewritten


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
    print(f"{args[1]}: {n} arrays rewritten (crc32c checksums, bfloat16 data type), metadata consolidated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
