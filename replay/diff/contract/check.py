"""Contract check: the two traces' contract facts side by side, each mismatch named in plain words.

What invalidates the comparison comes first: two traces whose target identity facts differ
(``TARGET_IDENTITY``: architecture, config hash, dtype-independent weight fingerprint, MoE
routing; tracer/contract.py) were recorded on different target models, and
``refuse_different_targets`` stops the diff with one line before any row is compared; where the weights
agree the target is one model and its other identity facts are contract differences (``one_target_config``). A fact a
side did not record (an older trace) or recorded as ``unknown`` is not compared, and that is said
once per side.
"""

from __future__ import annotations

from specdiff.eagle3.engines import UnknownEngineError, engine_spec
from specdiff.replay.diff.contract.fact_diff import fact_differences, mismatch
from specdiff.replay.diff.contract.facts import WORDED, fact_row
from specdiff.replay.diff.types import ContractMismatch, Pair, side_names
from specdiff.tracer.contract import AUX_CONCAT_ORDER, UNKNOWN, known, unknown_facts, unobservable_engine
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.schema import STAGE_ORDER

#: the facts that name the target model a trace was recorded on (tracer/contract.py; the SGLang recorder
#: reads them from its live target, record train from the target it loaded): equal on both sides of one
#: target whatever the dtype each side ran it in (the config hash leaves out dtype, the fingerprint
#: rounds to bf16)
TARGET_IDENTITY = ("target_architecture", "target_config_sha256", "target_weights_fingerprint",
                   "target_num_experts", "target_experts_per_token")


class DifferentTargetsError(SpecdiffError):
    """The two traces were recorded on different target models: nothing they hold can be compared."""


def serving_engines(traces: Pair) -> list:
    """The ``EngineSpec`` of each serving side (x first, once each); a serving trace without an
    ``engine`` fact counts as SGLang's (written before the fact existed, by the SGLang recorder)."""
    specs = []
    for t in (traces.x, traces.y):
        if t.side != "serve":
            continue
        name = known(t.contract, "engine") or "sglang"
        try:
            spec = engine_spec(str(name))
        except UnknownEngineError:
            continue
        if spec not in specs:
            specs.append(spec)
    return specs


def engine_fix(field: str, traces: Pair) -> str:
    """The fix of ``field`` in the serving engine's own terms (its fact row's ``engine_fixes``,
    replay/diff/contract/facts.py); two engines -> each one's, named; no serving side -> SGLang's (every
    trace without the ``engine`` fact is SGLang's: the vLLM recorder always writes it); else the row's
    engine-neutral fix."""
    specs = serving_engines(traces) or [engine_spec("sglang")]
    row = fact_row(field)
    fixes = [(s, row.engine_fixes.get(s.name, row.fix)) for s in specs]
    if len(fixes) == 1 or len({f for _, f in fixes}) == 1:
        return fixes[0][1]
    return "; ".join(f"{s.title}: {f}" for s, f in fixes)


#: weight hash fact -> its dtype-independent fingerprint fact. The sha256 facts hash the weights as
#: float32 bytes of the dtype each side holds them in (tracer/contract.py ``weight_sha256``), so one
#: checkpoint held in bfloat16 by training and in float16 by serving hashes differently (float16 rounds
#: weights below 2**-14 again). The fingerprint fact, when a recorder writes it, hashes values rounded
#: through float16 then bfloat16, equal for one bf16 checkpoint held in bf16, fp16 or fp32.
WEIGHT_HASHES = {"embed_sha256": "embed_fingerprint", "lm_head_sha256": "lm_head_fingerprint",
                 "draft_weights_sha256": "draft_weights_fingerprint"}
_WEIGHT_WORDS = {"embed_sha256": "embeddings the draft multiplies by", "lm_head_sha256": "lm_heads the draft "
                 "multiplies by", "draft_weights_sha256": "draft weights"}


def weights_dtype(contract: dict) -> str | None:
    """The dtype a side held the draft's weights in: its compute ``dtype`` fact (both recorders cast
    the draft to it), without a ``torch.`` prefix; None when not recorded."""
    v = known(contract, "dtype")
    return str(v).replace("torch.", "") if v else None


def same_weights(cx: dict, cy: dict, field: str) -> bool:
    """Whether two contracts prove the weights of sha256 ``field`` (a ``WEIGHT_HASHES`` key) the same:
    their sha256s, or their dtype-independent fingerprints, recorded on both sides and equal. False
    also when a side did not record them (nothing proven)."""
    for f in (field, WEIGHT_HASHES[field]):
        x, y = known(cx, f), known(cy, f)
        if x is not None and x == y:
            return True
    return False


