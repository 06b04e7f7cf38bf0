"""Aux hidden states: which HF layer each aux slot of one side holds (layer shift, the engine's default
layers, two engines that captured different layers) and slots concatenated in another order; the
fix in the serving engine's own id convention and config key (SGLang per target-family rule)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from specdiff.eagle3.aux_layers import ConventionError, engine_capture, native_aux_ids, target_architecture
from specdiff.eagle3.engines import ENGINES, engine_spec
from specdiff.eagle3.families import sglang_family_rule
from specdiff.replay.diff.compare.acceptance import acceptance
from specdiff.replay.diff.explain.sample import mean_rel
from specdiff.replay.diff.types import Alignment, Explanation, Pair, serve_side, side_names, trace_engine
from specdiff.tracer.contract import AUX_IDS_DEFAULT_PREFIX, aux_slot_layers, known
from specdiff.tracer.paths import contract_path, is_model_dir
from specdiff.tracer.schema import aux_name, aux_slot, probe_index


def _hf_candidates(trace) -> dict[int, str]:
    """HF index -> tensor name for every hidden state a trace recorded (aux slots and probes)."""
    out: dict[int, str] = {}
    hf = aux_slot_layers(trace.contract) or []
    for name in trace.names:
        j, i = aux_slot(name), probe_index(name)
        if i is not None:
            out[i] = name
        elif j is not None and j < len(hf):
            out.setdefault(int(hf[j]), name)
    return out


def _fallback_words(trace) -> str | None:
    """'vLLM V1 read no ids from <keys>: it fell back to its default HF [...]' when the trace's
    contract says the engine took no aux ids from the draft config (``aux_ids_source``), else None."""
    src = known(trace.contract, "aux_ids_source")
    if not isinstance(src, str) or not src.startswith(AUX_IDS_DEFAULT_PREFIX):
        return None
    spec = trace_engine(trace)
    runner = str(known(trace.contract, "engine_runner") or "").split(" ")[0].upper()
    who = " ".join(w for w in ((spec.title if spec else "the engine"), runner) if w)
    keys = " or ".join(spec.aux_ids_read) if spec and spec.aux_ids_read else "the draft config"
    return f"{who} read no ids from {keys}: it fell back to its default HF {aux_slot_layers(trace.contract) or '?'}"


def _culprit_is_y(traces: Pair) -> bool:
    """Which side's capture to explain against the other: the serving side against training; of two
    serving sides, the one whose contract shows its engine did not take the configured ids (the
    default fallback, ids dropped), else y."""
    if traces.x.side != traces.y.side:
        return serve_side(traces) == "y"

    def suspect(t):
        return _fallback_words(t) is not None or bool(known(t.contract, "aux_dropped_ids"))
    return not (suspect(traces.x) and not suspect(traces.y))


def explain_aux(traces: Pair, alignment: Alignment, tol_rel: float) -> list[Explanation]:
    """Identify which HF hidden state each aux slot holds, by similarity with the other side.

    The fix is written in the diverging serving side's engine's terms (``EngineSpec.aux_ids_key``
    and its id convention); when that side's contract says the engine read no ids and fell back
    to its default layers (``aux_ids_source``), the explanation says so, transform or not. Two
    serving traces that captured disjoint layers (neither identified in the other) are explained
    from their contracts and acceptance (``_serve_capture_differs``)."""
    labels = side_names(traces)
    # Identify the side with fewer known layers (serving) against the side with probes (training).
    serve_is_y = _culprit_is_y(traces)
    s_trace = traces.y if serve_is_y else traces.x
    o_trace = traces.x if serve_is_y else traces.y
    s_label, o_label = (labels.y, labels.x) if serve_is_y else (labels.x, labels.y)
    cands = _hf_candidates(o_trace)
    slots = sorted(j for j in (aux_slot(n) for n in s_trace.names) if j is not None)
    if not cands or not slots:
        return []
    cols = sorted(cands)
    rel = np.full((len(slots), len(cols)), np.nan)
    for a, j in enumerate(slots):
        for b, i in enumerate(cols):
            names = Pair(cands[i], aux_name(j)) if serve_is_y else Pair(aux_name(j), cands[i])
            rel[a, b] = mean_rel(traces, alignment, names.x, names.y)[0]
    best = [cols[int(np.nanargmin(r))] if np.isfinite(r).any() else None for r in rel]
    closes = [b is not None and rel[a, cols.index(b)] <= tol_rel for a, b in enumerate(best)]
    matrix = {"rows": [f"{s_label} slot {j}" for j in slots], "cols": [f"HF[{i}]" for i in cols],
              "rel": [[None if not np.isfinite(v) else round(float(v), 4) for v in r] for r in rel]}
    s_hf = aux_slot_layers(s_trace.contract) or []
    o_hf = aux_slot_layers(o_trace.contract) or []
    evidence = tuple(
        f"{s_label} slot {j} = {o_label} HF hidden_states[{b}] (rel err {rel[a, cols.index(b)]:.2e})"
        if ok else f"{s_label} slot {j}: no {o_label} layer matches (best HF[{b}], rel err "
                   f"{np.nanmin(rel[a]):.2e})" if np.isfinite(rel[a]).any()
        else f"{s_label} slot {j}: not identified (no readable rows)"
        for a, (j, b, ok) in enumerate(zip(slots, best, closes)))
    identified = [b for b, ok in zip(best, closes) if ok]
    fallback = _fallback_words(s_trace)
    both_serve = traces.x.side == traces.y.side == "serve"
    if not identified:
        if fallback is None and both_serve and o_hf and s_hf and list(s_hf) != list(o_hf):
            return [_serve_capture_differs(traces, alignment, labels, evidence, matrix)]
        if fallback is None or not o_hf or list(s_hf) == list(o_hf):
            return []
        fix, _ = _aux_fix(o_hf, s_trace, o_trace)
        msg = f"{s_label} captured HF {list(s_hf)} where {o_label} used HF {list(o_hf)}: {fallback}"
        if both_serve:
            msg += f" — {s_label}'s draft config causes the divergence"
        ev = evidence + tuple(f"contract {f}: {s_label} {s_trace.contract.get(f)}"
                              for f in ("aux_ids_source", "aux_native_ids", "engine_runner") if f in s_trace.contract)
        return [Explanation("aux_ids_default", msg, ev, fix, matrix)]
    actual = [b if ok else None for b, ok in zip(best, closes)]
    if o_hf and len(o_hf) == len(actual) and all(b is None or b == o for b, o in zip(actual, o_hf, strict=True)):
        # Every slot that matches a layer holds the layer the other side used there: the others hold
        # no layer of the other side at all (another target or its weights), not a layer mix-up.
        return []
    parts = [f"{s_label} slot {j} = {o_label} HF hidden_states[{b}]" for j, b, ok in zip(slots, best, closes) if ok]
    msg = "; ".join(parts[:3])
    shifted = o_hf and len(s_hf) == len(o_hf) and all(s == o + 1 for s, o in zip(s_hf, o_hf))
    if 0 in o_hf and 0 not in [b for b in actual if b is not None]:
        msg += f"; {o_label} slot 0 is the embedding output, which {s_label} never captured"
    fix, rule = _aux_fix(o_hf, s_trace, o_trace) if o_hf else ("", "plus-one")
    spec = trace_engine(s_trace)
    if shifted:
        if spec is None or spec.aux_family_rules:
            how = ("SGLang id k captures HF k+1" if rule == "plus-one"
                   else f"SGLang's {rule} rule on this target") + ", vLLM/speculators id k = HF k"
        else:
            how = "; ".join([spec.aux_id_words] + [engine_spec(n).aux_id_words for n in ENGINES
                                                   if n != spec.name and engine_spec(n).aux_id_words])
        msg += (f"; every layer off by one ({how}): "
                "ids written in one convention and read in another")
    elif o_hf and s_hf:
        msg += f" — layer ids shifted ({s_label} captured HF {s_hf}, {o_label} used {o_hf})"
    if fallback is not None:
        msg += f"; {fallback}"
    if both_serve and (fallback is not None or known(s_trace.contract, "aux_dropped_ids")):
        msg += f" — {s_label}'s draft config causes the divergence"
    return [Explanation("aux_layer_shift", msg, evidence, fix, matrix)]


def _ids_words(trace) -> str:
    """'from ids [..] in <source>' as far as the contract says, else ''."""
    ids, src = known(trace.contract, "aux_native_ids"), known(trace.contract, "aux_ids_source")
    spec = trace_engine(trace)
    src = src or (spec.aux_ids_key if spec and ids is not None else None)
    return (f" from ids {ids}" if ids is not None else "") + (f" in {src}" if src else "")


def _serve_capture_differs(traces: Pair, alignment: Alignment, labels: Pair, evidence, matrix) -> Explanation:
    """Two serving traces captured different layers and neither holds the other's: say what each
    engine captured and from which ids, and blame the side that accepts less (the same draft accepts
    less on the layers it was not trained on); without acceptance on both sides, say it cannot tell."""
    hf = traces.map(lambda t: list(aux_slot_layers(t.contract) or []))
    msg = (f"the engines captured different aux layers: {labels.x} HF {hf.x}{_ids_words(traces.x)}; "
           f"{labels.y} HF {hf.y}{_ids_words(traces.y)}")
    acc = acceptance(traces, alignment).map(lambda a: a.mean_accept_length)
    if acc.x is None or acc.y is None or acc.x == acc.y:
        msg += " — which side's draft config is wrong the traces cannot tell (no acceptance to compare)"
        fixes = [_aux_fix(hf.y, traces.x, traces.y)[0], _aux_fix(hf.x, traces.y, traces.x)[0]]
        return Explanation("aux_capture_differs", msg, evidence,
                           f"on {labels.x}: {fixes[0]}; or on {labels.y}: {fixes[1]} (whichever the draft was "
                           "trained on)", matrix)
    bad_x = acc.x < acc.y
    bad, good = (labels.x, labels.y) if bad_x else (labels.y, labels.x)
    msg += (f" — {bad}'s draft config causes the divergence: the same draft accepts less there (mean accept "
            f"length {min(acc.x, acc.y):.2f} vs {max(acc.x, acc.y):.2f} on {good})")
    fix = _aux_fix(hf.y, traces.x, traces.y)[0] if bad_x else _aux_fix(hf.x, traces.y, traces.x)[0]
    return Explanation("aux_capture_differs", msg, evidence, fix, matrix)


#: one architecture per SGLang rule, to test which rule a serving contract's ids fit
_RULE_ARCH = {"plus-one": "LlamaForCausalLM", "deepseek": "DeepseekV3ForCausalLM", "gpt-oss": "GptOssForCausalLM"}


def _target_arch(traces) -> str | None:
    """The target's architecture: contract ``target_architecture`` (the live server's), else
    ``architectures[0]`` of the config.json in the directory a contract's ``model_name`` names."""
    for t in traces:
        if arch := known(t.contract, "target_architecture"):
            return str(arch)
    for t in traces:
        d = contract_path(t, "model_name", want=is_model_dir).path
        if d is not None:
            try:
                return target_architecture(json.loads((d / "config.json").read_text()))
            except (OSError, ValueError):
                continue
    return None


