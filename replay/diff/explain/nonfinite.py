"""Non-finite values as a cause: where NaN/inf first appear, on which side, and what made them.

A NaN or inf row is always a divergence (compare.py), but the row that holds it says little by
itself: the useful facts are the first stage, depth and row where non-finite values appear (the
dataflow order of tracer/schema.py ``sort_key``, depth first: depth k runs after every stage of
depth k-1), which side holds them, and what that side did differently:

- it ran in float16 where the other ran bfloat16 / float32 (contract ``dtype``): float16's largest
  finite value is 65504 (IEEE 754 binary16), bfloat16 shares float32's exponent range, so an
  activation a bf16-trained draft keeps below 3.4e38 overflows to inf in float16, and inf - inf
  or 0 * inf becomes NaN in the next norm or softmax;
- its engine built parameters its checkpoint did not provide, left as allocated (contract
  ``draft_unloaded`` / ``target_unloaded``: e.g. a draft config asking for more layers than the
  checkpoint holds);
- its draft checkpoint holds NaN/inf weights (an uninitialised or corrupt tensor): read from the
  served draft directory the serving contract names (``draft_name``), when it is at hand.

``explain_nonfinite`` turns that into an ``Explanation`` (replay/diff/explain/ calls it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.contract.check import weights_dtype
from specdiff.replay.diff.types import Explanation, Pair
from specdiff.tracer.contract import known
from specdiff.tracer.paths import contract_path
from specdiff.tracer.schema import sort_key

#: float16's largest finite value (IEEE 754 binary16: (2 - 2**-10) * 2**15)
FLOAT16_MAX = 65504.0
#: rows read per side to tell NaN from inf and which side holds them (the first non-finite rows)
READ_ROWS = 256
#: run dtypes that cannot overflow where float16 does (float32's exponent range)
WIDE_DTYPES = frozenset({"bfloat16", "float32"})


@dataclass(frozen=True)
class NonFinite:
    """Where non-finite values first appear.

    Attributes:
        name: canonical tensor name (the earliest stage, at the shallowest depth, holding them).
        depth: draft depth of the first non-finite row.
        pair, pos: aligned sequence pair (the report's "seq") and position of the first such row.
        rows: rows of ``name`` non-finite on either side; ``total``: rows compared.
        sides: per side (``Pair[str]``): '' (finite), 'NaN', 'inf' or 'NaN and inf', over the rows read.
        finite_max_abs: per side, the largest |value| that side holds on the rows read where it is
            finite (None where it holds none): the magnitude the other side failed to represent.
    """

    name: str
    depth: int
    pair: int
    pos: int
    rows: int
    total: int
    sides: Pair
    finite_max_abs: Pair

    def where(self) -> str:
        return f"{self.name} depth {self.depth}, seq {self.pair} pos {self.pos}"


def _kinds(values: np.ndarray) -> str:
    nan, inf = bool(np.isnan(values).any()), bool(np.isinf(values).any())
    return "NaN and inf" if nan and inf else "NaN" if nan else "inf" if inf else ""


def first_nonfinite(traces: Pair, comps: dict) -> NonFinite | None:
    """The earliest non-finite rows over every compared tensor, or None when every row is finite.

    Args:
        traces: the opened traces (``tracer.store`` readers: ``take_float(name, rows)`` -> float32
            [k, ...]).
        comps: tensor name -> ``types.TensorComparison`` (its ``nonfinite`` bool [n] marks rows
            non-finite on either side).

    Earliest = shallowest depth, then dataflow order (``tracer.schema.sort_key``), then position,
    then sequence pair.
    """
    best = None
    for name, comp in comps.items():
        if comp.kind != "values" or comp.nonfinite is None or not comp.nonfinite.any():
            continue
        depth = int(comp.match.depth[comp.nonfinite].min())
        key = (depth, sort_key(name))
        if best is None or key < best[0]:
            best = (key, name, comp)
    if best is None:
        return None
    _, name, comp = best
    m = comp.match
    idx = np.flatnonzero(comp.nonfinite & (m.depth == best[0][0]))
    idx = idx[np.lexsort((m.pair[idx], m.pos[idx]))][:READ_ROWS]
    vals = Pair(traces.x.take_float(name, m.rows.x[idx]), traces.y.take_float(name, m.rows.y[idx]))
    flat = vals.map(lambda v: np.asarray(v, np.float64).reshape(len(idx), -1))

    def finite_max(v):
        f = np.abs(v[np.isfinite(v)])
        return float(f.max()) if f.size else None

    i = int(idx[0])
    return NonFinite(name, int(m.depth[i]), int(m.pair[i]), int(m.pos[i]), int(comp.nonfinite.sum()),
                     len(m.pair), flat.map(_kinds), flat.map(finite_max))


def nonfinite_weights(draft_dir) -> list[str]:
    """Names of the draft checkpoint's float tensors holding NaN or inf (empty when none, or when
    ``draft_dir`` is not a readable checkpoint directory here).

    Reads every tensor (``replay.model.checkpoint.read_state_dict``): an EAGLE-3 draft is one decoder
    layer plus fc and lm_head, read in seconds.
    """
    if not draft_dir or not Path(str(draft_dir)).is_dir():
        return []
    import torch

    from specdiff.replay.model.checkpoint import CheckpointError, read_state_dict

    try:
        state = read_state_dict(draft_dir)
    except (CheckpointError, OSError):
        return []
    return [k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def explain_nonfinite(traces: Pair, comps: dict, first, labels: Pair):
    """The non-finite values as a cause: where they first appear and, when a side's contract or
    checkpoint explains them, why (float16 overflow; NaN/inf weights), with the fix.

    Returns a list of ``types.Explanation`` (empty when every compared row is finite): one, cause
    ``unloaded_params``, ``fp16_overflow``, ``nonfinite_weights`` or ``nonfinite`` (nothing recorded
    explains them).
    ``first`` is the report's first divergence; when the non-finite values appear at another
    tensor the message says so (they are then downstream evidence, not the first divergence).
    The explanation's ``tensor`` is where they first appear (explain/__init__.py orders by it).
    """
    nf = first_nonfinite(traces, comps)
    if nf is None:
        return []
    holders = [lab for lab, k in ((labels.x, nf.sides.x), (labels.y, nf.sides.y)) if k]
    if not holders:  # a damaged or re-read row: the compare saw non-finite values the reread does not
        holders = [f"{labels.x} or {labels.y}"]
    kinds = nf.sides.y or nf.sides.x or "non-finite values"
    on = " and ".join(holders)
    head = f"non-finite values ({kinds}) first appear at {nf.where()} on {on}"
    if first is not None and first.name != nf.name:
        head += f" (after the first divergence at {first.name})"
    ev = [f"{nf.rows}/{nf.total} rows of {nf.name} hold NaN/inf on {on}"]
    for other_lab, k, mx in ((labels.y, nf.sides.x, nf.finite_max_abs.y), (labels.x, nf.sides.y, nf.finite_max_abs.x)):
        if k and mx is not None:
            ev.append(f"largest |value| {other_lab} holds on those rows: {mx:.4g}"
                      + (f" (float16's largest finite value is {FLOAT16_MAX:g})" if mx > FLOAT16_MAX else ""))
    dtypes = traces.map(lambda t: weights_dtype(t.contract))
    if dtypes.x or dtypes.y:
        ev.append(f"contract dtype: {labels.x} {dtypes.x or 'not recorded'}, {labels.y} {dtypes.y or 'not recorded'}")
    sides = [(labels.x, traces.x, nf.sides.x, dtypes.x, dtypes.y, nf.finite_max_abs.y),
             (labels.y, traces.y, nf.sides.y, dtypes.y, dtypes.x, nf.finite_max_abs.x)]
    for lab, trace, kind, mine, other, other_max in sides:
        if not kind:
            continue
        unloaded = [p for f in ("draft_unloaded", "target_unloaded") for p in (known(trace.contract, f) or [])]
        if unloaded:
            more = f" (+{len(unloaded) - 3} more)" if len(unloaded) > 3 else ""
            return [Explanation("unloaded_params", f"{head}: {lab}'s engine built parameters its checkpoint did not "
                                f"provide, left as allocated ({', '.join(unloaded[:3])}{more})",
                                (*ev, f"contract draft_unloaded / target_unloaded on {lab}: {len(unloaded)} parameters"),
                                fix_of("unloaded_params"), tensor=nf.name)]
        ddir = contract_path(trace, "draft_name", want=Path.is_dir).path if trace.side == "serve" else None
        bad = nonfinite_weights(ddir)
        if bad:
            more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
            return [Explanation("nonfinite_weights", f"{head}: {lab}'s draft checkpoint holds NaN/inf weights "
                                f"({', '.join(bad[:3])}{more}): an uninitialised or corrupt tensor",
                                (*ev, f"checked {ddir}"),
                                fix_of("nonfinite_weights"),
                                tensor=nf.name)]
        if mine == "float16" and other != "float16":
            words = f"{other}, which shares float32's exponent range" if other in WIDE_DTYPES else \
                "another dtype" if other else "a wider dtype (the other side's dtype is not recorded)"
            proof = (f"; {lab} cannot hold the {other_max:.4g} the other side computes there"
                     if other_max is not None and other_max > FLOAT16_MAX else "")
            fix = ("serve in bfloat16: --dtype bfloat16 (the dtype the draft was trained in)" if trace.side == "serve"
                   else "record training in the serving dtype, or serve in bfloat16: --dtype bfloat16")
            return [Explanation("fp16_overflow", f"{head}: {lab} ran in float16 where the other side ran {words}; "
                                f"activations past float16's {FLOAT16_MAX:g} overflow to inf, and inf turns into "
                                f"NaN in the next norm or attention{proof}", tuple(ev), fix,
                                tensor=nf.name)]
    return [Explanation("nonfinite", f"{head}: no recorded dtype or weight explains them", tuple(ev),
                        fix_of("nonfinite"), tensor=nf.name)]
