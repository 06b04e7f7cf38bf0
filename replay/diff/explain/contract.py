"""A contract difference that can make a stage the FIRST to diverge is that divergence's explanation:
which facts can (``STAGE_CAUSES``) and why only those is the fact table's (replay/diff/contract/facts.py)."""

from __future__ import annotations

from specdiff.replay.diff.contract.facts import VALUE_JUDGED, causes_at
from specdiff.replay.diff.types import ContractMismatch, Explanation
from specdiff.tracer.schema import spec_for


def explain_contract(comps: dict, first, contract: list[ContractMismatch]) -> list[Explanation]:
    """``types.Explanation`` per contract difference that can cause ``first`` (``STAGE_CAUSES``),
    cause ``contract.<field>``, with the difference, the upstream stage that agrees and its fix;
    empty when ``first`` is None or a layout (structure) finding. ``contract``: the diff's contract
    mismatches (contract/check.py ``check_contracts``, run once per diff)."""
    if first is None or first.kind != "values":
        return []
    stage = spec_for(first.name).stage
    if stage in VALUE_JUDGED:
        return []
    found = causes_at(stage, contract)
    if not found:
        return []
    idx = spec_for(first.name).stage_index
    upstream = [c for n, c in comps.items() if c.kind == "values" and not c.diverged
                and not c.stats.get("reproduced_by_reexecution")  # its rows failed: no witness of agreement
                and spec_for(n).stage_index == idx - 1]
    key = {c.name: "max_rel" if "max_rel" in c.stats else "match_rate" for c in upstream}
    agree = tuple(f"{c.name} agrees ({key[c.name]} {c.stats.get(key[c.name], float('nan')):.3g}): the difference "
                  f"begins inside {stage}" for c in upstream[:1])
    return [Explanation(f"contract.{m.field}",
                        f"{m.message} — a {m.field} difference acts inside {stage}, where the divergence begins",
                        (f"contract {m.field}: {m.x} vs {m.y}", *agree), m.fix) for m in found]