@dataclass(frozen=True)
class AuxFix:
    """The aux-id fix of one serving side, worded and as data.

    Attributes:
        text: the fix sentence the explanation prints.
        rule: the id rule used ('plus-one', 'deepseek', 'gpt-oss', or a non-SGLang convention).
        key: the draft-config key the ids go in (eagle3/config_keys.py ``ID_KEYS``: the serving
            engine's ``EngineSpec.aux_ids_key``); None when no ids give the layers.
        ids: the ids (ints) to write there, in that engine's numbering for the target; None as ``key``.
    """

    text: str
    rule: str
    key: str | None = None
    ids: list[int] | None = None


def aux_fix(o_hf, s_trace, o_trace) -> AuxFix:
    """The ids, in the serving side's engine's convention and config key (``EngineSpec``), that
    make it capture HF ``o_hf`` (list of int); SGLang's family rules through ``_sglang_aux_fix``. A
    trace without a registered engine is taken as SGLang's (older traces). Never raises: a target
    no ids fit gives ``key``/``ids`` None and says why in ``text``."""
    spec = trace_engine(s_trace)
    if spec is None or spec.aux_family_rules:
        return _sglang_aux_fix(o_hf, s_trace, o_trace)
    L = known(s_trace.contract, "num_layers") or known(o_trace.contract, "num_layers")
    arch = _target_arch((s_trace, o_trace))
    try:
        ids = native_aux_ids(o_hf, spec.aux_convention, num_layers=L, architecture=arch)
    except ConventionError as e:
        return AuxFix(f"no {spec.title} ids give HF {o_hf} on this target: {e}", spec.aux_convention)
    how = f"{spec.title} id = HF index" if list(ids) == list(o_hf) else f"{spec.title} convention for HF {o_hf}"
    return AuxFix(f"set the draft config's {spec.aux_ids_key} to {list(ids)} ({how})", spec.aux_convention,
                  spec.aux_ids_key, list(ids))


