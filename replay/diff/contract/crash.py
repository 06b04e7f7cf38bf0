"""A side whose engine crashed: the crash as the first divergence, where that side stopped and why.

The crash record (contract ``crash``, tracer/crash.py) names the forward that raised and the
requests of that iteration; the recorder also keeps what the iteration recorded before it raised
(e.g. the target's prefill rows of the crashing prompt) and ``record train --replay`` replays the
crashing prompts. The diff then has rows up to the point where the crashed side stopped:

- the **stage** where it stopped is the first stage of the forward that raised
  (``FORWARD_STAGES``: a target forward -> ``target.aux``, a draft extend -> ``draft.fc_in``, a
  draft decode step -> ``draft.attn_in``, anything outside the model forwards -> ``verify``);
- the crash **leads** (is the first divergence) unless a value divergence was found at an earlier
  stage: that one happened first and stays the headline, the crash is reported beside it. A layout
  (structure) difference before the stage does not lead: it is what the crash's cause predicts
  (2 aux slots where fc was built for 3), listed as ``recorded_before`` evidence;
- the **cause** is, in order: an aux id the crashed engine dropped (contract ``aux_dropped_ids``,
  with the pre-flight finding's per-family reason and fix when the models are at hand; the engine
  source lines that make a dropped id a crash), else the pre-flight finding ranked first for the
  crash (findings.crash_findings), else a contract difference that can act at the stage
  (contract/facts.py ``causes_at``).
"""

from __future__ import annotations

from specdiff.eagle3.aux_layers import RULES
from specdiff.eagle3.engines import REGISTRY
from specdiff.eagle3.families import sglang_family_rule
from specdiff.replay.diff.contract.check import dropped_words
from specdiff.replay.diff.contract.facts import causes_at
from specdiff.replay.diff.types import Alignment, Explanation, Pair
from specdiff.tracer.contract import known
from specdiff.tracer.crash import describe_crash
from specdiff.tracer.schema import STAGE_ORDER, spec_for

#: the crash record's forward name (tracer/crash.py) -> the first stage that forward computes
FORWARD_STAGES = (("target", "target.aux"), ("draft decode", "draft.attn_in"), ("draft", "draft.fc_in"))
_OUTSIDE = "verify"



def crash_stage(crash: dict) -> str:
    """The stage where the crashed side stopped (``FORWARD_STAGES``), from the crash's forward name."""
    forward = str(crash.get("forward", ""))
    return next((stage for prefix, stage in FORWARD_STAGES if forward.startswith(prefix)), _OUTSIDE)


def _crashed(traces: Pair, labels: Pair, crash: dict):
    """(crashed trace, other trace, True when the crashed side is y); pipeline.crash_record takes x first."""
    if isinstance(traces.x.contract.get("crash"), dict):
        return traces.x, traces.y, False
    return traces.y, traces.x, True


def crash_divergence(traces: Pair, labels: Pair, alignment: Alignment, comps: dict, first, crash: dict):
    """Where the crashed side stopped and whether the crash is the first divergence.

    Args:
        traces, labels: both sides; crash: ``{"label": side, **contract crash}`` (pipeline.crash_record).
        alignment, comps: the diff's sequence pairs and comparisons (empty when nothing paired).
        first: the first diverging comparison, or None.
    Returns:
        ``(first, crash)``: ``first`` is None when the crash leads (module doc); ``crash`` is a copy
        with ``stage``, ``sequences`` (per crashing request: rid, the crashed side's seq id, the
        aligned pair index or None, prompt_len, tokens) and ``recorded_before`` (per compared tensor
        before the stage: "agrees", "diverges" or the layout difference).
    """
    crash = dict(crash)
    stage = crash_stage(crash)
    crash["stage"] = stage
    side, _, on_y = _crashed(traces, labels, crash)
    pair_of = {(p.seq.y if on_y else p.seq.x): p.index for p in alignment.seq_pairs}
    by_rid = {s.rid: s for s in side.sequences}
    ids_of = {str(r.get("rid")): r.get("input_ids") for r in crash.get("requests") or []}
    seqs = []
    for rid in crash.get("rids") or list(ids_of):
        s = by_rid.get(rid)
        ids = ids_of.get(rid)
        seqs.append({"rid": rid, "seq": None if s is None else int(s.id),
                     "pair": None if s is None else pair_of.get(int(s.id)),
                     "prompt_len": int(s.prompt_len) if s is not None else len(ids) if isinstance(ids, list) else None,
                     "tokens": int(len(s.tokens)) if s is not None else None})
    crash["sequences"] = seqs
    idx = STAGE_ORDER.index(stage)
    before = {}
    for name, c in comps.items():
        if spec_for(name).stage_index >= idx:
            continue
        before[name] = (c.structure.message if c.kind == "structure" and c.structure is not None
                        else "diverges" if c.diverged else "agrees")
    crash["recorded_before"] = before
    leads = first is None or first.kind != "values" or spec_for(first.name).stage_index >= idx
    return (None if leads else first), crash


