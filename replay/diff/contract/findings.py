"""Pre-flight findings (``specdiff check``) that bear on a divergence, for the diff and the app.

Each serving trace names its target and draft (contract ``model_name`` / ``draft_name``); when
those directories exist here, the pre-flight check runs on them by the rules of the engine that
recorded the trace (its ``engine`` fact: SGLang's or vLLM's key precedence and numbering), with the
training side's aux layers, and the findings whose kind concerns the first diverging stage are
shown next to it.
Findings a recorder stored in a contract (field ``findings``) are used as well. The directories are
found from any working directory (``tracer.paths.contract_path``); a recorded path that is not found
here is one line of the report (``unfound_paths``), never a silently missing section.
"""

from __future__ import annotations

from specdiff.replay.diff.types import Pair
from specdiff.tracer.contract import aux_slot_layers, known
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.paths import contract_path, is_model_dir
from specdiff.tracer.schema import spec_for

# Which finding kinds can explain a divergence at each stage.
STAGE_KINDS = {
    "tokens": ("tokenizer.",),
    "target.aux": ("aux.", "training."),
    "target.aux_cat": ("aux.", "training."),
    "draft.fc_in": ("norm.", "weights.", "aux."),
    "draft.fc_out": ("norm.", "weights.", "aux."),
    "draft.positions": ("rope.",),
    "draft.attn_in": ("weights.", "rope."),
    "draft.hidden_out": ("weights.", "rope.", "norm."),
    "draft.logits": ("weights.", "vocab."),
    "draft.topk": ("weights.", "vocab."),
    "draft.topk_target": ("vocab.",),
    "verify": ("vocab.", "algorithm."),
}


def _serving_findings(traces: Pair) -> list[dict]:
    """Pre-flight findings on each serving trace's target and draft, by the rules of the engine that
    recorded it (its ``engine`` fact; SGLang for a trace without one), with the training side's aux
    layers when one side is training."""
    train = next((t for t in (traces.x, traces.y) if t.side != "serve"), None)
    out: list[dict] = []
    for serve in (t for t in (traces.x, traces.y) if t.side == "serve"):
        out += _preflight_of(serve, train)
    return out


#: (trace side, contract fact) -> what a report leaves out when the path it names is not found here
NEEDS = {
    ("serve", "model_name"): "the pre-flight check (specdiff check) on the served models did not run",
    ("serve", "draft_name"): "the pre-flight check (specdiff check) on the served models did not run",
    ("train", "draft_name"): "the training draft cannot be re-run; give it: {command} --draft DIR",
}


def unfound_paths(traces: Pair, labels: Pair, *, draft_given: bool = False) -> list[str]:
    """One line per model path a contract records that is not found here (``tracer.paths``), with
    what the report leaves out for it (``NEEDS``); empty when every one is found. ``draft_given``:
    the user gave the training draft (``diff --draft DIR``), so the training side's draft_name
    is not needed (the line would tell them to give what they gave)."""
    out = []
    command = f"specdiff diff {traces.x.path} {traces.y.path}"
    for trace, label in ((traces.x, labels.x), (traces.y, labels.y)):
        side = "serve" if trace.side == "serve" else "train"
        for fact in ("model_name", "draft_name"):
            need = NEEDS.get((side, fact))
            if need is None or (draft_given and (side, fact) == ("train", "draft_name")):
                continue
            found = contract_path(trace, fact, want=is_model_dir)
            if found.missing:
                out.append(f"{label}: {found.message()}: {need.format(command=command)}")
    return out


