"""Read back what a trace holds: committed rows from zarr, the uncommitted tail from the journal and
its spill files (an unclosed or crashed trace), and every damaged part found on the way."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import fsspec
import numpy as np
import zarr

from specdiff.tracer.contract import validate_contract
from specdiff.tracer.errors import TraceError
from specdiff.tracer.store.arrays import STORAGE_DTYPES
from specdiff.tracer.store.chunks import chunk_key, crc32c_holds, metadata_problem, stored_raw
from specdiff.tracer.store.chunks import join as _join
from specdiff.tracer.store.damage import Damage
from specdiff.tracer.store.journal import (
    COMMIT_SPILL_PAYLOAD,
    SPILL_PAYLOAD,
    read_spill,
    spill_key,
)
from specdiff.tracer.store.layout import KEY_COLUMNS, SEQUENCE_ARRAYS, Sequence, open_store


@dataclass
class Contents:
    """What a trace holds, read from its journal or (damaged journal, closed trace) its zarr metadata."""

    format: int
    side: str
    contract: dict
    sequences: list[Sequence]
    records: int
    closed: bool
    committed: dict[str, int]
    layout: dict[str, tuple[str, tuple[int, ...]]]
    tail: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]
    cut_tail_bytes: int = 0


class JournalReplay:
    """Contents built from journal entries fed in order, once each: ``from_journal`` feeds a whole
    journal; ``reader.TraceFollower`` feeds a growing one a poll at a time, so a live trace is not
    decoded again from its start at every poll. Records a commit covers are dropped as it comes
    (only the uncommitted tail is read back), so what it keeps is bounded by the tail, not the trace.

    Raises:
        TraceError: the header names a payload this specdiff does not know; a contract entry does
            not validate (``feed``); rows neither committed nor journalled (``contents``).
    """

    def __init__(self, path: str, header: dict):
        self.path, self.header = path, header
        self.payload = header.get("payload")
        if self.payload not in (None, SPILL_PAYLOAD, COMMIT_SPILL_PAYLOAD):
            raise TraceError(f"{path}: its journal keeps record payloads as {self.payload!r}, which this specdiff does "
                             "not know (a newer version wrote it); upgrade specdiff to read this unclosed trace")
        self.contract: dict = {}
        self.seqs: dict[int, Sequence] = {}
        self.committed: dict[str, int] = {}
        self.spills: dict[str, tuple[int, int]] = {}  # name -> (spill generation, its first row)
        self.recs: dict[str, list[dict]] = defaultdict(list)  # records not yet wholly committed
        self.first_rec: dict[str, dict] = {}  # name -> its first record's dtype, shape, chunk rows
        self.closed, self.records = False, 0
        self.progress: dict = {}  # the writer's last "progress" entry, as a contract fact (unclosed only)
        self._keys_cache: dict[str, tuple[int, int, dict[str, np.ndarray]]] = {}  # name -> (done, records, keys)

    def feed(self, entries) -> JournalReplay:
        """Take journal entries (after the header), in journal order, each once; returns self."""
        for e in entries:
            t = e.get("t")
            if t == "rec":
                self.recs[e["name"]].append(e)
                if e["name"] not in self.first_rec:  # what every record of a tensor states alike
                    self.first_rec[e["name"]] = {k: e[k] for k in ("dtype", "shape", "chunk_rows") if k in e}
                self.records += 1
            elif t == "commit":
                name, rows = e["name"], e["rows"]
                self.committed[name] = rows
                if "spill" in e:
                    self.spills[name] = (e["spill"], rows)
                self.recs[name] = [r for r in self.recs[name] if r["row0"] + r["n"] > rows]
            elif t == "seq":
                self.seqs[e["id"]] = Sequence(e["id"], np.frombuffer(e["tokens"], np.int32), e["prompt_len"], e["rid"])
            elif t == "contract":
                self.contract = validate_contract(e["contract"], where=self.path)
            elif t == "close":
                self.closed = True
            elif t == "progress":
                self.progress = {"recorder_caught_up_at": e.get("caught_up_at")}
        return self

    def contents(self, *, cut_tail_bytes: int,
                 zarr_rows: dict[str, tuple[str, tuple[int, ...], int]] | None = None) -> Contents:
        """Contents as fed so far; the uncommitted rows are read from spill files or moved chunks.
        ``zarr_rows``: see ``from_journal``."""
        path, payload = self.path, self.payload
        committed = dict(self.committed)
        layout: dict[str, tuple[str, tuple[int, ...]]] = {}
        for name, (dtype, shape, rows) in (zarr_rows or {}).items():
            layout[name] = (dtype, shape)
            committed[name] = max(committed.get(name, 0), rows)
        tail: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        for name, first in self.first_rec.items():
            layout.setdefault(name, (first["dtype"], tuple(first["shape"][1:])))
            done = committed.get(name, 0)
            # A commit can end inside a record (commits are whole chunks): keep that record's later rows.
            pending = [e for e in self.recs[name] if e["row0"] + e["n"] > done]
            if not pending:
                continue
            keys = self._tail_keys(name, first, pending, done)
            dt = STORAGE_DTYPES[first["dtype"]]
            stop, shape, lost_ok = pending[-1]["row0"] + pending[-1]["n"], layout[name][1], zarr_rows is not None
            if payload == SPILL_PAYLOAD:
                data = chunk_spilled_rows(path, name, chunk_rows=first["chunk_rows"], start=done, stop=stop, dtype=dt,
                                          shape=shape, lost_ok=lost_ok)
                keys = {c: v[:len(data)] for c, v in keys.items()}
            elif payload == COMMIT_SPILL_PAYLOAD:
                gen, base = self.spills.get(name, (0, 0))
                data = spilled_rows(path, name, gen=gen, base=base, start=done, stop=stop, dtype=dt, shape=shape,
                                    lost_ok=lost_ok)
                keys = {c: v[:len(data)] for c, v in keys.items()}
            else:
                data = np.concatenate([np.frombuffer(e["data"], dt).reshape(e["shape"])[max(done - e["row0"], 0):]
                                       for e in pending])
            tail[name] = (data, keys)
        contract = {**self.contract, **self.progress} if self.progress and not self.closed else self.contract
        return Contents(self.header["format"], self.header["side"], contract,
                        [self.seqs[i] for i in sorted(self.seqs)], self.records, self.closed, committed, layout, tail,
                        cut_tail_bytes)


    def _tail_keys(self, name: str, first: dict, pending: list[dict], done: int) -> dict[str, np.ndarray]:
        """The key columns of ``pending`` (records past row ``done``), from row ``done`` on. Kept
        between calls: a follower's next call decodes only the records added since, until a commit
        moves ``done``."""
        cached = self._keys_cache.get(name)
        if cached is not None and cached[0] == done and cached[1] <= len(pending):
            start, base = cached[1], cached[2]
        else:
            start, base = 0, None
        new = pending[start:]
        if (any(c not in e for e in new for c, _ in KEY_COLUMNS)
                or (not self.payload and any("data" not in e for e in new))
                or (self.payload == SPILL_PAYLOAD and "chunk_rows" not in first)):
            raise TraceError(f"{self.path}: rows of {name} from {done} on are neither committed nor in the "
                             "journal; the store is damaged (copy it again)")
        straddle = [e for e in new if e["row0"] < done]  # only the first records can start before row done
        whole = new[len(straddle):]
        keys = {c: np.concatenate(([base[c]] if base is not None else [])
                                  + [np.frombuffer(e[c], kd)[done - e["row0"]:] for e in straddle]
                                  + [np.frombuffer(b"".join([e[c] for e in whole]), kd)])  # one decode, not one a record
                for c, kd in KEY_COLUMNS}
        self._keys_cache[name] = (done, len(pending), keys)
        return {c: v.copy() for c, v in keys.items()}  # the caller's to cut and change


def from_journal(path: str, entries: list[dict], *, cut_tail_bytes: int,
                 zarr_rows: dict[str, tuple[str, tuple[int, ...], int]] | None = None) -> Contents:
    """Contents from journal entries. ``zarr_rows`` (name -> dtype, shape, rows in zarr) is given
    when the journal lost entries: rows zarr holds count as committed even without their entry."""
    return JournalReplay(path, entries[0]).feed(entries[1:]).contents(cut_tail_bytes=cut_tail_bytes,
                                                                      zarr_rows=zarr_rows)


def spilled_rows(path: str, name: str, *, gen: int, base: int, start: int, stop: int, dtype: np.dtype,
                 shape: tuple[int, ...], lost_ok: bool, raw: bytes | None = None, key: str | None = None,
                 missing: str | None = None) -> np.ndarray:
    """Rows [start, stop) of ``name`` from its spill file of generation ``gen`` (whose first row is
    ``base``; ``raw``/``key``: its bytes and name, when read already; ``missing``: what the error
    says of an absent file, "is missing" by default): [rows, *shape] of
    ``dtype``; fewer rows only with ``lost_ok`` (the journal is damaged and already reported as
    losing uncommitted records).

    Raises:
        TraceError: the file is missing or shorter than the journal says (the store was damaged
            after the writer wrote it: a spill write always precedes its ``rec`` entry).
    """
    if key is None:
        key = spill_key(name, gen)
        raw = read_spill(_join(path, key))
    elems = int(np.prod(shape, dtype=np.int64))
    row_bytes = dtype.itemsize * elems
    held = stop if not row_bytes else base + len(raw or b"") // row_bytes
    if held < stop and not lost_ok:
        what = (missing or "is missing") if raw is None else f"holds {max(held - start, 0)} of them"
        raise TraceError(f"{path}: rows {start}-{stop - 1} of {name} were journalled but not committed, and {key} "
                         f"{what}; the store is damaged (copy it again from where it was recorded)")
    stop = min(stop, held)
    if stop <= start:
        return np.empty((0, *shape), dtype)
    return np.frombuffer(raw or b"", dtype, count=(stop - base) * elems).reshape(stop - base, *shape)[start - base:]


def chunk_spilled_rows(path: str, name: str, *, chunk_rows: int, start: int, stop: int, dtype: np.dtype,
                       shape: tuple[int, ...], lost_ok: bool) -> np.ndarray:
    """Rows [start, stop) of ``name`` from its per-chunk spill files (journal.py, payload
    ``"chunks"``): generation g holds rows [g * chunk_rows, (g + 1) * chunk_rows); a full raw
    chunk's file may have been moved to its zarr key already, and is read there (crc checked).
    [rows, *shape] of ``dtype``; fewer rows only with ``lost_ok``.

    Raises:
        TraceError: a chunk's rows are in neither place, or fewer than the journal says.
    """
    parts, row = [], start
    while row < stop:
        gen = row // chunk_rows
        base, end = gen * chunk_rows, min(stop, (gen + 1) * chunk_rows)
        key = spill_key(name, gen)
        raw = read_spill(_join(path, key))
        if raw is None:
            raw, problem = _moved_chunk(path, name, gen)
        part = spilled_rows(path, name, gen=gen, base=base, start=row, stop=end, dtype=dtype, shape=shape,
                            lost_ok=lost_ok, raw=raw, key=key,
                            missing=f"is missing and {problem}" if raw is None and problem else None)
        parts.append(part)
        if row + len(part) < end:  # lost_ok: nothing after a lost row is kept
            break
        row = end
    return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.empty((0, *shape), dtype)


def _moved_chunk(path: str, name: str, gen: int) -> tuple[bytes | None, str | None]:
    """(the rows' bytes, None) of chunk ``gen`` of ``name``'s data array when it is a raw chunk
    whose crc32c holds (a full spill file moved in, not yet committed); else (None, what is wrong
    with that chunk, as the end of a sentence naming it), or (None, None) for an array that never
    takes moved chunks (blosc, or unreadable metadata)."""
    try:
        arr = zarr.open_array(store=open_store(path), path=f"tensors/{name}/data", mode="r")
    except Exception:  # zarr raises many types for bad metadata; then there is no moved chunk to read
        return None, None
    if not stored_raw(arr):
        return None, None
    key = chunk_key(arr, f"tensors/{name}/data", gen)
    raw = read_spill(_join(path, key))
    if raw is None:
        return None, f"so is its moved chunk {key}"
    if len(raw) < 4 or not crc32c_holds(raw[:-4], raw[-4:]):
        return None, f"its moved chunk {key} fails its crc32c checksum"
    return raw[:-4], None


def zarr_tensors(path: str, store) -> tuple[dict[str, tuple[str, tuple[int, ...], int]], list[Damage]]:
    """name -> (dtype, feature shape, rows) of every tensor whose ``data`` array opens; damage for the rest."""
    fs, root = fsspec.core.url_to_fs(_join(path, "tensors"))
    try:
        names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root, detail=True)
                       if e["type"] == "directory")
    except (FileNotFoundError, NotADirectoryError):
        names = []
    out, damage = {}, []
    for name in names:
        key = f"tensors/{name}/data"
        try:
            arr = zarr.open_array(store=store, path=key, mode="r")
            out[name] = (str(arr.attrs["specdiff_dtype"]), tuple(arr.shape[1:]), arr.shape[0])
        except Exception as exc:  # zarr raises many types for bad metadata
            problem, action = metadata_problem(path, f"{key}/zarr.json", exc)
            damage.append(Damage(path, f"{key}/zarr.json", problem, f"tensor {name} cannot be read", action, name))
    return out, damage


def from_zarr(path: str, store, attrs: dict) -> tuple[Contents, list[Damage]]:
    """Contents of a closed trace from its zarr metadata alone (its journal is damaged)."""
    tensors, damage = zarr_tensors(path, store)
    rids = attrs.get("sequence_rids")
    cols = {k: np.zeros(0, kd) for k, kd in SEQUENCE_ARRAYS}
    cols["offsets"] = np.zeros(1, np.int64)
    if rids is None or len(rids):
        try:
            cols = {k: zarr.open_array(store=store, path=f"sequences/{k}", mode="r")[:] for k, _ in SEQUENCE_ARRAYS}
        except Exception as exc:  # zarr raises many types for bad bytes
            why = ("it has no sequences/id array (written before specdiff stored sequence ids in zarr)"
                   if isinstance(exc, (FileNotFoundError, zarr.errors.ArrayNotFoundError)) else
                   f"its sequence table in zarr cannot be read either ({type(exc).__name__})")
            raise TraceError(f"{path}: record journal is damaged and {why}; the trace cannot be opened "
                             "(copy it again from where it was recorded)") from None
    rids = rids or [None] * len(cols["prompt_len"])
    off = cols["offsets"]
    seqs = [Sequence(int(cols["id"][i]), cols["tokens"][off[i]:off[i + 1]], int(cols["prompt_len"][i]), rids[i])
            for i in range(len(cols["prompt_len"]))]
    meta = attrs["specdiff"]
    contents = Contents(meta["format"], meta["side"], validate_contract(attrs.get("contract", {}), where=path),
                         seqs, int(attrs.get("records", 0)), True,
                         {n: r for n, (_, _, r) in tensors.items()},
                         {n: (d, s) for n, (d, s, _) in tensors.items()}, {})
    return contents, damage