def _weight_hash_mismatch(field: str, x, y, cx: dict, cy: dict, labels: Pair[str], fix: str) -> ContractMismatch:
    """A weight sha256 that differs, judged independent of dtype: a real difference (warn) when both
    sides held the weights in one dtype or their dtype-independent fingerprints (``WEIGHT_HASHES``)
    differ; else the same weights in another dtype, a cast (info), said with the fingerprint that
    proves it or with the dtypes that make the bytes differ."""
    row = WORDED[field]
    severity, template, stages = row.severity, row.message, row.shows
    fp = WEIGHT_HASHES[field]
    fx, fy = known(cx, fp), known(cy, fp)
    dx, dy = weights_dtype(cx), weights_dtype(cy)
    msg = template.format(x=x, y=y, xs=_short(x), ys=_short(y), lx=labels.x, ly=labels.y)
    if fx is not None and fy is not None:
        if fx != fy:
            return ContractMismatch(field, severity, x, y, msg + f"; their dtype-independent {fp}s differ too "
                                    f"({labels.x} {_short(fx)}, {labels.y} {_short(fy)}): other weights, not a cast",
                                    stages, fix)
        return ContractMismatch(field, "info", x, y, f"{field}: the same weights in another dtype (a cast): "
                                f"{fp} {_short(fx)} on both sides; the sha256 is of the {dx or '?'} / {dy or '?'} "
                                "bytes", (), "")
    if dx and dy and dx != dy:
        return ContractMismatch(field, "info", x, y, f"{field}: the same weights in another dtype (a cast), as far "
                                f"as the contract can tell: {labels.x} holds the {_WEIGHT_WORDS[field]} in {dx}, "
                                f"{labels.y} in {dy}, so their bytes hash differently; not compared (no {fp} "
                                "recorded on both sides)", (), f"record both sides in one dtype to compare the "
                                f"{_WEIGHT_WORDS[field]}")
    return ContractMismatch(field, severity, x, y, msg, stages, fix)


def _short(v) -> str:
    return "none" if v is None else (str(v)[:10] if isinstance(v, str) else str(v))


def unknown_fix(contract: dict) -> str:
    """What to do about a fact the trace's engine hid: check that engine's version against the range
    specdiff's recorder was tested on (``EngineSpec.tested_range``); the engine is the one the
    ``unobservable`` entries or the ``engine`` fact name."""
    names = [e[0] for e in (unobservable_engine(u) for u in contract.get("unobservable") or []
                            if isinstance(u, dict)) if e] + [str(known(contract, "engine") or "")]
    for name in names:
        try:
            spec = engine_spec(name)
        except UnknownEngineError:
            continue
        lo, hi = spec.tested_range
        return (f"check the {spec.title} version against specdiff's tested range ({spec.title} "
                f"{lo if lo == hi else f'{lo}-{hi}'})")
    return "check the engine version against specdiff's tested range"


def _unknown_fact_line(field: str, why: str, label: str, c: dict, stages: tuple, x, y) -> ContractMismatch:
    """The line for a fact ``c`` (side ``label``) recorded as unknown. The fix names the engine version
    only when the engine's ``unobservable`` list says which of its names hid the fact, the recorder's own
    fix when it said why it could not settle the fact (``unknown_reasons``); a fact an older
    recorder left unknown is re-recorded. An engine's aux concat order is its ``aux_hf_indices`` (every
    engine appends the captures in its layer loop: SGLang 0.5.23 llama.py:486-494, tracer/contract.py
    ``aux_slot_layers``), so that one is an info, not a warning."""
    named = any(field in (u.get("facts") or []) for u in c.get("unobservable") or [] if isinstance(u, dict))
    reason = (c.get("unknown_reasons") or {}).get(field)
    fix = (reason["fix"] if isinstance(reason, dict) and reason.get("fix") else unknown_fix(c) if named else
           f"re-record {label} with the current recorder (it reads {field} from the live engine)")
    hf = c.get("aux_hf_indices")
    if field == AUX_CONCAT_ORDER and c.get("side") == "serve" and isinstance(hf, (list, tuple)):
        return ContractMismatch(field, "info", x, y, f"{field} is unknown on {label} ({why}): the engine "
                                f"concatenates in layer order, so its slots are read as aux_hf_indices {list(hf)}",
                                stages, fix)
    return ContractMismatch(field, "warn", x, y, f"{field} is unknown on {label} ({why}): not compared", stages, fix)