def _preflight_of(serve, train) -> list[dict]:
    target = contract_path(serve, "model_name", want=is_model_dir).path
    draft = contract_path(serve, "draft_name", want=is_model_dir).path
    if target is None or draft is None:
        return []  # unfound_paths says which
    from specdiff.replay.preflight.check import (  # reads configs and weight headers
        ENGINES,
        findings_as_facts,
        run_preflight,
    )

    engine = str(known(serve.contract, "engine") or "sglang")
    if engine not in ENGINES:
        return []  # no pre-flight rules for this engine
    layers = aux_slot_layers(train.contract) if train is not None else None  # training's concat order
    if train is not None and known(train.contract, "aux_prenorm_indices"):
        # a slot listed as L that holds the last layer's pre-norm output (GPT-OSS): as HF indices the check
        # would read it as hidden_states[L] (after the norm) and report a false mismatch; the contract check
        # compares aux_hf_indices and aux_prenorm_indices of the two traces instead
        layers = None
    try:
        # the dtype the server really ran (its contract), not SGLang's --dtype auto guess from the config
        served = str(known(serve.contract, "dtype") or "auto").replace("torch.", "")
        report = run_preflight(target, draft, engines=(engine,),
                               training_layers=list(layers) if layers else None, training_convention="hf",
                               served_dtype=served)
    except SpecdiffError:
        return []
    return findings_as_facts(report.findings)


def matching_findings(traces: Pair, first) -> list[dict]:
    """error/warn findings whose kind concerns the first divergence's stage (empty if none)."""
    if first is None:
        return []
    return findings_of_kinds(traces, STAGE_KINDS.get(spec_for(first.name).stage, ()))


#: Which finding kinds can explain a crash in each kind of forward (tracer/crash.py names).
CRASH_KINDS = {
    "draft": ("aux.", "norm.", "weights.", "rope.", "vocab.", "algorithm."),
    "target": ("aux.", "weights.", "algorithm."),
    "other": ("vocab.", "algorithm.", "aux."),
}


def crash_findings(traces: Pair, crash: dict) -> list[dict]:
    """error/warn findings that can explain a crash, the likeliest first: errors, then those that
    predict this exception's message (e.g. aux.slot_count predicts 'mat1 and mat2 shapes ...')."""
    forward = str(crash.get("forward", ""))
    side = "draft" if forward.startswith("draft") else "target" if forward.startswith("target") else "other"
    found = findings_of_kinds(traces, CRASH_KINDS[side])
    head = str(crash.get("message", "")).split("(")[0].strip().lower()

    def rank(f):
        msg = str(f.get("message", "")).lower()
        return (f.get("severity") != "error", not (head and head in msg), "crash" not in msg)

    return sorted(found, key=rank)


def _draft_key(trace) -> str:
    """The draft a contract names, as one string whoever recorded it: the directory found here
    (symlinks resolved; one side may hold a relative path, the other an absolute one), else as recorded."""
    found = contract_path(trace, "draft_name", want=is_model_dir)
    return str(found.path.resolve()) if found.path is not None else str(found.recorded)


def findings_of_kinds(traces: Pair, prefixes: tuple[str, ...]) -> list[dict]:
    """error/warn findings (pre-flight on the serving trace's models, and any stored in either
    contract) whose kind starts with one of ``prefixes``, without duplicates. A training contract's
    stored findings about the serving engine are left out when that engine served another
    checkpoint than the one training loaded and the served one's pre-flight ran."""
    found = _serving_findings(traces)
    engines = {"all"} | {str(t.contract["engine"]) for t in (traces.x, traces.y)
                         if t.side == "serve" and t.contract.get("engine")}
    served = {_draft_key(t) for t in (traces.x, traces.y) if t.side == "serve"}
    for trace in (traces.x, traces.y):
        stored = [f for f in trace.contract.get("findings") or [] if isinstance(f, dict)]
        if found and trace.side != "serve" and _draft_key(trace) not in served:
            # record train's findings judge the checkpoint it loaded in every engine; the engine served
            # another copy (the demo's served draft, a re-export), whose own pre-flight ran above
            stored = [f for f in stored if f.get("engine") not in engines]
        found += stored
    seen, out = set(), []
    for f in found:
        if len(engines) > 1 and f.get("engine") not in engines:
            continue  # a finding about another engine than the one that served
        key = (f.get("kind"), f.get("message"))
        if f.get("severity") in ("error", "warn") and str(f.get("kind", "")).startswith(prefixes) and key not in seen:
            seen.add(key)
            out.append(f)
    return out