def _dropped_cause(crashed: dict, other: dict, crash: dict, findings: list[dict], labels: Pair, on_y: bool):
    """An aux id the crashed engine dropped, as the cause of a crash in a draft forward (module doc)."""
    dropped = known(crashed, "aux_dropped_ids") or []
    if not dropped or not str(crash.get("forward", "")).startswith("draft"):
        return None
    engine = str(known(crashed, "engine") or "")
    spec = REGISTRY.get(engine)  # eagle3/engines.py; None: an engine specdiff does not know
    name = spec.title if spec is not None else engine or "the engine"
    fc_site = spec.fc_width_site if spec is not None else ""
    version = known(crashed, "engine_version")
    L = known(crashed, "num_layers")
    i = int(dropped[0])
    if isinstance(L, int) and i >= L:
        head = f"aux id {i} is past the target's last layer ({L} layers)"
    elif isinstance(L, int) and spec is not None and i - L in RULES[spec.aux_convention].unreached:
        head = f"aux id {i} asks for the output of the target's last layer ({L} layers), which {name} cannot capture"
    else:
        head = f"aux id {i} names no layer {name} captures" + (f" ({L} layers)" if L else "")
    finding = next((f for f in findings if f.get("kind") == "aux.dropped_id" and f.get("engine") in (engine, "all")
                    and f" id {i} " in f" {f.get('message', '')} "), None)
    # the pre-flight's per-family reason ("maps to capture index 9, which is never reached (only layers 0..7
    # run)"), else the recorder's own word that the engine dropped it
    why = (str(finding["message"]).split(f"id {i} ", 1)[-1].split(":")[0].replace("maps to", "maps it to", 1)
           if finding is not None
           else "drops it")
    rule = str(known(crashed, "aux_capture_rule") or "")
    cite = rule.split(" ", 1)[1] if rule.startswith(f"{engine} ") else rule  # "srt/models/llama.py:929 ..."
    got, want = known(crashed, "aux_hf_indices"), known(crashed, "aux_native_ids")
    slots = (f"{len(got)} of the {len(want)} aux slots the draft's fc was built for arrive"
             if isinstance(got, list) and isinstance(want, list) else "the draft's fc gets fewer aux slots than "
             "it was built for")
    site = crash.get("engine_where") or (crash.get("where") or [""])[-1]
    site_short = site.split(": ", 1)[0]
    message = (f"{head}: {name}{' ' + str(version) if version else ''} {why}" + (f" ({cite})" if cite else "")
               + f", so {slots}" + (f" and it raises at {site_short}" if site_short else ""))
    L_ = L if isinstance(L, int) else None
    plus_one = (spec is not None and spec.aux_family_rules
                and sglang_family_rule(known(crashed, "target_architecture")).name == "plus-one")
    fix = (finding or {}).get("fix") or (
        f"use ids in -1..{L_ - 2 if L_ else 'L-2'} (id k = HF k+1; -1 = embeddings)" if plus_one
        else dropped_words(crashed)[1])
    x_aux = known(other, "aux_hf_indices")
    pair = (x_aux, got) if on_y else (got, x_aux)
    evidence = [f"contract aux_dropped_ids ({crash.get('label')}): {list(dropped)}",
                f"contract aux_hf_indices: {labels.x} {pair[0]} vs {labels.y} {pair[1]}"]
    if finding is not None:
        evidence.append(f"pre-flight [{finding.get('severity')}] aux.dropped_id: {finding['message']}")
    if fc_site:
        evidence.append(f"{name} sizes fc by the configured ids: {fc_site}")
    if site:
        evidence.append(f"{name} raised at {site}")
    return {"kind": "contract.aux_dropped_ids", "message": message, "fix": fix, "evidence": evidence}


