"""A single-producer single-consumer record ring in shared memory, carrying pickled items whose
tensors travel as raw bytes (the serving process's recorder -> its writer process).

Layout: a 64-byte header (``write_pos``, ``read_pos``: byte counters that only grow; ``written``:
items the consumer handled; ``busy_ns``: its time handling them; ``failed``: 1 once the consumer
stopped on an error), then the data area. A record is 64-byte aligned: a 64-byte head (u32 total
length, u32 metadata length, u32 the metadata's offset in the record, f64 the producer's
``time.time()`` at the put), each tensor's bytes at a
64-byte aligned offset, then the pickled metadata (tensors replaced by (offset, dtype, shape) ids).
A record that would straddle the end leaves a wrap marker (length 0xFFFFFFFF) and starts at offset
0. The producer publishes a record by advancing ``write_pos`` after its bytes are in place (x86
keeps stores in order; the consumer reads ``write_pos`` before the record), and never waits: a
record that does not fit is refused.

Staging (copy once): the producer may copy tensors straight into the record it is building for an
owner (``stage``: the serving recorder's host copies, tracer/engines/recorder.py ``snap``) before
the record's metadata exists; ``put(obj, owner=...)`` then writes only the metadata and the
tensors not staged, and publishes. Staged bytes lie past ``write_pos``, where the consumer never
reads; a ``put`` that writes a record (or a ``stage`` for another owner) ends the staging, and a
later ``put`` of an object that still holds tensors in the ring is refused, so bytes that may have
been reused are never published.

The ring is an mmap of a file in /dev/shm that the consumer unlinks once it has mapped it, so a
killed server leaves nothing behind.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import time

import torch

HEADER = 64
ALIGN = 64
_WRAP = 0xFFFFFFFF
_POS = struct.Struct("<QQQQQ")  # write_pos, read_pos, written, busy_ns, failed
#: total, metadata length, metadata offset, the producer's ``time.time()`` at the put (in the
#: record's 64-byte head)
_REC = struct.Struct("<IIId")


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def ring_dir() -> str:
    """Where ring files go: /dev/shm (memory) when present, else the temp directory."""
    import tempfile

    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


#: torch dtype -> its name in a record (``_from_ring`` reads it back with ``getattr(torch, name)``)
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


class _Stale(Exception):
    """A tensor of the object lies in the ring outside the record being staged for it."""


class _Pickler(pickle.Pickler):
    """Pickles tensors as (offset, dtype, shape) and collects the bytes of those to copy. Through
    ``dispatch_table``, not ``persistent_id``: the latter is a Python call for every object of a
    capture (~10x the tensors), measured at 3/4 of ``put``'s time.

    ``ring``: the mapped ring's address range; ``staged``: the address range of the bytes staged
    for this object (their offsets are where they lie; nothing is copied); ``off``: where the
    tensors to copy start (after the staged bytes)."""

    def __init__(self, f, tensors: list, *, off: int, ring: tuple[int, int], staged: tuple[int, int]):
        super().__init__(f, protocol=5)
        self.tensors = tensors
        self.off = off
        self.ring, self.staged = ring, staged
        self.dispatch_table = {torch.Tensor: self._reduce_tensor}

    def _reduce_tensor(self, obj):
        # staged tensors (most of a CPU capture) first, touching only what their id needs
        p = obj.data_ptr()
        dtype = _DTYPE_NAMES.get(obj.dtype) or str(obj.dtype).removeprefix("torch.")
        if self.ring[0] <= p < self.ring[1] and obj.numel() and obj.is_contiguous():
            if not (self.staged[0] <= p and p + obj.numel() * obj.element_size() <= self.staged[1]):
                raise _Stale
            return _from_ring, (p - self.staged[0], dtype, tuple(obj.shape))
        t = obj.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.numel() * t.element_size()
        self.tensors.append((self.off, n, t))
        args = (self.off, dtype, tuple(t.shape))
        self.off = _up(self.off + n)
        return _from_ring, args


#: (the ring, the record's data offset in it) while a record is unpickled (one consumer thread)
_reading: tuple[Ring, int] | None = None
#: a record's dtype name -> torch dtype
_DTYPES = {name: d for d, name in _DTYPE_NAMES.items()}


def _from_ring(off: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A view of a tensor's bytes in the ring record being read (``Ring.get``)."""
    ring, base = _reading
    dt = _DTYPES.get(dtype) or getattr(torch, dtype)
    if 0 in shape:
        return torch.empty(shape, dtype=dt)
    return ring.view_as(base + off, dt, shape)


