"""A contract difference that can make a stage the FIRST to diverge is that divergence's explanation.

``STAGE_CAUSES`` is the one table of which contract facts (tracer/contract.py field names) can
cause a first divergence at each stage (tracer/schema.py ``STAGE_ORDER``). It is narrower than a
``ContractMismatch``'s ``stages`` (every stage a difference *shows* at, downstream included): the
first divergence is the earliest stage whose rows differ, so every stage before it agrees, and
only a fact used *inside* that stage's computation can be the cause. E.g. the rope facts act in
the draft's attention, between ``draft.attn_in`` (its input, equal when ``draft.hidden_out`` is the
first divergence) and ``draft.hidden_out``; a rope difference with ``draft.logits`` first (its
``draft.hidden_out`` equal) explains nothing.

The first stage each fact acts in and its fix are the fact table's (replay/diff/facts.py ``FACTS``;
tests/replay/diff/test_facts.py holds this table to it); a fact that differs and acts at or before
the first divergence without being one of these is named by explain/differences.py instead.

Not here: the compute ``dtype``. A dtype difference changes every stage a little and the
tolerances take the looser dtype (contract_check); it is a cause only where values go non-finite
(replay/diff/explain/nonfinite.py). Weight hashes that differ only by a cast are ``info`` mismatches
(contract_check ``WEIGHT_HASHES``) and never a cause here: only ``warn``/``error`` mismatches are.
"""

from __future__ import annotations

from specdiff.replay.diff.explain.contract_check import check_contracts
from specdiff.replay.diff.types import ContractMismatch, Explanation, Pair
from specdiff.tracer.contract import AUX_CONCAT_ORDER
from specdiff.tracer.schema import spec_for

_AUX = ("aux_hf_indices", AUX_CONCAT_ORDER, "aux_prenorm_indices", "aux_dropped_ids", "spec_algorithm")
_ROPE = ("rope_style", "rope_theta", "rope_scaling", "partial_rotary_factor")

#: first diverging stage -> contract facts whose difference can make it the first (module doc).
#: ``draft_weights_sha256`` is in no row: a whole-checkpoint hash says "another draft", not which
#: part; the narrowing (replay/diff/rerun/narrow.py, run when nothing explains the divergence) re-runs the
#: training draft on serving's inputs and says whether the draft itself is why.
STAGE_CAUSES: dict[str, tuple[str, ...]] = {
    "tokens": ("tokenizer_sha256", "bos_added", "chat_template_sha256"),
    "target.aux": _AUX,
    "target.aux_cat": _AUX,
    "draft.fc_in": ("norm_before_fc", "fc_norm", *_AUX),
    "draft.fc_out": ("norm_before_fc", "fc_norm"),
    "draft.positions": (),
    # the embedding half (embed_*) and, at depth >= 1, the hidden fed back (norm_output)
    "draft.attn_in": ("embed_source", "embed_sha256", "norm_output"),
    # the draft's attention: rope (SGLang 0.5.23 srt/models/llama.py:199-231, read at :324-336)
    "draft.hidden_out": _ROPE,
    "draft.logits": ("lm_head_source", "lm_head_sha256", "draft_vocab_size"),
    "draft.topk": ("lm_head_source", "lm_head_sha256", "draft_vocab_size"),
    "draft.topk_target": ("d2t_sha256", "hot_token_id_sha256", "t2d_sha256"),
    "verify": ("d2t_sha256", "hot_token_id_sha256", "spec_steps", "spec_topk"),
}


#: stages whose contract causes are judged by value, not by the contract: explain/aux.py identifies each
#: aux slot's layer in the other side's rows (explain_aux); a layer list that differs where no slot
#: matches any layer of the other side (another target, other weights) is not claimed as the cause.
VALUE_JUDGED = frozenset({"target.aux", "target.aux_cat"})


def causes_at(stage: str, mismatches: list[ContractMismatch]) -> list[ContractMismatch]:
    """The ``warn``/``error`` mismatches whose fact ``STAGE_CAUSES`` lists for ``stage``, in the
    table's order (the aux-dropped ids, recorded per side, are kept once)."""
    facts = STAGE_CAUSES.get(stage, ())
    found = [m for m in mismatches if m.field in facts and m.severity in ("warn", "error")
             and m.x != "unknown" and m.y != "unknown"]
    return sorted(found, key=lambda m: facts.index(m.field))


def explain_contract(traces: Pair, comps: dict, first):
    """``types.Explanation`` per contract difference that can cause ``first`` (``STAGE_CAUSES``),
    cause ``contract.<field>``, with the difference, the upstream stage that agrees and its fix;
    empty when ``first`` is None or a layout (structure) finding."""
    if first is None or first.kind != "values":
        return []
    stage = spec_for(first.name).stage
    if stage in VALUE_JUDGED:
        return []
    found = causes_at(stage, check_contracts(traces))
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