def _short_value(field: str, v) -> str:
    return v[:12] if isinstance(v, str) and (field.endswith("sha256") or field.endswith("fingerprint")) else str(v)


#: run dtypes whose copy of a bf16 or fp32 checkpoint gives the same ``weights_fingerprint``: it rounds to
#: bf16 itself (tracer/contract.py). A float16 copy rounds weights below 2**-14 (float16's subnormals) and
#: fp32 values a second time, so its fingerprint can differ from the same weights' in bf16 (measured:
#: 3 of the 5 tiny family targets' bf16 embeddings change fingerprint when cast to float16).
FINGERPRINT_EXACT_DTYPES = frozenset({"float32", "bfloat16"})


def target_run_dtype(contract: dict) -> str | None:
    """The dtype a side ran its target in: record train's ``target_dtype``, else the engine's ``dtype``."""
    for key in ("target_dtype", "dtype"):
        v = contract.get(key)
        if isinstance(v, str) and v != UNKNOWN:
            return v.replace("torch.", "")
    return None


def _lossy_cast(cx: dict, cy: dict) -> tuple[str, str] | None:
    """(x dtype, y dtype) when the two sides ran the target in different dtypes and one of them is not
    in ``FINGERPRINT_EXACT_DTYPES`` (so a cast alone may change the fingerprint), else None."""
    dx, dy = target_run_dtype(cx), target_run_dtype(cy)
    if dx and dy and dx != dy and not {dx, dy} <= FINGERPRINT_EXACT_DTYPES:
        return dx, dy
    return None


def target_differences(traces: Pair) -> list[tuple[str, object, object]]:
    """(field, x, y) for each ``TARGET_IDENTITY`` fact both traces recorded (not ``unknown``)
    whose values differ; empty when the targets agree or cannot be compared. A fingerprint that
    differs between sides that ran the target in different dtypes, one of them lossy for the
    fingerprint (float16), is not counted: a cast may explain it (``fingerprint_cast_note``)."""
    cx, cy = traces.x.contract, traces.y.contract
    out = []
    for field in TARGET_IDENTITY:
        if field not in cx or field not in cy or UNKNOWN in (cx[field], cy[field]):
            continue
        if field == "target_weights_fingerprint" and _lossy_cast(cx, cy):
            continue
        if cx[field] != cy[field]:
            out.append((field, cx[field], cy[field]))
    if one_target_by_weights(traces):  # one target: its config is a contract difference (one_target_config)
        out = [d for d in out if d[0] == WEIGHTS]
    return out


#: the identity fact that decides whether two traces ran one target: only other weights are another model
WEIGHTS = "target_weights_fingerprint"


def one_target_by_weights(traces: Pair) -> bool:
    """Both traces recorded the target's weight fingerprint (bf16-rounded, dtype-independent: tracer/
    contract.py), known, and equal: one target, whatever its config says (an engine option such as SGLang's
    ``--json-model-override-args`` or vLLM's ``--hf-overrides`` changes the config, not the weights)."""
    cx, cy = traces.x.contract, traces.y.contract
    return WEIGHTS in cx and WEIGHTS in cy and UNKNOWN not in (cx[WEIGHTS], cy[WEIGHTS]) and cx[WEIGHTS] == cy[WEIGHTS]


def one_target_config(traces: Pair, labels: Pair[str]) -> list[ContractMismatch]:
    """The identity facts other than the weights (architecture, config hash, MoE routing) that differ
    between two traces of one target (``one_target_by_weights``): each a contract difference from ``target.aux``
    with its fix, never "different targets" (a rope scaling set at serving by ``--json-model-override-args``
    is a config difference on the same weights, not another model). The config keys themselves are
    named by ``target_config.*`` and the option that set each by ``target_config_overrides.*``
    (fact_diff.py)."""
    if not one_target_by_weights(traces):
        return []
    cx, cy = traces.x.contract, traces.y.contract
    return [mismatch(f, cx[f], cy[f], labels) for f in TARGET_IDENTITY
            if f != WEIGHTS and f in cx and f in cy and UNKNOWN not in (cx[f], cy[f]) and cx[f] != cy[f]]