class Ring:
    """One side of the ring at ``path`` (``create``: the producer makes a file of ``size`` bytes).

    Raises:
        OSError: the file cannot be made or mapped.
    """

    def __init__(self, path: str, size: int | None = None, *, create: bool = False):
        self.path = path
        if create:
            size = _up(int(size))
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
                os.posix_fallocate(fd, 0, size)  # a full /dev/shm fails here, not with SIGBUS later
            except BaseException:
                os.close(fd)
                os.unlink(path)
                raise
        else:
            fd = os.open(path, os.O_RDWR)
            size = os.fstat(fd).st_size
        try:
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size
        self.cap = size - HEADER
        self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)
        self._stage: list | None = None  # [owner, stream position of its record, bytes staged]
        self._typed: dict[torch.dtype, torch.Tensor] = {}  # the ring viewed as each dtype staged
        self._staged_ever = False
        self.put_at = 0.0  # consumer: when the record ``get`` returned last was put

    # -- header --
    def _get(self, i: int) -> int:
        return struct.unpack_from("<Q", self.mm, 8 * i)[0]

    def _set(self, i: int, v: int) -> None:
        struct.pack_into("<Q", self.mm, 8 * i, v)

    @property
    def written(self) -> int:
        return self._get(2)

    @property
    def busy_s(self) -> float:
        return self._get(3) / 1e9

    @property
    def failed(self) -> bool:
        return bool(self._get(4))

    def used(self) -> int:
        return self._get(0) - self._get(1)

    # -- producer --
    @property
    def staging(self) -> bool:
        """A record is being staged (``stage``) and not yet put."""
        return self._stage is not None

    def staging_for(self, owner) -> bool:
        return self._stage is not None and self._stage[0] is owner

    def abandon_stage(self) -> None:
        """Forget the record being staged (its owner's later ``put`` is refused)."""
        self._stage = None

    def stage(self, nbytes: int, owner, dtype: torch.dtype | None = None,
              shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
        """``nbytes`` (> 0) of the ring in the record being built for ``owner`` (one is started when
        ``owner`` has none: staging for another owner ends), or None when the ring has no room
        there now. A uint8 tensor; with ``dtype`` and ``shape`` (``nbytes`` = their size) a
        contiguous tensor of them, made in one ``as_strided`` of the ring's view as ``dtype``
        (the serving thread stages ~50 tensors an iteration: a uint8 slice and two views cost twice
        as much). Valid until the record is put, or staging ends."""
        st = self._stage
        if st is None or st[0] is not owner:
            w = self._get(0)
            pos = w % self.cap
            # near the end the record starts at 0 (the wrap marker is written when it is put)
            s0 = w if self.cap - pos >= self.cap // 4 else w + self.cap - pos
            st = self._stage = [owner, s0, 0]
        self._staged_ever = True
        off = st[2]
        end = ALIGN + off + nbytes
        if off == 0 and st[1] % self.cap and st[1] % self.cap + end > self.cap:
            st[1] += self.cap - st[1] % self.cap  # a first tensor that fits only from 0 starts the record there
        if st[1] % self.cap + end > self.cap or st[1] + end > self._get(1) + self.cap:
            return None
        st[2] = _up(off + nbytes)
        at = HEADER + st[1] % self.cap + ALIGN + off
        if dtype is None or shape is None:
            return self.u8[at:at + nbytes]
        return self.view_as(at, dtype, shape)

    def view_as(self, at: int, dtype: torch.dtype, shape) -> torch.Tensor:
        """A contiguous ``dtype`` tensor of ``shape`` over the ring's bytes from ``at`` (a multiple
        of the dtype's size: records and their tensors are 64-byte aligned), made in one
        ``as_strided`` of the ring viewed as ``dtype``: ~50 tensors an iteration are staged on the
        serving thread and read back in the writer, and a uint8 slice plus two views cost twice as
        much (measured)."""
        base = self._typed.get(dtype)
        if base is None:
            base = self._typed[dtype] = self.u8[:self.size // dtype.itemsize * dtype.itemsize].view(dtype)
        stride, acc = [], 1
        for d in reversed(shape):
            stride.append(acc)
            acc *= d
        return base.as_strided(shape, stride[::-1], at // dtype.itemsize)

    def put(self, obj, *, owner=None) -> bool:
        """Copy ``obj`` (its tensors as raw bytes; those staged for ``owner`` stay where they are)
        into the ring; False when it does not fit now, or holds ring bytes not staged for it."""
        st = self._stage if owner is not None and self.staging_for(owner) else None
        if st is not None:  # whatever comes of this put, the staged bytes are the owner's no more
            self._stage = None
            if st[2] == 0:  # nothing was staged after all: an ordinary put, which may wrap
                st = None
        w, r = self._get(0), self._get(1)
        base = self.u8.data_ptr()
        s0, used = (st[1], st[2]) if st is not None else (w, 0)
        data = base + HEADER + s0 % self.cap + ALIGN  # where the record's tensor bytes start
        tensors: list = []
        buf = io.BytesIO()
        try:
            _Pickler(buf, tensors, off=used, ring=(base, base + self.size), staged=(data, data + used)).dump(obj)
        except _Stale:
            return False
        meta = buf.getbuffer()
        moff = ALIGN + _up(tensors[-1][0] + tensors[-1][1] if tensors else used)
        total = _up(moff + len(meta))
        if s0 % self.cap and s0 % self.cap + total > self.cap:  # wrap: the tail is skipped
            wrapped = s0 + self.cap - s0 % self.cap
            if st is not None and used:
                if wrapped + total > r + self.cap:
                    return False  # no room from 0 either (and the bytes there are not free to move into)
                # the staged bytes sit in a tail too short for the whole record: they move with it to 0
                src = HEADER + s0 % self.cap + ALIGN
                self.u8[HEADER + ALIGN:HEADER + ALIGN + used].copy_(self.u8[src:src + used].clone())
            s0 = wrapped
        pos = s0 % self.cap
        if pos + total > self.cap or s0 + total > r + self.cap:
            return False
        if s0 != w:
            _REC.pack_into(self.mm, HEADER + w % self.cap, _WRAP, 0, 0, 0.0)
        at = HEADER + pos
        _REC.pack_into(self.mm, at, total, len(meta), moff, time.time())
        self.mm[at + moff:at + moff + len(meta)] = meta
        for off, n, t in tensors:
            if n:
                self.u8[at + ALIGN + off:at + ALIGN + off + n].copy_(t.reshape(-1).view(torch.uint8))
        self._stage = None  # a record written over what was staged for another owner ends that
        self._set(0, s0 + total)
        return True

    # -- consumer --
    def get(self):
        """The next record as (object, its length), or None when the ring is empty. The object's
        tensors are views of the ring: valid until ``release(length)``. ``put_at`` is then the
        producer's ``time.time()`` when it put that record (records come in the order put)."""
        while True:
            w, r = self._get(0), self._get(1)
            if r == w:
                return None
            pos = r % self.cap
            total, mlen, moff, put_at = _REC.unpack_from(self.mm, HEADER + pos)
            if total == _WRAP:
                self._set(1, r + self.cap - pos)
                continue
            at = HEADER + pos
            meta = self.mm[at + moff:at + moff + mlen]
            global _reading
            _reading = (self, at + ALIGN)
            try:
                obj = pickle.loads(meta)
            finally:
                _reading = None
            self.put_at = put_at
            return obj, total

    def release(self, total: int, busy_ns: int = 0) -> None:
        """Free the oldest record (``total`` bytes) and count it handled."""
        self._set(2, self._get(2) + 1)
        self._set(3, self._get(3) + busy_ns)
        self._set(1, self._get(1) + total)

    def mark_failed(self) -> None:
        self._set(4, 1)

    def close(self) -> None:
        """Unmap the ring, unless a producer staged into it: its captures may still hold tensors
        viewing the ring (``stage``), and torch views do not keep an mmap from closing (reading one
        after ``munmap`` kills the process); that mapping goes with the process."""
        if self._staged_ever:
            return
        try:
            self._typed.clear()
            del self.u8
            self.mm.close()
        except (BufferError, AttributeError):  # a memoryview still alive: the mapping goes with the process
            pass
