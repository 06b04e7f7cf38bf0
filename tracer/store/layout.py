"""On-disk layout of a trace: format version, key columns, chunk sizes, codecs, the sequence table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from specdiff.tracer.store.arrays import STORAGE_DTYPES

FORMAT_VERSION = 1
KEY_COLUMNS = (("seq", "int32"), ("pos", "int32"), ("depth", "int16"), ("iter", "int32"))
#: the sequence table written at close (sequence s = tokens[offsets[s]:offsets[s+1]], its seq key id[s])
SEQUENCE_ARRAYS = (("id", "int32"), ("tokens", "int32"), ("offsets", "int64"), ("prompt_len", "int32"))
CHUNK_BYTES = 4 << 20
COMMIT_CHUNKS = 4
# A key chunk spans the data chunks of one commit, so a commit writes whole key chunks: rewriting a
# part-filled one (read, decode, merge, encode, for each of the 4 columns) cost ~1 s per GiB of
# rows, a third of the write (measured with benchmarks/store_throughput.py).
KEY_CHUNK_FACTOR = COMMIT_CHUNKS
MAX_KEY_CHUNK_ROWS = 1 << 16  # edge chunks are stored whole: keep them small
SIDES = ("serve", "train")
# Chunks equal to the fill value must still be written: a missing chunk means a damaged store.
ARRAY_CONFIG = {"write_empty_chunks": True}


def compressors(dtype: np.dtype):
    """The chunk codecs of a tensor array of ``dtype``: blosc lz4 then a crc32c checksum."""
    # lz4 at level 1: hidden states barely compress, so speed beats ratio (benchmarks/store_throughput.py).
    # crc32c (zarr v3 codec) over the compressed bytes: a changed or cut chunk reads as damage, not
    # as a blosc error or, worse, as silently different values.
    shuffle = "bitshuffle" if dtype.itemsize <= 2 else "shuffle"
    return [BloscCodec(cname="lz4", clevel=1, shuffle=shuffle, typesize=dtype.itemsize), Crc32cCodec()]


#: storage dtype names of float tensors, whose data arrays are stored raw (``data_codecs``)
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")


def data_codecs(dtype_name: str):
    """The chunk codecs of a tensor's ``data`` array, by its storage dtype name (tracer.store.arrays).

    Float tensors (hidden states, logits) are stored raw with a crc32c checksum: bitshuffle-lz4
    shrank bf16 hidden states to ~0.8 of their size but encoded at ~0.4 GB/s and decoded at
    ~1.3 GB/s on 2 cores, slower than the disk (benchmarks/store_throughput.py), and
    the writer moves full spill files in as raw chunks (journal.py). Ints and bools (token ids, topk
    indices, accept flags) compress well: blosc, as ``compressors``. Traces written with blosc
    float chunks (before this) read the same: zarr takes each array's codecs from its metadata.
    """
    if dtype_name in FLOAT_DTYPES:
        return [Crc32cCodec()]
    return compressors(STORAGE_DTYPES[dtype_name])


@dataclass
class Sequence:
    """One token sequence of a trace.

    Attributes:
        id: the ``seq`` key of its rows.
        tokens: int32 [len] prompt + generated (serving) or the replayed sequence (training).
        prompt_len: tokens that came from the prompt.
        rid: the serving request id, or a training sample id.
    """

    id: int
    tokens: np.ndarray
    prompt_len: int
    rid: str | None


def consolidate(store) -> None:
    """Write the group's consolidated metadata (every array's ``zarr.json`` in the root one), so
    zarr and xarray open a closed trace with one read, list no directory (object stores), and never
    meet the journal or spill files that listing finds. zarr 3.1 warns that consolidated metadata
    is not yet in the v3 spec (zarr/api/asynchronous.py consolidate_metadata): it is zarr-python's
    own format, which xarray reads first, so that warning is silenced here, as is zarr's note on
    the journal it meets while listing."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        # consolidating lists the group, which finds the journal (not zarr's, and meant to be there)
        warnings.filterwarnings("ignore", message="Object at .* is not recognized as a component")
        zarr.consolidate_metadata(store)


def local_path(path: str) -> str:
    """``file://`` URLs as plain paths: zarr's LocalStore creates parent directories where
    fsspec's local filesystem, by default, does not (so a ``file://`` trace could not be written)."""
    return path[len("file://"):] if path.startswith("file://") else path



def open_store(path: str):
    if "://" in path:
        return zarr.storage.FsspecStore.from_url(path, read_only=True)
    return zarr.storage.LocalStore(path, read_only=True)


