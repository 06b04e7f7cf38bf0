"""Contract check: the two traces' contract facts side by side, each mismatch named in plain words."""

from __future__ import annotations

from dataclasses import dataclass

from specdiff.tracer.contract import UNKNOWN, unknown_fields

from .align import Pair

# Severity: "error" = the two sides cannot agree; "warn" = likely a cause; "info" = worth knowing.
_FIELDS = [
    ("num_layers", "error", "target layer counts differ ({x} vs {y}): traces of different target models"),
    ("hidden_size", "error", "target hidden sizes differ ({x} vs {y}): traces of different target models"),
    ("vocab_size", "error", "target vocab sizes differ ({x} vs {y}): traces of different target models"),
    ("draft_vocab_size", "error", "draft vocab sizes differ ({x} vs {y}): different drafts"),
    ("aux_hf_indices", "warn", "{ly} captured HF hidden_states{y}; {lx} used {x}"),
    ("d2t_sha256", "warn", "the d2t vocab maps differ ({lx} {xs}, {ly} {ys})"),
    ("hot_token_id_sha256", "warn", "the draft->target id maps (hot_token_id) differ ({lx} {xs}, {ly} {ys})"),
    ("norm_before_fc", "warn", "norm before fc: {lx} {x}, {ly} {y}"),
    ("fc_norm", "warn", "per-slot fc norm: {lx} {x}, {ly} {y}"),
    ("embed_source", "warn", "draft embedding taken from the {x} on {lx}, from the {y} on {ly}"),
    ("lm_head_source", "warn", "draft lm_head taken from the {x} on {lx}, from the {y} on {ly}"),
    ("draft_weights_sha256", "warn", "draft weights differ ({lx} {xs}, {ly} {ys})"),
    ("tokenizer_sha256", "warn", "tokenizers differ ({lx} {xs}, {ly} {ys})"),
    ("chat_template_sha256", "info", "chat templates differ ({lx} {xs}, {ly} {ys})"),
    ("dtype", "info", "compute dtypes differ ({lx} {x}, {ly} {y}): tolerances use the looser"),
    ("spec_steps", "info", "draft steps differ ({lx} {x}, {ly} {y})"),
]


@dataclass(frozen=True)
class ContractMismatch:
    """One contract field that differs: its values on each side and a plain-words message."""

    field: str
    severity: str
    x: object
    y: object
    message: str


def side_labels(traces: Pair) -> Pair[str]:
    """'training' / 'serving' from each trace's side; 'A' / 'B' when both are the same side."""
    sides = traces.map(lambda t: t.side)
    if sides.x == sides.y:
        return Pair("A", "B")
    return sides.map(lambda s: "training" if s == "train" else "serving")


def _short(v) -> str:
    return "none" if v is None else (str(v)[:10] if isinstance(v, str) else str(v))


def unknown_facts(contract: dict) -> dict[str, str]:
    """Field -> why it is unknown: the engine name the recorder could not find (from the
    contract's ``unobservable`` list), for every field recorded as ``"unknown"``."""
    why: dict[str, str] = {}
    for u in contract.get("unobservable") or []:
        if isinstance(u, dict):
            ver = u.get("sglang_version")
            who = f"SGLang {ver} has no {u.get('name')}" if ver else f"the engine has no {u.get('name')}"
            for f in u.get("facts") or []:
                why.setdefault(f, who)
    return {f: why.get(f, "the recorder could not read it") for f in unknown_fields(contract)}


def check_contracts(traces: Pair) -> list[ContractMismatch]:
    """Every known contract field present on both sides whose values differ, most severe first.

    Fields missing on one side are not reported (an engine may not know them); a field recorded
    as ``"unknown"`` is reported as unknown (with the engine name that hid it), never compared;
    the SGLang-only ``aux_dropped_ids`` is reported whenever non-empty.
    """
    cx, cy = traces.x.contract, traces.y.contract
    labels = side_labels(traces)
    out: list[ContractMismatch] = []
    for label, c, is_x in ((labels.x, cx, True), (labels.y, cy, False)):
        for field, why in unknown_facts(c).items():
            other = (cy if is_x else cx).get(field)
            x, y = (UNKNOWN, other) if is_x else (other, UNKNOWN)
            out.append(ContractMismatch(field, "warn", x, y,
                                        f"{field} is unknown on {label} ({why}): not compared"))
    for field, severity, template in _FIELDS:
        if field not in cx or field not in cy or UNKNOWN in (cx[field], cy[field]):
            continue
        x, y = cx[field], cy[field]
        if isinstance(x, tuple):
            x = list(x)
        if isinstance(y, tuple):
            y = list(y)
        if x == y:
            continue
        msg = template.format(x=x, y=y, xs=_short(x), ys=_short(y), lx=labels.x, ly=labels.y)
        out.append(ContractMismatch(field, severity, x, y, msg))
    for label, c in ((labels.x, cx), (labels.y, cy)):
        dropped = c.get("aux_dropped_ids") or []
        if dropped and dropped != UNKNOWN:
            out.append(ContractMismatch("aux_dropped_ids", "error", dropped, None,
                                        f"{label}: aux ids {dropped} are silently dropped by the engine "
                                        "(SGLang id L-1 is never captured)"))
    rank = {"error": 0, "warn": 1, "info": 2}
    return sorted(out, key=lambda m: rank[m.severity])