def fingerprint_cast_note(traces: Pair, labels: Pair[str]) -> list[ContractMismatch]:
    """One info line when the weight fingerprints differ but a lossy dtype cast may explain it (the
    fingerprint is then not compared; architecture and config hash still are)."""
    cx, cy = traces.x.contract, traces.y.contract
    f = "target_weights_fingerprint"
    cast = _lossy_cast(cx, cy)
    if not cast or f not in cx or f not in cy or UNKNOWN in (cx[f], cy[f]) or cx[f] == cy[f]:
        return []
    return [ContractMismatch(f, "info", cx[f], cy[f],
                             f"target weight fingerprints differ, but {labels.x} ran the target in {cast[0]} and "
                             f"{labels.y} in {cast[1]}: a cast rounds small weights differently, so the fingerprint "
                             "cannot tell a cast from other weights; not compared",
                             (), "record both sides in the same dtype to compare the weights")]


def refuse_different_targets(traces: Pair) -> None:
    """Stop a diff of two traces recorded on different target models, before any comparison.

    Raises:
        DifferentTargetsError: one line naming every identity fact that differs with both values
            (hashes cut to 12 hex digits), e.g. ``traces of different targets: target_weights_fingerprint
            1a2b3c4d5e6f (training) vs 9f8e7d6c5b4a (serving); ...``; the CLI exits 2 on it.
    """
    diffs = target_differences(traces)
    if not diffs:
        return

    labels = side_names(traces)
    parts = "; ".join(f"{f} {_short_value(f, x)} ({labels.x}) vs {_short_value(f, y)} ({labels.y})"
                      for f, x, y in diffs)
    raise DifferentTargetsError(f"traces of different targets: {parts}; nothing is compared (record both sides on "
                                "the same target model)")


def _identity_not_compared(traces: Pair, labels: Pair[str]) -> list[ContractMismatch]:
    """One line per side whose target identity cannot be compared: facts ``unknown`` there, or none
    recorded (a trace written before they existed) while the other side has them."""
    out = []
    for label, c, other in ((labels.x, traces.x.contract, traces.y.contract),
                            (labels.y, traces.y.contract, traces.x.contract)):
        unknown = [f for f in TARGET_IDENTITY if c.get(f) == UNKNOWN]
        if unknown:
            why = unknown_facts(c)[unknown[0]]
            out.append(ContractMismatch("target_identity", "info", None, None,
                                        f"target identity facts {', '.join(unknown)} are unknown on {label} ({why}): "
                                        "not compared", (), unknown_fix(c)))
        elif not any(f in c for f in TARGET_IDENTITY) and any(f in other for f in TARGET_IDENTITY):
            out.append(ContractMismatch("target_identity", "info", None, None,
                                        f"{label} records no target identity (a trace written before specdiff "
                                        "recorded it): whether both sides ran the same target is not compared", (),
                                        "re-record that side to compare the targets"))
    return out


#: engine -> (why its ids went missing, the fix): SGLang 0.5.23 numbers ids per model file
#: (eagle3/families.py FamilyRule; plus-one: srt/models/llama.py:929-941, 486-494: id L-1 names capture
#: index L, never reached; deepseek_v2.py:3458-3473 literal unless ids[0] == 1); vLLM 0.32.0 (llama.py:427-441: only ids 0..L name
#: a capture point, an id outside never matches: interfaces.py:1577-1578 keeps it in the set, no layer has it)
DROPPED_WORDS = {
    "sglang": ("SGLang's numbering for this target (contract aux_capture_rule) maps them to no layer that runs: "
               "an id past the last layer, or id L-1 under the plus-one rule of llama.py / qwen3.py",
               "use ids the target's rule maps to layers 0..L-1 (`specdiff check` prints them; plus-one "
               "families: -1..L-2, id k = HF k+1)"),
    "vllm": ("vLLM captures ids 0..L only: id k = HF k, so an SGLang-style -1 or an id past L matches no layer",
             "write vLLM ids 0..L-1 at the top-level eagle_aux_hidden_state_layer_ids (vLLM id k = HF k; "
             "-1 for the embeddings is SGLang's numbering, vLLM's is 0)"),
}


def dropped_words(contract: dict) -> tuple[str, str]:
    """(why, fix) for aux ids the trace's engine dropped (``DROPPED_WORDS``; no ``engine`` fact: SGLang)."""
    name = str(known(contract, "engine") or "sglang")
    return DROPPED_WORDS.get(name, ("the engine captured no layer for them",
                                    "use ids the engine captures (its aux-id convention)"))


