"""Tensor <-> storage conversion without precision loss and without host syncs in the caller.

bf16 has no numpy dtype of its own: specdiff holds it as its raw 16 bits (``uint16``) in memory,
and ``from_storage`` restores it (torch) or upcasts exactly to float32 (numpy). On disk its zarr
arrays declare the ``bfloat16`` data type (zarr-extensions' name for it, data-types/bfloat16), read
through ``BFloat16`` below (ml_dtypes' numpy bfloat16, registered in zarr's data type registry on
import), so zarr and xarray users get real bfloat16 arrays. (pyproject.toml declares ``BFloat16`` in
the ``zarr.data_type`` entry-point group, but zarr 3.1.6 collects those entry points and never loads
them: ``_lazy_load`` in zarr/core/dtype/registry.py:45 has no caller, on zarr's main too; so the
install's ``specdiff_zarr_hook.pth`` imports this module right after zarr loads, and a plain
``xarray.open_datatree`` needs no specdiff import: specdiff_zarr_hook.py,
tests/tracer/store/test_trace_plain_readers.py.) Traces written before declared ``uint16`` with the zarr attribute ``specdiff_dtype`` =
``"bfloat16"``; they read the same (``specdiff upgrade`` rewrites their metadata). fp16, fp32,
int and bool are stored natively.

ml_dtypes is imported only when a bf16 value crosses zarr (``bf16()``): its C extension registers
ufunc loops for every type it adds, 1.2 s of CPU with numpy 2.3 and ml_dtypes 0.7 (numpy's
``PyUFunc_AddLoop`` scans each ufunc's loop list), which was most of ``specdiff info``'s start-up;
opening a trace reads only metadata and, for bf16 tensors, chunk bytes as ``uint16``
(benchmarks/cli_startup.py, tests/tui/test_cli_startup.py).
"""

from __future__ import annotations

import functools
from abc import ABCMeta
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from zarr.core.dtype.common import DataTypeValidationError
from zarr.core.dtype.npy.float import BaseFloat
from zarr.dtype import data_type_registry


