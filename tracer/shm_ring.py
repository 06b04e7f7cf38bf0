"""A single-producer single-consumer record ring in shared memory, carrying pickled items whose
tensors travel as raw bytes (the serving process's recorder -> its writer process).

Layout: a 64-byte header (``write_pos``, ``read_pos``: byte counters that only grow; ``written``:
items the consumer handled; ``busy_ns``: its time handling them; ``failed``: 1 once the consumer
stopped on an error), then the data area. A record is 64-byte aligned: u32 total length, u32
metadata length, the pickled metadata (tensors replaced by (offset, dtype, shape) ids), then each
tensor's bytes at a 64-byte aligned offset. A record that would straddle the end leaves a wrap
marker (length 0xFFFFFFFF) and starts at offset 0. The producer publishes a record by advancing
``write_pos`` after its bytes are in place (x86 keeps stores in order; the consumer reads
``write_pos`` before the record), and never waits: a record that does not fit is refused.

The ring is an mmap of a file in /dev/shm that the consumer unlinks once it has mapped it, so a
killed server leaves nothing behind.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct

import torch

HEADER = 64
ALIGN = 64
_WRAP = 0xFFFFFFFF
_POS = struct.Struct("<QQQQQ")  # write_pos, read_pos, written, busy_ns, failed
_REC = struct.Struct("<II")


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def ring_dir() -> str:
    """Where ring files go: /dev/shm (memory) when present, else the temp directory."""
    import tempfile

    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class _Pickler(pickle.Pickler):
    """Pickles tensors as (offset, dtype, shape) and collects their bytes for the ring. Through
    ``dispatch_table``, not ``persistent_id``: the latter is a Python call for every object of a
    capture (~10x the tensors), measured at 3/4 of ``put``'s time."""

    def __init__(self, f, tensors: list):
        super().__init__(f, protocol=5)
        self.tensors = tensors
        self.off = 0
        self.dispatch_table = {torch.Tensor: self._reduce_tensor}

    def _reduce_tensor(self, obj):
        t = obj.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.numel() * t.element_size()
        self.tensors.append((self.off, n, t))
        args = (self.off, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        self.off = _up(self.off + n)
        return _from_ring, args


#: (ring bytes, the record's data offset) while a record is unpickled (one consumer thread)
_reading: tuple[torch.Tensor, int] | None = None


def _from_ring(off: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A view of a tensor's bytes in the ring record being read (``Ring.get``)."""
    ring, base = _reading
    dt = getattr(torch, dtype)
    n = 1
    for d in shape:
        n *= d
    if n == 0:
        return torch.empty(shape, dtype=dt)
    nbytes = n * torch.empty((), dtype=dt).element_size()
    return ring[base + off:base + off + nbytes].view(dt).reshape(shape)


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
    def put(self, obj) -> bool:
        """Copy ``obj`` (its tensors as raw bytes) into the ring; False when it does not fit now."""
        tensors: list = []
        buf = io.BytesIO()
        _Pickler(buf, tensors).dump(obj)
        meta = buf.getbuffer()
        data0 = _up(_REC.size + len(meta))
        total = _up(data0 + (tensors[-1][0] + tensors[-1][1] if tensors else 0))
        w, r = self._get(0), self._get(1)
        free = self.cap - (w - r)
        pos = w % self.cap
        if pos + total > self.cap:  # wrap: the tail is skipped
            if free < (self.cap - pos) + total:
                return False
            _REC.pack_into(self.mm, HEADER + pos, _WRAP, 0)
            w += self.cap - pos
            pos = 0
        elif free < total:
            return False
        at = HEADER + pos
        _REC.pack_into(self.mm, at, total, len(meta))
        self.mm[at + _REC.size:at + _REC.size + len(meta)] = meta
        base = at + data0
        for off, n, t in tensors:
            if n:
                self.u8[base + off:base + off + n].copy_(t.reshape(-1).view(torch.uint8))
        self._set(0, w + total)
        return True

    # -- consumer --
    def get(self):
        """The next record as (object, its length), or None when the ring is empty. The object's
        tensors are views of the ring: valid until ``release(length)``."""
        while True:
            w, r = self._get(0), self._get(1)
            if r == w:
                return None
            pos = r % self.cap
            total, mlen = _REC.unpack_from(self.mm, HEADER + pos)
            if total == _WRAP:
                self._set(1, r + self.cap - pos)
                continue
            at = HEADER + pos
            meta = self.mm[at + _REC.size:at + _REC.size + mlen]
            global _reading
            _reading = (self.u8, at + _up(_REC.size + mlen))
            try:
                obj = pickle.loads(meta)
            finally:
                _reading = None
            return obj, total

    def release(self, total: int, busy_ns: int = 0) -> None:
        """Free the oldest record (``total`` bytes) and count it handled."""
        self._set(2, self._get(2) + 1)
        self._set(3, self._get(3) + busy_ns)
        self._set(1, self._get(1) + total)

    def mark_failed(self) -> None:
        self._set(4, 1)

    def close(self) -> None:
        try:
            del self.u8
            self.mm.close()
        except (BufferError, AttributeError):  # a view still alive: the mapping goes with the process
            pass