def _concat_ranks(order) -> list[int] | None:
    """Where each aux slot's layer ranks among the slots (``[6, 0, 3]`` -> ``[2, 0, 1]``): two concat
    orders differ as orders only when these differ; None when ``order`` is not a list."""
    if not isinstance(order, (list, tuple)):
        return None
    return [sorted(order).index(v) for v in order]


def specforge_warnings(label: str, contract: dict) -> list[ContractMismatch]:
    """One warning per disagreement ``record train`` found between what SpecForge recorded of the run (the
    checkpoint's provenance, the config's capture contract) and that recording (contract ``specforge_contract``,
    replay/record/specforge_contract.py): field ``specforge_contract.<fact>``, values (SpecForge's, the
    recording's), said on side ``label``, acting from the fact table's stage on, with the recorded fix."""
    rec = contract.get("specforge_contract")
    out = []
    for d in rec.get("disagreements") or [] if isinstance(rec, dict) else []:
        key = f"specforge_contract.{d.get('fact')}"
        row = fact_row(key)
        stages = tuple(STAGE_ORDER[STAGE_ORDER.index(row.stage):]) if row is not None else ()
        out.append(ContractMismatch(key, "warn", d.get("specforge"), d.get("recording"), f"{label}: {d.get('message')}",
                                    stages, d.get("fix") or (row.fix if row is not None else "")))
    return out


def check_contracts(traces: Pair) -> list[ContractMismatch]:
    """Every known contract field present on both sides whose values differ, most severe first.

    Fields missing on one side are not reported (an engine may not know them); a field recorded
    as ``"unknown"`` is reported as unknown (with the engine name that hid it), never compared;
    ``aux_dropped_ids`` is reported whenever non-empty, in that engine's words (``dropped_words``), and a
    training side's disagreements with what SpecForge recorded of its run as its own (``specforge_warnings``).
    Sides are named by ``types.side_names`` (two engines: each by its engine and version) and
    fixes in the serving engine's own key and numbering (``engine_fix``). Target identity
    (``TARGET_IDENTITY``) is refused earlier when it differs (``refuse_different_targets``); here
    only an identity that cannot be compared is said, once per side.
    """
    cx, cy = traces.x.contract, traces.y.contract
    labels = side_names(traces)
    out: list[ContractMismatch] = (_identity_not_compared(traces, labels) + fingerprint_cast_note(traces, labels)
                                   + one_target_config(traces, labels))
    for label, c, is_x in ((labels.x, cx, True), (labels.y, cy, False)):
        for field, why in unknown_facts(c).items():
            if field in TARGET_IDENTITY:
                continue  # said once, above
            other = (cy if is_x else cx).get(field)
            x, y = (UNKNOWN, other) if is_x else (other, UNKNOWN)
            stages = WORDED[field].shows if field in WORDED else ()
            out.append(_unknown_fact_line(field, why, label, c, stages, x, y))
    for field, row in WORDED.items():
        severity, template, stages = row.severity, row.message, row.shows
        if field not in cx or field not in cy or UNKNOWN in (cx[field], cy[field]):
            continue
        x, y = cx[field], cy[field]
        if isinstance(x, tuple):
            x = list(x)
        if isinstance(y, tuple):
            y = list(y)
        if x == y:
            continue
        if field == AUX_CONCAT_ORDER and _concat_ranks(x) == _concat_ranks(y):
            continue  # the same order of other layers: aux_hf_indices says which, so say it once
        fix = engine_fix(field, traces)
        if field in WEIGHT_HASHES:
            out.append(_weight_hash_mismatch(field, x, y, cx, cy, labels, fix))
            continue
        msg = template.format(x=x, y=y, xs=_short(x), ys=_short(y), lx=labels.x, ly=labels.y)
        out.append(ContractMismatch(field, severity, x, y, msg, stages, fix))
    for label, t in ((labels.x, traces.x), (labels.y, traces.y)):
        dropped = t.contract.get("aux_dropped_ids") or []
        if dropped and dropped != UNKNOWN:
            why, fix = dropped_words(t.contract)
            out.append(ContractMismatch("aux_dropped_ids", "error", dropped, None,
                                        f"{label}: aux ids {dropped} are silently dropped by the engine ({why})",
                                        fact_row("aux_dropped_ids").shows, fix))
        out += specforge_warnings(label, t.contract)
    out += fact_differences(traces, worded=frozenset(WORDED) | frozenset(TARGET_IDENTITY) | {"aux_dropped_ids"})
    rank = {"error": 0, "warn": 1, "info": 2}
    return sorted(out, key=lambda m: rank[m.severity])
