"""The specdiff trace store: a zarr v3 group plus an append-only msgpack journal.

Layout (traces/FORMAT.md has the full description)::

    <trace>/zarr.json                      group; attrs: specdiff {format, side}, contract, closed
    <trace>/journal.msgpack                write-ahead record journal (tracer.store.journal)
    <trace>/tensors/<name>/data            [row, *dims]  the tensor rows: floats raw + crc32c, others blosc
    <trace>/tensors/<name>/{seq,pos,depth,iter}  [row] int32/int16 row keys (schema.py)
    <trace>/sequences/{id,tokens,offsets,prompt_len}  written at close, for plain-zarr readers

``TraceWriter.append`` writes the record at once (its bytes to the spill files of their chunks,
then its keys to the journal, so a SIGKILL loses nothing already appended). A full float chunk's
spill file, its crc32c appended, is moved to the chunk's zarr key, so the trace's bytes reach the
disk once; every four chunks a ``commit`` (on a writer thread) grows the arrays, writes the key
columns (and blosc rows) and is journalled (tracer.store.journal). ``open_trace`` reads committed rows
from zarr and the uncommitted tail, chunk by chunk, from spill files or moved chunks.

Modules: ``layout`` (format constants, codecs, ``Sequence``), ``writer`` (``TraceWriter``),
``base`` (``TraceReader``: the read API ``Trace`` and ``ranks.RankedTrace`` share),
``reader`` (``open_trace`` -> ``Trace``; ``TraceFollower`` for a trace still being written), ``recover`` (rows of an unclosed trace from the journal
and its spill files; damage found while reading).
"""

from specdiff.tracer.store.arrays import STORAGE_DTYPES
from specdiff.tracer.store.base import TensorInfo, TraceReader
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
from specdiff.tracer.store.reader import Trace, TraceFollower, damaged_fill, open_trace
from specdiff.tracer.store.writer import TraceWriter

__all__ = ["STORAGE_DTYPES", "CHUNK_BYTES", "FORMAT_VERSION", "KEY_COLUMNS", "SEQUENCE_ARRAYS", "SIDES", "Sequence",
           "TensorInfo", "Trace", "TraceFollower", "TraceReader", "TraceWriter", "damaged_fill", "local_path", "open_trace", "ARRAY_CONFIG"]
