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
  (contract_causes.causes_at).
"""

from __future__ import annotations

from specdiff.replay.diff.align import Alignment, Pair
from specdiff.tracer.contract import known
from specdiff.tracer.crash import describe_crash
from specdiff.tracer.schema import STAGE_ORDER, spec_for

#: the crash record's forward name (tracer/crash.py) -> the first stage that forward computes
FORWARD_STAGES = (("target", "target.aux"), ("draft decode", "draft.attn_in"), ("draft", "draft.fc_in"))
_OUTSIDE = "verify"

#: why a dropped aux id becomes a crash, per engine (read from the engine version the tests serve)
_DROPPED_SOURCES = {
    "sglang": ("SGLang 0.5.23 captures the input of layer id+1 (srt/models/llama.py:941 layers_to_capture = "
               "[val + 1 ...]; the layer loop srt/models/llama.py:486-492 runs layers 0..{last})"),
    "vllm": "vLLM 0.32.0 captures ids 0 (embeddings) .. {L} (after layer {last}) (model_executor/models/llama.py:427-441)",
}
_FC_SOURCES = {"sglang": "srt/models/llama_eagle3.py:156-161", "vllm": "model_executor/models/llama_eagle3.py"}


def crash_stage(crash: dict) -> str:
    """The stage where the crashed side stopped (``FORWARD_STAGES``), from the crash's forward name."""
    forward = str(crash.get("forward", ""))
    return next((stage for prefix, stage in FORWARD_STAGES if forward.startswith(prefix)), _OUTSIDE)


def _crashed(traces: Pair, labels: Pair, crash: dict):
    """(crashed trace, other trace, True when the crashed side is y); report._crash takes x first."""
    if isinstance(traces.x.contract.get("crash"), dict):
        return traces.x, traces.y, False
    return traces.y, traces.x, True


def crash_divergence(traces: Pair, labels: Pair, alignment: Alignment, comps: dict, first, crash: dict):
    """Where the crashed side stopped and whether the crash is the first divergence.

    Args:
        traces, labels: both sides; crash: ``{"label": side, **contract crash}`` (report._crash).
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
    dropped = known(crashed, "aux_dropped_ids") or []
    if not dropped or not str(crash.get("forward", "")).startswith("draft"):
        return None
    engine = str(known(crashed, "engine") or "")
    L = known(crashed, "num_layers")
    i = int(dropped[0])
    if isinstance(L, int) and i >= L:
        head = f"aux id {i} is past the target's last layer ({L} layers)"
    elif isinstance(L, int) and i == L - 1 and engine == "sglang":
        head = f"aux id {i} asks for the output of the target's last layer ({L} layers), which SGLang cannot capture"
    else:
        head = f"aux id {i} names no layer the engine captures" + (f" ({L} layers)" if L else "")
    finding = next((f for f in findings if f.get("kind") == "aux.dropped_id" and f.get("engine") in (engine, "all")
                    and f" id {i} " in f" {f.get('message', '')} "), None)
    src = _DROPPED_SOURCES.get(engine, "")
    if src and isinstance(L, int):
        src = src.format(L=L, last=L - 1)
    why = []
    if finding is not None:
        msg = str(finding["message"])
        why.append(msg.split(f"id {i} ", 1)[-1].split(":")[0])
    elif src:
        why.append(src)
    if finding is not None and src:
        why.append(src)
    got = known(crashed, "aux_hf_indices")
    want = known(crashed, "aux_native_ids")
    k_fc = len(want) if isinstance(want, list) else None
    n_got = len(got) if isinstance(got, list) else None
    site = crash.get("engine_where") or (crash.get("where") or [None])[-1]
    fc = _FC_SOURCES.get(engine, "")
    conseq = (f"so {n_got} of the {k_fc} slots the draft's fc was built for ({fc}) arrive" if n_got is not None
              and k_fc else "so the draft's fc gets fewer slots than it was built for")
    message = f"{head}: {'; '.join(why)}; {conseq}" + (f" and it raises at {site}" if site else "")
    L_ = L if isinstance(L, int) else "L"
    fix = (finding or {}).get("fix") or (f"use ids in -1..{L_ - 2 if isinstance(L_, int) else 'L-2'} (id k = HF k+1; "
                                         "-1 = embeddings)" if engine == "sglang" else
                                         f"use ids the engine maps to layers of the {L_}-layer target")
    x_aux, y_aux = known(other, "aux_hf_indices"), got
    if on_y:
        aux_line = f"contract aux_hf_indices: {labels.x} {x_aux} vs {labels.y} {y_aux}"
    else:
        aux_line = f"contract aux_hf_indices: {labels.x} {y_aux} vs {labels.y} {x_aux}"
    evidence = [f"contract aux_dropped_ids ({crash.get('label')}): {list(dropped)}", aux_line]
    if finding is not None:
        evidence.append(f"pre-flight [{finding.get('severity')}] aux.dropped_id: {finding['message']}")
    return {"kind": "contract.aux_dropped_ids", "message": message, "fix": fix, "evidence": evidence}


def crash_cause(traces: Pair, labels: Pair, crash: dict, findings: list[dict], mismatches: list) -> dict | None:
    """What predicts the crash: ``{"kind", "message", "fix", "evidence"}`` (module doc, in that
    order), or None when nothing recorded or checked does.

    Args:
        findings: pre-flight findings for the crash (findings.crash_findings), likeliest first.
        mismatches: the contract mismatches (contract_check.check_contracts).
    """
    from specdiff.replay.diff.contract_causes import causes_at

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
            n = s.get("pair") if s.get("pair") is not None else s.get("seq")
            plen = f", {s['prompt_len']} prompt tokens" if s.get("prompt_len") is not None else ""
            at.append(f"seq {n if n is not None else '?'} {s['rid']}{plen}")
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
        said = ([f"{', '.join(agree)} agree"] if agree else []) + [f"{n}: {v}" for n, v in before.items()
                                                                   if v != "agrees"]
        out.append(f"  recorded before the crash: {'; '.join(said)}")
    cause = crash.get("cause")
    if cause:
        out.append(f"  cause ({cause['kind']}): {cause['message']}")
        out += [f"    {e}" for e in cause.get("evidence") or []]
        if cause.get("fix"):
            out.append(f"    fix: {cause['fix']}")
    return out