@functools.cache
def bf16() -> np.dtype:
    """ml_dtypes' numpy bfloat16 (same 16 bits as torch.bfloat16: sign, 8 exponent, 7 mantissa),
    imported on the first call (module docstring: it costs seconds)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _is_bf16(dtype) -> bool:
    """``dtype`` is a numpy bfloat16, checked without importing ml_dtypes when it is not: none can
    exist before ml_dtypes is imported, and its name says which it is."""
    return getattr(dtype, "name", None) == "bfloat16" and type(dtype) is type(bf16())


class _LazyDtypeCls(ABCMeta):
    """``BFloat16.dtype_cls`` (zarr's ``ZDType`` class attribute) resolved on access, not at import."""

    @property
    def dtype_cls(cls) -> type:
        return type(bf16())


@dataclass(frozen=True, kw_only=True)
class BFloat16(BaseFloat, metaclass=_LazyDtypeCls):
    """zarr v3 data type ``"bfloat16"`` (zarr-extensions data-types/bfloat16) as ml_dtypes'
    bfloat16 numpy dtype; chunks hold 2-byte little-endian values (``bytes`` codec), bit for bit
    the ``uint16`` raw bits older traces declared. Pattern: zarr-python 3.1's custom data type
    example (docs user-guide/examples/custom_dtype) over its own ``BaseFloat``.

    Its scalars (fill values) are numpy ``float32`` holding the value rounded to bf16 (every bf16
    value is a float32 value), so parsing an array's metadata needs no ml_dtypes; the array's
    values are ml_dtypes bfloat16 as before."""

    _zarr_v3_name: ClassVar[str] = "bfloat16"
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ("bfloat16",)

    @property
    def dtype_cls(self) -> type:  # instances: the metaclass property serves the class only
        return type(bf16())

    @property
    def item_size(self) -> int:
        return 2

    @classmethod
    def _check_native_dtype(cls, dtype) -> bool:
        return _is_bf16(dtype)

    @classmethod
    def from_native_dtype(cls, dtype) -> BFloat16:
        # zarr's registry asks every registered type about every dtype an array is created with;
        # BaseFloat's refusal names ``dtype_cls``, which would import ml_dtypes for a float32 array
        if cls._check_native_dtype(dtype):
            return cls(endianness="big" if dtype.byteorder == ">" else "little")
        raise DataTypeValidationError(f"Invalid data type: {dtype}. Expected a numpy bfloat16 (ml_dtypes)")

    def to_native_dtype(self) -> np.dtype:
        return bf16().newbyteorder("<" if self.endianness == "little" else ">")

    def _cast_scalar_unchecked(self, data) -> np.float32:
        value = np.float64(data)
        single = np.float32(value)
        if np.isnan(single) or (single == value and not int(single.view(np.uint32)) & 0xFFFF):
            return single  # a bf16 value already (NaN: any NaN stores as bf16 NaN)
        return np.float32(bf16().type(value))  # round to nearest even in bf16, as ml_dtypes casts


data_type_registry.register(BFloat16._zarr_v3_name, BFloat16)

STORAGE_DTYPES = {
    "bfloat16": np.dtype("uint16"),
    "float16": np.dtype("float16"),
    "float32": np.dtype("float32"),
    "float64": np.dtype("float64"),
    "int64": np.dtype("int64"),
    "int32": np.dtype("int32"),
    "bool": np.dtype("bool"),
}


#: storage dtype name -> the data type its zarr array declares (bf16: zarr's ``BFloat16``, not its
#: uint16 bits; an instance, so creating the array needs no ml_dtypes)
ZARR_DTYPES = {**STORAGE_DTYPES, "bfloat16": BFloat16(endianness="little")}


def as_stored(arr: np.ndarray, dtype_name: str) -> np.ndarray:
    """Storage array (bf16 as uint16 bits) as the dtype its zarr array declares (a view, no copy)."""
    return arr.view(bf16()) if dtype_name == "bfloat16" else arr


def as_storage(arr: np.ndarray, storage: np.dtype) -> np.ndarray:
    """What zarr returned (maybe bfloat16, ``bf16()``) as the storage dtype ``storage`` (a view, no copy)."""
    return arr.view(storage) if arr.dtype != storage and _is_bf16(arr.dtype) else arr


def to_storage(data) -> tuple[np.ndarray, str]:
    """Convert a torch tensor or numpy array (already on the host) to (storage array, dtype name).

    The returned array shares memory with ``data`` where possible. bf16 -> uint16 bit pattern.

    Raises:
        TypeError: a dtype the trace format does not store (complex, object, ...).
    """
    if hasattr(data, "detach"):  # torch.Tensor
        import torch

        t = data.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(np.uint16), "bfloat16"
        arr = t.contiguous().numpy()
    else:
        arr = np.asarray(data)
    name = arr.dtype.name
    if name not in STORAGE_DTYPES or name == "bfloat16":
        raise TypeError(f"cannot store dtype {arr.dtype} in a trace (use float/int/bool)")
    return np.ascontiguousarray(arr), name


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Exact upcast of bf16 raw bits (uint16) to float32."""
    out = bits.astype(np.uint32)
    out <<= 16  # in place: a second fresh array costs page faults, ~6x the time of the shift
    return out.view(np.float32)


def from_storage(arr: np.ndarray, dtype_name: str, *, as_float32: bool = False) -> np.ndarray:
    """Undo ``to_storage`` on the numpy side.

    Returns bf16 as float32 (exact) always, since numpy has no bf16; other dtypes unchanged
    unless ``as_float32`` asks every float to be float32.
    """
    if dtype_name == "bfloat16":
        return bf16_bits_to_float32(arr)
    if as_float32 and arr.dtype.kind == "f":
        return arr.astype(np.float32, copy=False)
    return arr


def to_torch(arr: np.ndarray, dtype_name: str):
    """Storage array -> torch tensor with the recorded dtype (bf16 restored bit for bit)."""
    import torch

    if dtype_name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))
