"""Structure check: do the two sides record each tensor with the same shape, slot count and dtype family?

Values can only be compared between rows of one layout. When the layouts differ — an EAGLE-3
draft served with ``--speculative-algorithm EAGLE`` feeds one final hidden state [H] where
training feeds three aux states [3H]; another number of aux layers; a draft vocab of another
size; another top-k — that difference *is* the finding, and it is reported at the earliest stage
where it shows (schema.STAGE_ORDER), never raised.

The check reads only layouts (``Trace.info``: storage dtype, per-row shape, row count), the aux
slot names and the contract facts; no rows are read. ``structure_mismatches`` returns a plan
(one ``StructureMismatch`` per tensor, printable, no tensors) that compare.py turns into
divergences of kind ``structure`` and explain/structure.py turns into causes.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdiff.replay.diff.types import Pair
from specdiff.tracer.schema import aux_name, aux_slot, ordered, probe_index, sort_key, spec_for

#: storage dtype -> dtype family (a float side against an int side cannot be compared at all;
#: bf16 against fp32 can, with the looser tolerance).
FAMILIES = {"bfloat16": "float", "float16": "float", "float32": "float", "float64": "float",
            "int64": "int", "int32": "int", "bool": "bool"}

#: feature dim (schema.TensorSpec.dims) -> the structural kind a size difference there is.
DIM_KINDS = {"hidden": "width", "aux_hidden": "width", "draft_hidden": "width", "attn_in": "width",
             "draft_vocab": "vocab", "topk": "topk_width", "logits_topk": "topk_width",
             "draft_tokens": "width", "accept_slots": "width"}

#: structural kind -> contract fields that show it (printed next to the finding when recorded).
KIND_FIELDS = {
    "slot_count": ("speculative_algorithm", "aux_hf_indices", "aux_native_ids", "hidden_size"),
    "width": ("speculative_algorithm", "aux_hf_indices", "hidden_size", "draft_hidden_size",
              "spec_draft_tokens", "spec_steps"),
    "vocab": ("draft_vocab_size", "vocab_size", "d2t_sha256"),
    "topk_width": ("spec_topk", "logits_topk", "capture_level"),
    "dtype_family": ("dtype", "engine", "engine_version"),
}

#: contract facts read under either name (recorders of different versions)
ALGORITHM_FIELDS = ("speculative_algorithm", "spec_algorithm")


@dataclass(frozen=True)
class StructureMismatch:
    """One tensor whose layout differs between the sides (a plan: no tensors).

    Attributes:
        name: the tensor the finding is shown at. For a slot-count difference: the first aux slot
            that exists on one side only (``target.aux.{min(kx, ky)}``).
        kind: ``width`` | ``slot_count`` | ``vocab`` | ``topk_width`` | ``dtype_family``.
        dim: the schema dim that differs (``aux_hidden``, ``draft_vocab``, ...), or ``slots`` /
            ``rows`` (draft.d2t: one row per draft-vocab id) / ``dtype``.
        x, y: what each side has there (a shape tuple, a slot count, a dtype name, a row count).
        message: one plain-words line, side labels included.
        fields: contract fields that bear on it: ``{field: (x value, y value)}`` where recorded.
    """

    name: str
    kind: str
    dim: str
    x: object
    y: object
    message: str
    fields: dict


def _family(dtype: str) -> str:
    return FAMILIES.get(dtype, dtype)


def _slots(trace) -> list[int]:
    return sorted(j for j in (aux_slot(n) for n in trace.names) if j is not None)


def contract_value(contract: dict, field: str):
    """A contract fact, the speculative algorithm read under any of its recorded names."""
    if field == "speculative_algorithm":
        for key in ALGORITHM_FIELDS:
            if contract.get(key) is not None:
                return contract[key]
        return None
    return contract.get(field)


def _fields(traces: Pair, kind: str) -> dict:
    out = {}
    for f in KIND_FIELDS.get(kind, ()):
        vx, vy = contract_value(traces.x.contract, f), contract_value(traces.y.contract, f)
        if vx is not None or vy is not None:
            out[f] = (list(vx) if isinstance(vx, tuple) else vx, list(vy) if isinstance(vy, tuple) else vy)
    return out


def _shape_kind(dims: tuple[str, ...], sx: tuple, sy: tuple) -> tuple[str, str]:
    """(kind, dim name) of the first feature dim whose size differs (rank differences are width)."""
    if len(sx) != len(sy):
        return "width", "rank"
    for d, a, b in zip(dims, sx, sy, strict=False):
        if a != b:
            return DIM_KINDS.get(d, "width"), d
    return "width", "shape"


def _width_words(dim: str, sx: tuple, sy: tuple) -> str:
    return f"{dim} {sx[0] if len(sx) == 1 else sx} vs {sy[0] if len(sy) == 1 else sy}"


def structure_mismatches(traces: Pair, labels: Pair) -> list[StructureMismatch]:
    """Every layout difference between the sides, in dataflow order (earliest stage first).

    Checked: the number of aux slots (``target.aux.{j}``); for each tensor both sides recorded,
    the dtype family (float / int / bool), the per-row shape, and for ``draft.d2t`` the row count
    (one row per draft-vocab id). Probes and the target's top-k logits are evidence, not dataflow,
    and are not checked.
    """
    out: list[StructureMismatch] = []
    lx, ly = labels.x, labels.y
    sx, sy = _slots(traces.x), _slots(traces.y)
    both_cat = "target.aux_cat" in set(traces.x.names) & set(traces.y.names)
    # No slots on one side is a slot-count difference only when both fed the draft an aux concat.
    if (sx and sy and len(sx) != len(sy)) or (bool(sx) != bool(sy) and both_cat):
        first_missing = aux_name(min(len(sx), len(sy)))
        out.append(StructureMismatch(
            first_missing, "slot_count", "slots", len(sx), len(sy),
            f"{lx} fed the draft {len(sx)} aux hidden state slot(s), {ly} {len(sy)}",
            _fields(traces, "slot_count")))
    common = set(traces.x.names) & set(traces.y.names)
    for name in ordered(common):
        if probe_index(name) is not None or (aux_slot(name) is not None and out and out[0].kind == "slot_count"):
            continue
        if name.startswith("target.logits_topk."):  # evidence, k each side's own (record train 8, a server's
            continue                                # SPECDIFF_LOGITS_TOPK): not dataflow either
        ix, iy = traces.x.info(name), traces.y.info(name)
        fx, fy = _family(ix.dtype), _family(iy.dtype)
        if fx != fy:
            out.append(StructureMismatch(name, "dtype_family", "dtype", ix.dtype, iy.dtype,
                                         f"{name}: {lx} stored {ix.dtype} ({fx}), {ly} {iy.dtype} ({fy})",
                                         _fields(traces, "dtype_family")))
            continue
        if tuple(ix.shape) != tuple(iy.shape):
            kind, dim = _shape_kind(spec_for(name).dims, tuple(ix.shape), tuple(iy.shape))
            out.append(StructureMismatch(
                name, kind, dim, tuple(ix.shape), tuple(iy.shape),
                f"{name}: rows are {_width_words(dim, tuple(ix.shape), tuple(iy.shape))} wide "
                f"({lx} vs {ly})", _fields(traces, kind)))
            continue
        if name == "draft.d2t" and ix.rows != iy.rows:
            out.append(StructureMismatch(name, "vocab", "rows", ix.rows, iy.rows,
                                         f"draft.d2t: {lx} maps {ix.rows} draft ids, {ly} {iy.rows} "
                                         "(draft vocab sizes differ)", _fields(traces, "vocab")))
    return sorted(out, key=lambda m: sort_key(m.name))


__all__ = ["StructureMismatch", "structure_mismatches", "contract_value", "FAMILIES", "KIND_FIELDS"]