def _aux_fix(o_hf, s_trace, o_trace) -> tuple[str, str]:
    """(fix text, rule name) of :func:`aux_fix`."""
    f = aux_fix(o_hf, s_trace, o_trace)
    return f.text, f.rule


def _sglang_fix(o_hf, s_trace, o_trace) -> tuple[str, str]:
    """(fix text, rule name) of :func:`_sglang_aux_fix`."""
    f = _sglang_aux_fix(o_hf, s_trace, o_trace)
    return f.text, f.rule


def _sglang_aux_fix(o_hf, s_trace, o_trace) -> AuxFix:
    """The eagle_config ids that make SGLang feed ``o_hf``, in the rule of
    the target (``eagle3.families.sglang_family_rule``). The rule comes from the target's
    architecture, else from the serving contract's own ids and captured layers (the rules that
    reproduce them, when they agree on the fix), else the plus-one rule is assumed and the fix
    says so."""
    key = engine_spec('sglang').aux_ids_key
    head = f"set the draft config's {key} to "
    L = known(s_trace.contract, "num_layers") or known(o_trace.contract, "num_layers")
    arch = _target_arch((s_trace, o_trace))
    try:
        if arch is not None:
            fam = sglang_family_rule(arch)
            ids = native_aux_ids(o_hf, "sglang", num_layers=L, architecture=arch)
            if fam.name == "plus-one" and fam.known:
                return AuxFix(f"{head}{ids} (SGLang convention for HF {o_hf})", fam.name, key, list(ids))
            return AuxFix(f"{head}{ids} (SGLang {fam.name} rule of {arch}, {fam.sources[0].split(' ')[0]}, for HF "
                          f"{o_hf}" + (f"; {fam.note})" if fam.note else ")"), fam.name, key, list(ids))
        ids_s, hf_s = known(s_trace.contract, "aux_native_ids"), known(s_trace.contract, "aux_hf_indices")
        fits = [] if not (ids_s and hf_s and L) else [
            name for name, a in _RULE_ARCH.items()
            if engine_capture("sglang", ids_s, num_layers=L, architecture=a).hf_indices == tuple(sorted(set(hf_s)))]
        answers = {tuple(native_aux_ids(o_hf, "sglang", num_layers=L, architecture=_RULE_ARCH[n])) for n in fits}
        if len(answers) == 1:
            ids = list(answers.pop())
            if "plus-one" in fits:
                return AuxFix(f"{head}{ids} (SGLang convention for HF {o_hf})", "plus-one", key, ids)
            return AuxFix(f"{head}{ids} (SGLang {fits[0]} rule, read from the serving contract: ids {list(ids_s)} "
                          f"captured HF {list(hf_s)}; for HF {o_hf})", fits[0], key, ids)
        ids = native_aux_ids(o_hf, "sglang", num_layers=L)
    except ConventionError as e:
        return AuxFix(f"no SGLang ids give HF {o_hf} on this target: {e}", "plus-one")
    return AuxFix(f"{head}{ids} (SGLang convention for HF {o_hf}; the target's architecture is not in the traces: "
                  f"{sglang_family_rule(None).note.split(';')[0]})", "plus-one", key, list(ids))


