"""The weight facts of a contract, read on the load path: which tensors the checkpoint gave, a cheap
fingerprint of each, the module structure the model was built with, and the parameters the model
built that the checkpoint did not provide (their values left as allocated).

Both sides compute them the same way, by checkpoint tensor name (the names in the checkpoint files,
before an engine fuses or renames them: SGLang's ``qkv_proj`` is the checkpoint's ``q_proj`` /
``k_proj`` / ``v_proj``, transformers 5's fused MoE experts are the checkpoint's per-expert tensors),
so an engine's model and the trainer's can be compared tensor by tensor:

- the serving recorders wrap the engine's weight iterator (``LoadWatch``: SGLang 0.5.23
  ``DefaultModelLoader.load_weights_only``) and fingerprint each ``(name, tensor)`` as it goes by;
- ``record train`` fingerprints the same files it loads (``checkpoint_fingerprints``: a strided
  sample read through a memory map, so a 20 GiB target costs a few thousand page reads).

``tensor_fingerprint`` hashes a strided sample of at most ``SAMPLE`` elements, rounded to bfloat16
(so a bf16 checkpoint held in bf16 or fp32, or an fp32 checkpoint served in bf16, hash alike, as
tracer/contract.py ``weights_fingerprint``). The target's are kept per layer (``weight_unit``:
``model.layers.3`` holds every tensor of decoder layer 3), the draft's per tensor.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

#: elements of a tensor ``tensor_fingerprint`` reads (evenly strided over the flattened tensor)
SAMPLE = 4096
#: hex digits kept of each fingerprint (64 bits: a chance collision is not a concern here)
DIGITS = 16
_LAYER = re.compile(r"^(.*?layers\.\d+)\.")
_ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _digest(head: str, payload: bytes) -> str:
    h = hashlib.sha256(head.encode())
    h.update(payload)
    return h.hexdigest()[:DIGITS]


def _sample_bytes(flat) -> bytes:
    """Bytes of a 1-D torch sample, dtype-independent: floats rounded to bfloat16 (through float32,
    round to nearest even), integers as int64, bools as uint8; little-endian."""
    import torch

    if flat.is_floating_point():
        return flat.float().to(torch.bfloat16).view(torch.int16).cpu().numpy().astype("<i2").tobytes()
    if flat.dtype == torch.bool:
        return flat.to(torch.uint8).cpu().numpy().tobytes()
    return flat.to(torch.int64).cpu().numpy().astype("<i8").tobytes()


def _stride(n: int) -> int:
    return max(1, n // SAMPLE)


def tensor_fingerprint(tensor) -> str:
    """Fingerprint of one tensor (torch, any device / dtype): sha256 of ``"<shape>;"`` and the bytes of
    every ``max(1, n // SAMPLE)``-th element of the flattened tensor (at most ``SAMPLE``), floats as
    bfloat16, cut to ``DIGITS`` hex digits. A non-contiguous tensor is read in its logical order."""
    t = tensor.detach()
    n = t.numel()
    flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
    return _digest(f"{list(t.shape)};", _sample_bytes(flat[::_stride(n)][:SAMPLE]))


def layer_input_norms(layers, norm: str) -> dict[str, str]:
    """The norm weight each later decoder layer of a multi-layer draft normalises its input with, as the
    live model computes: ``{"layers.{i}": tensor_fingerprint}`` for i >= 1 ({} for one layer).

    The engines read different modules there: SGLang 0.5.23 ``hidden_norm`` (llama_eagle3.py:103-105),
    vLLM 0.32.0 ``input_layernorm`` (llama_eagle3.py:136-138), speculators 0.9.0 a plain decoder layer's
    ``input_layernorm``; a checkpoint trained for one and served by another is then normalised by a weight
    training never used, which no per-name weight fact shows (contract ``draft_layer_input_norms``).

    Args:
        layers: the draft's decoder layers in order (layer 0 first).
        norm: the attribute holding the norm module a later layer reads (the engine's rule).
    """
    return {f"layers.{i}": tensor_fingerprint(getattr(layer, norm).weight) for i, layer in enumerate(layers) if i}


def weight_unit(name: str) -> str:
    """The unit a checkpoint tensor belongs to: its decoder layer (``model.layers.3.mlp.up_proj.weight``
    -> ``model.layers.3``), else its module (``model.embed_tokens.weight`` -> ``model.embed_tokens``;
    a name without a dot is its own unit)."""
    m = _LAYER.match(name)
    if m:
        return m.group(1)
    return name.rsplit(".", 1)[0] if "." in name else name


def unit_fingerprints(fingerprints: dict[str, str]) -> dict[str, str]:
    """Per-unit fingerprints (``weight_unit``) of per-tensor ones: sha256 over the unit's sorted
    ``name=fingerprint`` lines, ``DIGITS`` hex digits."""
    units: dict[str, list[str]] = {}
    for name in sorted(fingerprints):
        units.setdefault(weight_unit(name), []).append(f"{name}={fingerprints[name]}")
    return {u: _digest("unit;", "\n".join(lines).encode()) for u, lines in sorted(units.items())}


def structure_rows(model) -> dict[str, str]:
    """Parameter name -> ``"<shape> <dtype>"`` (``[256, 768] bfloat16``) of a model as it is now."""
    return {n: f"{list(p.shape)} {str(p.dtype).replace('torch.', '')}" for n, p in model.named_parameters()}


def structure(model, *, per_unit: bool, rows: dict[str, str] | None = None) -> dict[str, str]:
    """The module structure as built: parameter name -> ``"<shape> <dtype>"`` (``rows``, read when the
    loading ended, before an engine repacks its weights; else ``structure_rows`` now), or with
    ``per_unit`` (a target: thousands of tensors) unit -> ``"<n> params sha <digest>"`` over its names
    (relative to the unit), shapes and dtypes."""
    rows = structure_rows(model) if rows is None else rows
    if not per_unit:
        return dict(rows)
    units: dict[str, list[str]] = {}
    for name, row in rows.items():
        unit = weight_unit(name)
        units.setdefault(unit, []).append(f"{name[len(unit):]} {row}")  # relative: equal layers hash alike
    return {u: f"{len(v)} params sha {_digest('structure;', chr(10).join(sorted(v)).encode())}"
            for u, v in sorted(units.items())}


#: elements of each parameter ``LoadWatch`` reads before and after loading (a write it did not see,
#: e.g. from a loader thread, still shows as changed bits)
PROBE = 64


def _probe(t) -> bytes | None:
    """The raw bits of ``PROBE`` strided elements of a parameter (NaN compares by its bits)."""
    import torch

    try:
        flat = t.detach().reshape(-1)
        picked = flat[::max(1, flat.numel() // PROBE)][:PROBE].cpu().clone()
        return picked.view(torch.uint8).numpy().tobytes()
    except (RuntimeError, NotImplementedError):
        return None


def _storage(t) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, a functional wrapper)
        return None


class LoadWatch:
    """Watch one model's weight loading: fingerprint every checkpoint tensor the engine's iterator
    yields (``wrap``) and note which parameters' storage the loading wrote (as a context manager: a
    ``torch.overrides.TorchFunctionMode`` sees every in-place op and ``.data`` assignment).

    After loading, ``fingerprints`` is checkpoint name -> ``tensor_fingerprint`` and ``unwritten()``
    the parameters whose storage no op wrote and that still hold the tensor they were built with.
    """

    def __init__(self, model):
        self.model = model
        self.fingerprints: dict[str, str] = {}
        self.seconds = 0.0
        self._written: set[int] = set()
        self._before = {n: _storage(p) for n, p in model.named_parameters()}
        self._probes = {n: _probe(p) for n, p in model.named_parameters()}
        self._mode = None
        self.left: list[str] | None = None  # set by finish()
        self.rows: dict[str, str] | None = None

    def wrap(self, weights):
        """The engine's ``(name, tensor)`` iterator, fingerprinting each tensor as it goes by."""
        import time

        for name, tensor in weights:
            t0 = time.perf_counter()
            try:
                self.fingerprints[str(name)] = tensor_fingerprint(tensor)
            except Exception:  # noqa: BLE001 - an exotic tensor type: unknown for it, the load goes on
                self.fingerprints[str(name)] = "unknown"
            self.seconds += time.perf_counter() - t0
            yield name, tensor

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        written = self._written

        class _Writes(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if args and (name == "__setitem__" or name == "__set__"
                             or (name.endswith("_") and not name.startswith("_"))):
                    ptr = _storage(args[0]) if hasattr(args[0], "untyped_storage") else None
                    if ptr is not None:
                        written.add(ptr)
                return func(*args, **(kwargs or {}))

        self._mode = _Writes()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._mode = None
        self.left: list[str] | None = None  # set by finish()
        self.rows: dict[str, str] | None = None
        return False

    def finish(self) -> None:
        """At the end of the loading (before the engine's weight post-processing, which may repack or
        replace parameters): ``left`` (``unwritten``) and ``rows`` (the structure as built)."""
        self.left = self.unwritten()
        self.rows = structure_rows(self.model)

    def unwritten(self) -> list[str]:
        """Parameters the loading never wrote: same storage as when built, no op seen writing it, the
        same bits in ``PROBE`` sampled elements as before the load, and not holding the checkpoint
        tensor of their own name. The last rule is for a loader thread writing values equal to the
        allocation: the mode sees only this thread's ops, and SGLang 0.5.23's DeepSeek loader copies
        on a thread pool (srt/models/deepseek_common/deepseek_weight_loader.py:291) the RMSNorm weights
        of ones into parameters allocated as ones: a correct DeepSeek-V3 pair read 33 norms "unloaded"."""
        params = dict(self.model.named_parameters())
        return sorted(n for n, p in params.items()
                      if (ptr := _storage(p)) is not None and ptr == self._before.get(n) and ptr not in self._written
                      and self._probes.get(n) is not None and _probe(p) == self._probes[n]
                      and not self._holds_own_tensor(n, p))

    def _holds_own_tensor(self, name: str, param) -> bool:
        """The checkpoint yielded a tensor named ``name`` and ``param`` holds its values (fingerprints)."""
        want = self.fingerprints.get(name)
        if want is None or want == "unknown":
            return False
        try:
            return tensor_fingerprint(param) == want
        except Exception:  # noqa: BLE001 - an exotic parameter: not proven provided
            return False


def not_provided(unwritten: list[str], model, *, shared_from=None) -> list[str]:
    """The ``unwritten`` parameters of ``model`` still left as allocated, in ``unwritten``'s order: those
    that now are another model's (``shared_from``: e.g. the target's embedding an engine gives its draft
    after loading) are provided, by that model.

    A parameter is ``shared_from``'s when it is one of its parameter objects, or holds values in the
    storage one of them holds. An empty tensor holds no values: its storage pointer is 0 like every other
    empty tensor's, so it proves no sharing (vLLM 0.32.0 on a CPU empties each linear weight it packs for
    its kernel, layers/utils.py:560-579 AMX, :582-595 oneDNN: every packed weight, the target's included,
    then has pointer 0; measured on an AMX Xeon, a draft layer the checkpoint lacked lost its linears
    from this list that way)."""
    if not unwritten:
        return []
    params = dict(model.named_parameters())
    theirs = list(shared_from.parameters()) if shared_from is not None else []
    objects = {id(p) for p in theirs}
    storages = {_storage(p) for p in theirs if p.numel()} - {None}

    def provided(t) -> bool:
        return id(t) in objects or (t.numel() > 0 and _storage(t) in storages)

    return [n for n in unwritten if n in params and not provided(params[n])]


def _safetensors_samples(path: Path):
    """``(name, 1-D torch sample, shape)`` of every tensor of one safetensors file, the sample read
    through a memory map (only the sampled pages are read)."""
    import torch

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(meta["dtype"])
        shape = [int(s) for s in meta["shape"]]
        if dtype is None:
            yield name, None, shape
            continue
        begin, end = (base + int(o) for o in meta["data_offsets"])
        tdtype = getattr(torch, dtype)
        width = torch.empty((), dtype=tdtype).element_size()
        words = raw[begin:end].view(np.dtype(f"<u{width}"))  # no copy: the sampled pages only are read
        picked = words[::_stride(len(words))][:SAMPLE].copy()
        sample = torch.from_numpy(picked).view(tdtype)
        yield name, sample, shape


def checkpoint_fingerprints(model_dir) -> dict[str, str]:
    """Checkpoint tensor name -> ``tensor_fingerprint`` for every tensor of a model directory's
    ``*.safetensors`` files (else ``*.bin``, loaded memory-mapped with ``weights_only=True``): the same
    values ``LoadWatch`` computes on an engine's load path. Empty when the directory holds neither."""
    d = Path(model_dir)
    out: dict[str, str] = {}
    files = sorted(d.glob("*.safetensors"))
    for f in files:
        for name, sample, shape in _safetensors_samples(f):
            out[name] = "unknown" if sample is None else _digest(f"{shape};", _sample_bytes(sample))
    if files:
        return out
    import torch

    for f in sorted(d.glob("*.bin")):
        for name, t in torch.load(str(f), map_location="cpu", weights_only=True, mmap=True).items():
            out[name] = tensor_fingerprint(t)
    return out


__all__ = ["SAMPLE", "LoadWatch", "checkpoint_fingerprints", "layer_input_norms", "not_provided", "structure",
           "structure_rows", "tensor_fingerprint", "unit_fingerprints", "weight_unit"]