def crash_cause(traces: Pair, labels: Pair, crash: dict, findings: list[dict], mismatches: list) -> dict | None:
    """What predicts the crash: ``{"kind", "message", "fix", "evidence"}`` (module doc, in that
    order), or None when nothing recorded or checked does.

    Args:
        findings: pre-flight findings for the crash (findings.crash_findings), likeliest first.
        mismatches: the contract mismatches (contract/check.py check_contracts).
    """
    side, other, on_y = _crashed(traces, labels, crash)
    cause = _dropped_cause(side.contract, other.contract, crash, findings, labels, on_y)
    if cause is not None:
        return cause
    if findings:
        f = findings[0]
        return {"kind": f"preflight.{f['kind']}", "message": f"pre-flight finding {f['kind']}: {f['message']}",
                "fix": f.get("fix", ""), "evidence": []}
    for m in causes_at(crash.get("stage") or crash_stage(crash), mismatches):
        return {"kind": f"contract.{m.field}", "message": m.message, "fix": m.fix,
                "evidence": [f"contract {m.field}: {m.x} vs {m.y}"]}
    return None


def crash_verdict(crash: dict) -> str:
    """The report's one-line verdict when the crash leads."""
    where = ""
    seqs = crash.get("sequences") or []
    if crash.get("stage"):
        at = []
        for s in seqs[:2]:
            plen = f", {s['prompt_len']} prompt tokens" if s.get("prompt_len") is not None else ""
            # the aligned pair is the "seq" every other verdict names; else the request alone
            name = (f"seq {s['pair']} {s['rid']}" if s.get("pair") is not None else
                    f"{crash['label']} seq {s['seq']} {s['rid']}" if s.get("seq") is not None else f"request {s['rid']}")
            at.append(f"{name}{plen}")
        more = f", +{len(seqs) - 2} more" if len(seqs) > 2 else ""
        where = f" at {crash['stage']}" + (f" ({'; '.join(at)}{more})" if at else "")
    cause = crash.get("cause")
    why = f" — {cause['message']}" if cause else " — no contract difference or pre-flight finding explains it"
    return f"first divergence: {crash['label']} crashed{where}: {describe_crash(crash)}{why}"


def crash_text(crash: dict) -> list[str]:
    """Text-report lines after the crash's exception and shapes: the requests, what was recorded
    before the stage, the cause with its evidence and fix."""
    out = []
    for s in crash.get("sequences") or []:
        got = ("its token ids are unknown" if s.get("prompt_len") is None else
               f"{s['prompt_len']} prompt tokens" + (f", {s['tokens']} recorded" if s.get("tokens") else
                                                      ", ids in the crash record only"))
        out.append(f"  request {s['rid']}: {got}" + (f", aligned as seq {s['pair']}" if s.get("pair") is not None
                                                     else ", not aligned (replay it: record train --replay)"))
    before = crash.get("recorded_before") or {}
    if before:
        agree = [n for n, v in before.items() if v == "agrees"]
        said = ([f"{', '.join(agree)} agree"] if agree else []) + [
            v if v.startswith(n) else f"{n}: {v}" for n, v in before.items() if v != "agrees"]
        out.append(f"  recorded before the crash: {'; '.join(said)}")
    cause = crash.get("cause")
    if cause:
        out.append(f"  cause ({cause['kind']}): {cause['message']}")
        out += [f"    {e}" for e in cause.get("evidence") or []]
        if cause.get("fix"):
            out.append(f"    fix: {cause['fix']}")
    return out


def crash_explanations(crash: dict | None, first) -> list:
    """The crash's cause as the report's explanation (``types.Explanation``, cause = the cause's
    kind) when the crash is the first divergence; empty otherwise (``first`` keeps its own)."""
    cause = None if crash is None or first is not None else crash.get("cause")
    if not cause:
        return []
    return [Explanation(cause["kind"], cause["message"], tuple(cause.get("evidence") or ()), cause.get("fix", ""))]
