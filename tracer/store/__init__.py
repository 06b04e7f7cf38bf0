"""The specdiff trace store: a zarr v3 group plus an append-only msgpack journal.

Layout (traces/FORMAT.md has the full description)::

    <trace>/zarr.json                      group; attrs: specdiff {format, side}, contract, closed
    <trace>/journal.msgpack                write-ahead record journal (tracer.journal)
    <trace>/tensors/<name>/data            [row, *dims]  the tensor rows, compressed chunks
    <trace>/tensors/<name>/{seq,pos,depth,iter}  [row] int32/int16 row keys (schema.py)
    <trace>/sequences/{tokens,offsets,prompt_len}  written at close, for plain-zarr readers

``TraceWriter.append`` writes the record at once (its bytes to the tensor's spill file, then its
keys to the journal, so a SIGKILL loses nothing already appended) and buffers rows per tensor;
whole chunks go to zarr as they fill, a ``commit`` entry marks them durable and the spill file
is replaced by one holding only the rows still uncommitted (tracer.journal), so the trace's bytes
reach the disk once. ``open_trace`` reads committed rows from zarr and the uncommitted tail from
the spill files the journal names.

Modules: ``layout`` (format constants, codecs, ``Sequence``), ``writer`` (``TraceWriter``),
``reader`` (``open_trace`` -> ``Trace``), ``recover`` (rows of an unclosed trace from the journal
and its spill files; damage found while reading).
"""

from specdiff.tracer.arrays import STORAGE_DTYPES
from specdiff.tracer.store.layout import (
    ARRAY_CONFIG,
    CHUNK_BYTES,
    FORMAT_VERSION,
    KEY_COLUMNS,
    SEQUENCE_ARRAYS,
    SIDES,
    Sequence,
    local_path,
)
from specdiff.tracer.store.reader import TensorInfo, Trace, damaged_fill, open_trace
from specdiff.tracer.store.writer import TraceWriter

__all__ = ["STORAGE_DTYPES", "CHUNK_BYTES", "FORMAT_VERSION", "KEY_COLUMNS", "SEQUENCE_ARRAYS", "SIDES", "Sequence",
           "TensorInfo", "Trace", "TraceWriter", "damaged_fill", "local_path", "open_trace", "ARRAY_CONFIG"]