def explain_aux_permutation(traces: Pair, alignment: Alignment, tol_rel: float) -> list[Explanation]:
    """Each aux slot of one side equals a *different* slot of the other: the same layers, concatenated
    in another order (SGLang concatenates in ascending layer order, aux_hidden_states.py; a trainer
    may keep the order it was given). Slot against slot, so no HF indices or probes are needed."""
    labels = side_names(traces)
    # who concatenates ascending: the serving engines of the two traces (SGLang for older traces)
    asc = sorted({(trace_engine(t) or engine_spec("sglang")).title for t in (traces.x, traces.y) if t.side == "serve"
                  and (trace_engine(t) or engine_spec("sglang")).aux_concat == "ascending"}) or [engine_spec("sglang").title]
    who = " and ".join(asc)
    sx = sorted(j for j in (aux_slot(n) for n in traces.x.names) if j is not None)
    sy = sorted(j for j in (aux_slot(n) for n in traces.y.names) if j is not None)
    if len(sx) < 2 or sx != sy:
        return []
    rel = np.array([[mean_rel(traces, alignment, aux_name(i), aux_name(j))[0] for i in sx] for j in sy])
    if not np.isfinite(rel).all():
        return []
    best = rel.argmin(1)  # serving slot j (row) -> training slot best[j]
    closes = rel[np.arange(len(sy)), best] <= tol_rel
    if not closes.all() or sorted(best.tolist()) != list(range(len(sx))) or (best == np.arange(len(sy))).all():
        return []
    hx, hy = aux_slot_layers(traces.x.contract) or [], aux_slot_layers(traces.y.contract) or []
    pairs = [f"{labels.y} slot {j} = {labels.x} slot {int(b)}" for j, b in zip(sy, best, strict=True)]
    orders = "; ".join(f"{lab} concatenates HF {list(h)}" for lab, h in ((labels.x, hx), (labels.y, hy)) if h)
    msg = ("the aux slots are permuted — the same layers concatenated in another order: " + ", ".join(pairs)
           + (f" ({orders})" if orders else "") + f"; {who} concatenate{'s' if len(asc) == 1 else ''} in ascending "
           "layer order")
    ev = tuple(f"{labels.y} slot {j} vs {labels.x} slot {int(b)}: rel err {rel[k, b]:.2e} "
               f"(vs its own slot {j}: {rel[k, k]:.2e})" for k, (j, b) in enumerate(zip(sy, best, strict=True)))
    for fname in ("aux_concat_order", "aux_hf_indices"):
        vx, vy = traces.x.contract.get(fname), traces.y.contract.get(fname)
        if vx is not None or vy is not None:
            ev += (f"contract {fname}: {labels.x} {vx}, {labels.y} {vy}",)
    matrix = {"title": f"rel err: {labels.y} slot vs {labels.x} slot",
              "rows": [f"{labels.y} slot {j}" for j in sy], "cols": [f"{labels.x} slot {i}" for i in sx],
              "rel": [[round(float(v), 4) for v in r] for r in rel]}
    return [Explanation("aux_slot_permutation", msg, ev,
                        f"train on the aux layers in ascending layer order (what {who} concatenate"
                        f"{'s' if len(asc) == 1 else ''}), or permute "
                        "the columns of the draft's fc.weight (and fc_norm/input_norm) to that order before serving",
                        matrix)]
