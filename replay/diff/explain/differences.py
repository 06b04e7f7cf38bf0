"""Every difference named: where no known mistake's transform closes the gap at the first divergence,
the explanation names the recorded facts that differ and act at or before that stage.

The contract comparison (replay/diff/contract/check.py check_contracts, and fact_diff for every fact no one worded)
gives each warning its fact; the fact table (replay/diff/contract/facts.py ``FACTS``) gives the first stage a fact
acts in and its fix. A fact acting at or before the first diverging stage can be why the rows differ
there, unless it acts before it at a stage whose recorded rows agree (then it changed nothing there,
explain/contract.py's reasoning); a fact no table lists (stage unknown) is named too, after them. These explanations are marked
``named_only``: they name what differs, they do not prove it is the cause, so the narrowing (the draft
re-run on serving's inputs, replay/diff/rerun/narrow.py) still runs after them.
"""

from __future__ import annotations

from specdiff.replay.diff.contract.fact_diff import first_stage, listed_field, shown
from specdiff.replay.diff.contract.facts import FACTS, fact_row
from specdiff.replay.diff.types import ContractMismatch, Explanation, Pair
from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.schema import STAGE_ORDER, spec_for

#: explanations named at most (the contract block lists every difference)
LIMIT = 6


def _unknown(v) -> bool:
    return isinstance(v, str) and v == UNKNOWN


def _agrees(comps: dict, stage: str) -> bool:
    """Rows of ``stage`` were compared, none diverged and none sits above the pair's noise floor
    (judge/shift.py ``AT_NOISE_RATIO``; where no floor was measured, the tolerance alone): a fact acting
    first there did not change them. Inside the tolerance but above the noise, a fact acting there can
    still be why a later stage diverges (a draft's MLP weights 0.3 % apart: hidden_out at 1.7x its
    floor, the top-k ids diverged)."""
    at = [c for n, c in comps.items() if c.kind == "values" and spec_for(n).stage == stage]
    return bool(at) and not any(c.diverged or (c.shift is not None and c.shift.above_noise) for c in at)


def _above_noise(comps: dict, stage: str | None) -> tuple[str, ...]:
    """Evidence that ``stage``'s rows, inside their tolerance, sit above the pair's noise floor (why a fact
    acting there is not ruled out); empty for an unknown stage or rows at the noise."""
    if stage is None:
        return ()
    return tuple(f"{c.name}: inside its tolerance, {c.shift.words()}" for n, c in comps.items()
                 if c.kind == "values" and spec_for(n).stage == stage and not c.diverged
                 and c.shift is not None and c.shift.above_noise)[:1]


def differences_at(traces: Pair, comps: dict, stage: str,
                   contract: list[ContractMismatch]) -> list[tuple[object, str | None]]:
    """``(ContractMismatch, first stage or None)`` of every warning / error whose fact acts at ``stage``, or
    before it at a stage whose rows were not compared (``STAGE_ORDER``; one whose rows agree rules the
    fact out: explain/contract.py's reasoning), nearest first; then the ones whose stage is unknown (no
    ``FACTS`` row). ``contract``: the diff's contract mismatches (contract/check.py, checked once per diff)."""
    idx = STAGE_ORDER.index(stage)
    near, unknown = [], []
    for m in contract:
        if m.severity not in ("warn", "error") or _unknown(m.x) or _unknown(m.y):
            continue
        at = first_stage(m.field, traces) if fact_row(m.field) is not None else None
        if at is None:
            unknown.append((m, None))
        elif at == stage or (STAGE_ORDER.index(at) < idx and not _agrees(comps, at)):
            near.append((m, at))
    # nearest stage first; at one stage in the fact table's order (a checkpoint's unloaded layer before the
    # norm it therefore lacks: facts.py)
    near.sort(key=lambda p: (-STAGE_ORDER.index(p[1]), FACTS.index(fact_row(p[0].field))))
    return near + unknown


def explain_differences(traces: Pair, comps: dict, first, contract: list[ContractMismatch]) -> list[Explanation]:
    """One ``named_only`` ``Explanation`` per recorded fact that differs and acts at or before ``first``'s
    stage (``differences_at``; at most ``LIMIT``, the last saying how many more the contract block lists);
    empty when ``first`` is not a values divergence or no fact differs."""
    if first is None or first.kind != "values":
        return []
    stage = spec_for(first.name).stage
    found = differences_at(traces, comps, stage, contract)
    out = []
    for m, at in found[:LIMIT]:
        said = "(acts from " in m.message or "stage unknown" in m.message  # fact_diff's messages say where
        where = "" if said else f"; it acts from {at}" if at is not None else "; stage unknown"
        fix = m.fix or (f"make {m.field} the same on both sides (stage unknown: no table lists what it changes)")
        evidence = (f"contract {m.field}: {shown(m.field, m.x)} vs {shown(m.field, m.y)}", *_above_noise(comps, at))
        args = (f"{m.message} — no known mistake's transform closes the gap at {stage}{where}", evidence, fix)
        field = listed_field(m.field)
        out.append(Explanation(f"contract.{field}", *args, named_only=True) if field is not None else
                   Explanation("unlisted_difference", *args, named_only=True))
    if len(found) > LIMIT and out:
        last = out[-1]
        out[-1] = Explanation(last.cause, last.message, (*last.evidence, f"... {len(found) - LIMIT} more recorded "
                              "differences in the contract block"), last.fix, named_only=True)
    return out


__all__ = ["LIMIT", "differences_at", "explain_differences"]
