"""Explain a divergence: try the known EAGLE-3 contract mistakes and keep those that close the gap.

Each check transforms one side's recorded tensors the way a known mistake would, and reports
the mistake only when the transformed tensors agree with the other side within tolerance —
a transform that does not close the gap is never reported as the cause.

Checks (DESIGN.md "Comparing"):
- structure (a layout difference, replay/diff/align/structure.py): nothing to transform; the likely causes are
  named from the widths and the contract (another speculative algorithm, another number of aux
  layers, draft vocab, top-k, dtype family);
- token format (sequences paired only by content): how the formats differ, decoded;
- aux slot permutation: each slot equals a different slot of the other side (concat order);
- aux layer identity: each aux slot of one side against every HF hidden-state index the other
  side recorded (its aux slots and ``target.probe.{i}`` rows): layer shift, embedding output
  included or not, concat order;
- vocab map: the served ids against d2t read as offsets, as direct ids, missing (identity), arange;
- norm before fc on one side only (per-slot RMSNorm of the aux concat);
- position shift by +-1;
- embedding vs hidden half of the attention input; lm_head vs hidden_out;
- the draft's rope positions shifted by a constant.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specdiff.eagle3.aux_layers import (
    ConventionError,
    engine_capture,
    native_aux_ids,
    sglang_family_rule,
    target_architecture,
)
from specdiff.replay.diff.align.align import match_rows
from specdiff.replay.diff.align.structure import contract_value
from specdiff.replay.diff.align.token_format import decoder, describe, load_tokenizer, special_ids
from specdiff.replay.diff.compare import metrics
from specdiff.replay.diff.compare.acceptance import acceptance
from specdiff.replay.diff.explain.contract import explain_contract
from specdiff.replay.diff.explain.history import explain_group, explain_history
from specdiff.replay.diff.explain.nonfinite import explain_nonfinite
from specdiff.replay.diff.types import (
    Alignment,
    Explanation,
    Pair,
    TensorComparison,
    serve_side,
    side_names,
    trace_engine,
)
from specdiff.tracer.contract import AUX_IDS_DEFAULT_PREFIX, aux_slot_layers, known
from specdiff.tracer.engines import engine_names, engine_spec
from specdiff.tracer.schema import aux_name, aux_slot, probe_index

MAX_ROWS = 2048
SAMPLE_WINDOWS = 8


class _Memo:
    """A trace whose row keys and sampled rows are read once per explanation: the checks read the
    same tensors again and again (an aux slot against every candidate layer), and every other
    attribute is the trace's own. Lives for one ``explain`` call (its memory is the samples and
    the keys of the tensors explained)."""

    def __init__(self, trace):
        self._trace = trace
        self._seen: dict = {}

    def __getattr__(self, name):
        return getattr(self._trace, name)

    def _once(self, key, read):
        if key not in self._seen:
            self._seen[key] = read()
        return self._seen[key]

    def keys(self, name: str, start: int = 0, stop: int | None = None, *, columns=("seq", "pos", "depth", "iter")):
        return self._once(("keys", name, start, stop, tuple(columns)),
                          lambda: self._trace.keys(name, start, stop, columns=columns))

    def take_float(self, name: str, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        return self._once(("float", name, rows.tobytes()), lambda: self._trace.take_float(name, rows))


def _sample(m, n=MAX_ROWS, windows=SAMPLE_WINDOWS):
    """At most ``n`` aligned row pairs of RowMatch ``m``: ``rows.x`` int [k], ``rows.y`` int [k].

    Taken as ``windows`` runs of neighbouring rows (by side x's row index) spread over the trace,
    not as ``n`` rows spread evenly: rows are read chunk by chunk, and ``n`` spread rows would sit
    in ``n`` different chunks, decoding the whole tensor for each check (at 1 GiB, 91 of a
    121 s report). A run of neighbours shares a few chunks on side x; side y's matching rows
    are spread at most by its batch interleaving.
    """
    if len(m.pair) <= n:
        return m.rows.x, m.rows.y
    order = np.argsort(m.rows.x, kind="stable")
    run = n // windows
    starts = np.linspace(0, len(order) - run, windows).astype(np.int64)
    idx = np.sort(order[(starts[:, None] + np.arange(run)).reshape(-1)])
    return m.rows.x[idx], m.rows.y[idx]


def _rel(traces: Pair, alignment: Alignment, name_x: str, name_y: str) -> tuple[float, int]:
    """Mean row relative error of ``name_x`` (side x) vs ``name_y`` (side y) on aligned rows."""
    m = match_rows(traces, alignment, name_x, name_y)
    if not len(m.pair):
        return float("nan"), 0
    rx, ry = _sample(m)
    x, y = traces.x.take_float(name_x, rx), traces.y.take_float(name_y, ry)
    ok = ~(traces.x.unreadable(name_x, rx) | traces.y.unreadable(name_y, ry))  # damaged chunks
    if not ok.any():
        return float("nan"), 0
    return float(metrics.relative_error(x[ok], y[ok]).mean()), int(ok.sum())


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
            rel[a, b] = _rel(traces, alignment, names.x, names.y)[0]
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
        if spec is None or spec.aux_convention == "sglang":
            how = ("SGLang id k captures HF k+1" if rule == "plus-one"
                   else f"SGLang's {rule} rule on this target") + ", vLLM/speculators id k = HF k"
        else:
            how = "; ".join([spec.aux_id_words] + [engine_spec(n).aux_id_words for n in engine_names()
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
        d = known(t.contract, "model_name")
        f = Path(str(d)) / "config.json" if d else None
        if f is not None and f.is_file():
            try:
                return target_architecture(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
    return None


def _aux_fix(o_hf, s_trace, o_trace) -> tuple[str, str]:
    """(fix text, rule name): the ids, in the serving side's engine's convention and config key
    (``EngineSpec``), that make it capture HF ``o_hf``; SGLang's family rules through
    ``_sglang_fix``. A trace without a registered engine is taken as SGLang's (older traces)."""
    spec = trace_engine(s_trace)
    if spec is None or spec.aux_convention == "sglang":
        return _sglang_fix(o_hf, s_trace, o_trace)
    L = known(s_trace.contract, "num_layers") or known(o_trace.contract, "num_layers")
    arch = _target_arch((s_trace, o_trace))
    try:
        ids = native_aux_ids(o_hf, spec.aux_convention, num_layers=L, architecture=arch)
    except ConventionError as e:
        return f"no {spec.title} ids give HF {o_hf} on this target: {e}", spec.aux_convention
    how = f"{spec.title} id = HF index" if list(ids) == list(o_hf) else f"{spec.title} convention for HF {o_hf}"
    return f"set the draft config's {spec.aux_ids_key} to {list(ids)} ({how})", spec.aux_convention


def _sglang_fix(o_hf, s_trace, o_trace) -> tuple[str, str]:
    """(fix text, rule name): the eagle_config ids that make SGLang feed ``o_hf``, in the rule of
    the target (``eagle3.aux_layers.sglang_family_rule``). The rule comes from the target's
    architecture, else from the serving contract's own ids and captured layers (the rules that
    reproduce them, when they agree on the fix), else the plus-one rule is assumed and the fix
    says so."""
    head = f"set the draft config's {engine_spec('sglang').aux_ids_key} to "
    L = known(s_trace.contract, "num_layers") or known(o_trace.contract, "num_layers")
    arch = _target_arch((s_trace, o_trace))
    try:
        if arch is not None:
            fam = sglang_family_rule(arch)
            ids = native_aux_ids(o_hf, "sglang", num_layers=L, architecture=arch)
            if fam.name == "plus-one" and fam.known:
                return f"{head}{ids} (SGLang convention for HF {o_hf})", fam.name
            return (f"{head}{ids} (SGLang {fam.name} rule of {arch}, {fam.sources[0].split(' ')[0]}, for HF {o_hf}"
                    + (f"; {fam.note})" if fam.note else ")")), fam.name
        ids_s, hf_s = known(s_trace.contract, "aux_native_ids"), known(s_trace.contract, "aux_hf_indices")
        fits = [] if not (ids_s and hf_s and L) else [
            name for name, a in _RULE_ARCH.items()
            if engine_capture("sglang", ids_s, num_layers=L, architecture=a).hf_indices == tuple(sorted(set(hf_s)))]
        answers = {tuple(native_aux_ids(o_hf, "sglang", num_layers=L, architecture=_RULE_ARCH[n])) for n in fits}
        if len(answers) == 1:
            ids = list(answers.pop())
            if "plus-one" in fits:
                return f"{head}{ids} (SGLang convention for HF {o_hf})", "plus-one"
            return (f"{head}{ids} (SGLang {fits[0]} rule, read from the serving contract: ids {list(ids_s)} captured "
                    f"HF {list(hf_s)}; for HF {o_hf})"), fits[0]
        ids = native_aux_ids(o_hf, "sglang", num_layers=L)
    except ConventionError as e:
        return f"no SGLang ids give HF {o_hf} on this target: {e}", "plus-one"
    return (f"{head}{ids} (SGLang convention for HF {o_hf}; the target's architecture is not in the traces: "
            f"{sglang_family_rule(None).note.split(';')[0]})"), "plus-one"


def explain_aux_permutation(traces: Pair, alignment: Alignment, tol_rel: float) -> list[Explanation]:
    """Each aux slot of one side equals a *different* slot of the other: the same layers, concatenated
    in another order (SGLang concatenates in ascending layer order, aux_hidden_states.py; a trainer
    may keep the order it was given). Slot against slot, so no HF indices or probes are needed."""
    labels = side_names(traces)
    # who concatenates ascending: the serving engines of the two traces (SGLang for older traces)
    asc = sorted({(trace_engine(t) or engine_spec("sglang")).title for t in (traces.x, traces.y) if t.side == "serve"
                  and (trace_engine(t) or engine_spec("sglang")).aux_concat == "ascending"}) or ["SGLang"]
    who = " and ".join(asc)
    sx = sorted(j for j in (aux_slot(n) for n in traces.x.names) if j is not None)
    sy = sorted(j for j in (aux_slot(n) for n in traces.y.names) if j is not None)
    if len(sx) < 2 or sx != sy:
        return []
    rel = np.array([[_rel(traces, alignment, aux_name(i), aux_name(j))[0] for i in sx] for j in sy])
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


def explain_vocab_map(traces: Pair, alignment: Alignment) -> list[Explanation]:
    """Test how each side turned draft ids into target ids, using the recorded ``draft.d2t``."""
    if "draft.d2t" not in traces.x.names or "draft.d2t" not in traces.y.names:
        return []
    labels = side_names(traces)
    d2t = traces.map(lambda t: t.read("draft.d2t").reshape(-1).astype(np.int64))
    if len(d2t.x) != len(d2t.y) or np.array_equal(d2t.x, d2t.y):
        return []
    ar = np.arange(len(d2t.x))
    out = []
    for lab, mine, other in ((labels.y, d2t.y, d2t.x), (labels.x, d2t.x, d2t.y)):
        olab = labels.x if lab == labels.y else labels.y
        checks = [
            ("d2t_direct_ids", np.mean(mine == other + ar),
             f"{lab}'s d2t holds direct target ids (= {olab}'s offsets + arange) but is read as offsets: "
             "target = draft + d2t[draft] lands on wrong ids",
             "save d2t as offsets (target_id - draft_id), as SpecForge and speculators export it"),
            ("d2t_missing", np.mean(mine == 0),
             f"{lab} has no usable d2t (all zeros: identity map), so draft id i is served as target id i",
             "ship the draft's d2t buffer in the checkpoint"),
            ("d2t_arange", np.mean(mine == ar),
             f"{lab}'s d2t is arange (draft id i -> target id 2i)", "save d2t as offsets"),
        ]
        for cause, frac, msg, fix in checks:
            if frac >= 0.99 and not np.mean(other == mine) >= 0.99:
                out.append(Explanation(cause, msg, (f"{frac:.1%} of d2t entries fit this reading",), fix))
    return out


def _rmsnorm_chunks(x: np.ndarray, k: int) -> np.ndarray:
    c = x.reshape(len(x), k, -1)
    return (c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6)).reshape(len(x), -1)


def explain_norm_before_fc(traces: Pair, alignment: Alignment, tol: TensorComparison) -> list[Explanation]:
    """``draft.fc_in`` = per-slot RMSNorm(aux_cat) on one side and plain aux_cat on the other?"""
    if "draft.fc_in" not in traces.x.names or "draft.fc_in" not in traces.y.names:
        return []
    labels = side_names(traces)
    m = match_rows(traces, alignment, "draft.fc_in")
    if not len(m.pair):
        return []
    rx, ry = _sample(m)
    x, y = traces.x.take_float("draft.fc_in", rx), traces.y.take_float("draft.fc_in", ry)
    k = len(known(traces.y.contract, "aux_hf_indices") or known(traces.x.contract, "aux_hf_indices") or [0, 0, 0])
    # Per-slot normalisation removes both a whole-concat norm (norm_before_fc) and per-slot ones
    # (fc_norm) up to their weights; if that makes the sides agree, a norm is the difference.
    rel = float(metrics.relative_error(_rmsnorm_chunks(x, k), _rmsnorm_chunks(y, k)).mean())
    direct = float(metrics.relative_error(x, y).mean())
    if rel <= tol.tolerance.rel * 4 and direct > tol.tolerance.rel:
        # The normed side's per-row RMS is nearly constant (set by the norm weight); the raw side's varies.
        def spread(a):
            r = np.sqrt((a * a).mean(1))
            return float(r.std() / max(r.mean(), 1e-12))
        lab = labels.x if spread(x) < spread(y) else labels.y
        return [Explanation("norm_before_fc", f"a norm before fc (norm_before_fc / fc_norm) is applied on {lab} only",
                            (f"per-slot RMS-normalised fc inputs agree (rel err {rel:.2e}); raw fc inputs "
                             f"differ (rel err {direct:.2e})",),
                            "make norm_before_fc / fc_norm agree between the draft config and the trainer")]
    return []


def explain_position_shift(traces: Pair, alignment: Alignment, comp: TensorComparison) -> list[Explanation]:
    """Do rows at position t on one side equal rows at t+-1 on the other?"""
    if comp.match.rows.x.dtype.kind != "i" or comp.name.startswith("verify") or not len(comp.match.pair):
        return []
    name = comp.name
    kx, ky = traces.x.keys(name), traces.y.keys(name)
    seq_y = {p.seq.x: p.seq.y for p in alignment.seq_pairs}
    sample = comp.match.rows.x[:MAX_ROWS]
    # Index only side y's rows of the sampled sequences: a Python dict over every row of a large
    # trace would cost seconds.
    wanted = np.flatnonzero(np.isin(ky["seq"], [seq_y.get(int(s), -1) for s in np.unique(kx["seq"][sample])]))
    index = {(int(ky["seq"][r]), int(ky["pos"][r]), int(ky["depth"][r])): int(r) for r in wanted}
    for shift in (1, -1):
        pairs = []
        for r in sample:
            key = (seq_y.get(int(kx["seq"][r]), -1), int(kx["pos"][r]) + shift, int(kx["depth"][r]))
            if key in index:
                pairs.append((r, index[key]))
        if len(pairs) < 4 or comp.tolerance is None:
            continue
        rx, ry = np.array(pairs).T
        if traces.x.info(name).dtype in ("int64", "bool"):
            ok = float((traces.x.take(name, rx) == traces.y.take(name, ry)).all(-1).mean() if traces.x.take(name, rx).ndim > 1
                       else (traces.x.take(name, rx) == traces.y.take(name, ry)).mean())
            closes = ok >= 0.95
            ev = f"match rate {ok:.1%} after shifting by {shift:+d}"
        else:
            rel = float(metrics.relative_error(traces.x.take_float(name, rx), traces.y.take_float(name, ry)).mean())
            closes = rel <= comp.tolerance.rel
            ev = f"rel err {rel:.2e} after shifting by {shift:+d} (unshifted {comp.stats.get('mean_rel', 0):.2e})"
        if closes:
            lab = side_names(traces)
            return [Explanation("position_shift", f"{name}: {lab.x} position t equals {lab.y} position t{shift:+d}",
                                (ev,), "check the EAGLE-3 position pairing: row t consumes (h_t, x_{t+1})")]
    return []


def explain_halves(traces: Pair, comps: dict[str, TensorComparison], first: TensorComparison) -> list[Explanation]:
    """attn_in: embedding half vs hidden half; logits with matching hidden_out: the lm_head."""
    labels = side_names(traces)
    cx, cy = traces.x.contract, traces.y.contract
    if first.name == "draft.attn_in" and len(first.match.pair):
        # Deeper rows inherit the mismatch through the carried hidden: judge the halves where it begins.
        m = _at_depth(first.match, first.divergence_depth)
        rx, ry = _sample(m)
        x, y = traces.x.take_float(first.name, rx), traces.y.take_float(first.name, ry)
        h = x.shape[1] // 2
        emb = float(metrics.relative_error(x[:, :h], y[:, :h]).mean())
        hid = float(metrics.relative_error(x[:, h:], y[:, h:]).mean())
        if hid <= first.tolerance.rel < emb:
            src = f" ({labels.x}: {cx.get('embed_source', '?')}, {labels.y}: {cy.get('embed_source', '?')})"
            return [Explanation("embed_source", "the embedding half of the draft's attention input differs, the "
                                "hidden half agrees: the token embedding (or the input_layernorm over it) differs"
                                + src,
                                (f"embedding half rel err {emb:.2e}; hidden half rel err {hid:.2e}",),
                                "serve the draft with the embedding it was trained with (SGLang always shares "
                                "the target's and ignores a checkpoint embed_tokens)")]
        if emb <= first.tolerance.rel < hid:
            return [Explanation("hidden_half", "the hidden half of the draft's attention input differs, the "
                                "embedding half agrees: hidden_norm, or the hidden the midlayer is fed "
                                "(draft.hidden_in), differs",
                                (f"embedding half rel err {emb:.2e}; hidden half rel err {hid:.2e}",),
                                "compare draft.hidden_in and the hidden_norm weight on both sides")]
    if first.name.startswith("draft.logits") and "draft.hidden_out" in comps and not comps["draft.hidden_out"].diverged:
        src = f" ({labels.x}: {cx.get('lm_head_source', '?')}, {labels.y}: {cy.get('lm_head_source', '?')})"
        return [Explanation("lm_head_source", "draft hidden states agree but logits do not: the lm_head differs" + src,
                            (f"draft.hidden_out max rel err {comps['draft.hidden_out'].stats.get('max_rel', 0):.2e}",),
                            "load the draft's trained lm_head (not a random or target one)")]
    return []


def _fields_lines(fields: dict, labels: Pair) -> tuple[str, ...]:
    return tuple(f"contract {f}: {labels.x} {vx if vx is not None else 'not recorded'}, "
                 f"{labels.y} {vy if vy is not None else 'not recorded'}" for f, (vx, vy) in fields.items())


def _aux_widths(traces: Pair) -> Pair:
    """Per side: (aux concat width, hidden size) where recorded, else None."""
    def one(t):
        h = t.contract.get("hidden_size")
        w = t.info("target.aux_cat").shape[0] if "target.aux_cat" in t.names and t.info("target.aux_cat").shape else None
        if w is None:
            slots = [n for n in t.names if aux_slot(n) is not None]
            w = sum(t.info(n).shape[0] for n in slots) if slots else None
        return w, h
    return traces.map(one)


def explain_structure(traces: Pair, first: TensorComparison) -> list[Explanation]:
    """Name the likely causes of a layout difference (a ``structure`` finding) and the contract
    fields that show it. Nothing is transformed: shapes cannot be closed, only read."""
    m = first.structure
    labels = side_names(traces)
    ev = (m.message, *_fields_lines(m.fields, labels))
    fc = traces.map(lambda t: "draft.fc_out" in t.names or "draft.fc_in" in t.names)
    if fc.x != fc.y:
        ev += (f"{labels.y if fc.x else labels.x} recorded no draft.fc_in / draft.fc_out rows: its draft never "
               "ran fc",)
    algo = traces.map(lambda t: contract_value(t.contract, "speculative_algorithm"))
    algo_words = "; ".join(f"{lab} ran {a}" for lab, a in ((labels.x, algo.x), (labels.y, algo.y)) if a)
    if m.kind in ("slot_count", "width") and (m.name.startswith("target.aux") or m.name == "draft.fc_in"):
        (wx, hx), (wy, hy) = _aux_widths(traces).x, _aux_widths(traces).y
        h = hx or hy
        if h and wx and wy and wx != wy and h in (wx, wy):
            one, many = (labels.x, labels.y) if wx == h else (labels.y, labels.x)
            k = max(wx, wy) // h
            msg = (f"{one} fed the draft ONE hidden state {h} wide where {many} fed {k} aux hidden states "
                   f"{max(wx, wy)} wide ({k} x {h}): the EAGLE-3 draft was likely run with "
                   f"--speculative-algorithm EAGLE (SGLang's EAGLE passes the target's final hidden state, "
                   f"and the EAGLE-3 draft skips its fc because the width already equals its hidden size)"
                   + (f" [{algo_words}]" if algo_words else "")
                   + "; or aux capture was switched off on that side")
            return [Explanation("speculative_algorithm", msg, ev,
                                "serve the EAGLE-3 draft with --speculative-algorithm EAGLE3 (SGLang then captures "
                                "the draft config's eagle_aux_hidden_state_layer_ids)")]
        kx = wx // hx if wx and hx else None
        ky = wy // hy if wy and hy else None
        if kx and ky and kx != ky:
            hfx, hfy = (traces.x.contract.get("aux_hf_indices"), traces.y.contract.get("aux_hf_indices"))
            msg = (f"a different number of aux layers captured: {labels.x} {kx} (HF {hfx or '?'}), "
                   f"{labels.y} {ky} (HF {hfy or '?'})" + (f" [{algo_words}]" if algo_words else ""))
            return [Explanation("aux_layer_count", msg, ev,
                                "capture exactly the layers the draft's fc was trained on (fc.weight is "
                                "[H, K*H]): set eagle_aux_hidden_state_layer_ids to those K ids")]
    if m.kind == "vocab":
        sizes = Pair(*(v[0] if isinstance(v, tuple) else v for v in (m.x, m.y)))
        v = traces.x.contract.get("vocab_size") or traces.y.contract.get("vocab_size")
        full = [lab for lab, n in ((labels.x, sizes.x), (labels.y, sizes.y)) if v and n == v]
        if full:
            msg = (f"{full[0]}'s draft scores the whole target vocab ({v}) where the other side's has "
                   f"{sizes.y if full[0] == labels.x else sizes.x} ids: draft vs target vocab — the draft config "
                   "lacks draft_vocab_size (and d2t), so the engine built a target-vocab lm_head")
        else:
            msg = (f"the draft vocab sizes differ ({m.message}): another draft checkpoint, or one side maps "
                   "through the target vocab (no draft_vocab_size / d2t in the served config)")
        return [Explanation("draft_vocab_size", msg, ev,
                            "serve and replay the same draft checkpoint; keep draft_vocab_size and d2t in its config")]
    if m.kind == "topk_width":
        if m.dim == "logits_topk":
            return [Explanation("logits_topk", f"another logits top-k was captured ({m.message})", ev,
                                "record both sides with the same --logits-topk (record serve) and capture level")]
        return [Explanation("spec_topk", f"another draft top-k ({m.message}): --speculative-eagle-topk differs", ev,
                            "record the training side with the serving trace's topk (record train --replay reads "
                            "spec_topk from it, or pass --topk)")]
    if m.kind == "dtype_family":
        return [Explanation("dtype_family", f"{m.message}: the sides stored this tensor as different kinds of "
                            "values (a trace from another recorder or format version?)", ev,
                            "record both sides with the same specdiff version")]
    why = {"draft_hidden": "the drafts have different hidden sizes (different checkpoints)",
           "attn_in": "the drafts' attention inputs differ in width (different draft hidden sizes)",
           "draft_tokens": "the verify trees differ in size (--speculative-num-draft-tokens)",
           "accept_slots": "the draft step counts differ (--speculative-num-steps)",
           "hidden": "the targets have different hidden sizes (different target models)",
           "aux_hidden": "the aux concat widths differ (another number of aux layers, or another target)"}
    return [Explanation("structure", f"{m.message}: {why.get(m.dim, 'the layouts differ')}"
                        + (f" [{algo_words}]" if algo_words else ""), ev,
                        "make both sides run the same target, draft and speculative settings")]


def explain_token_format(traces: Pair, alignment: Alignment) -> list[Explanation]:
    """The sides tokenized the same text in different formats: say how, decoded side by side."""

    labels = side_names(traces)
    decode = decoder(load_tokenizer(traces))
    specials = special_ids(traces)
    pairs = alignment.token_formats
    words, lines = describe(pairs[0], labels, decode=decode, specials=specials)
    msg = (f"the token formats differ: {len(pairs)} of {len(alignment.seq_pairs)} sequence pairs share "
           f"only a run of tokens, not a prefix" + (f" — {'; '.join(words)}" if words else ""))
    first = pairs[0]
    ev = (f"seq {first.index}: first differing token at position {first.format.first_diff}", *lines)
    return [Explanation("token_format", msg, ev,
                        "record the training side in the serving token format (the same BOS and chat template: "
                        "train on what serving sends), or serve with the training format; "
                        "`specdiff record train --replay SERVE_TRACE` replays exactly what serving saw")]


def _at_depth(m, depth):
    """The rows of RowMatch ``m`` at draft depth ``depth`` (all rows when none is there)."""
    keep = m.depth == (depth or 0)
    if not keep.any():
        return m
    return type(m)(m.rows.map(lambda r: r[keep]), m.pair[keep], m.pos[keep], m.depth[keep], m.only)


def _offsets(traces: Pair, m, name: str) -> tuple[int, float, int]:
    """(most common serving - training offset, its share, rows) of int tensor ``name`` on RowMatch ``m``."""
    rx, ry = _sample(m)
    x = traces.x.take(name, rx).reshape(-1).astype(np.int64)
    y = traces.y.take(name, ry).reshape(-1).astype(np.int64)
    off, counts = np.unique(y - x, return_counts=True)
    return int(off[np.argmax(counts)]), float(counts.max() / len(x)), len(x)


def explain_positions(traces: Pair, first: TensorComparison) -> list[Explanation]:
    """``draft.positions``: one side's rope positions = the other's + an offset, judged per draft
    depth (three quarters of the rows are depth 0, where a draft-step bug leaves them right: the
    most common offset over all rows hides a +1 every deeper row shares)."""
    if first.name != "draft.positions" or not len(first.match.pair):
        return []
    lab = side_names(traces)
    per = {int(d): _offsets(traces, _at_depth(first.match, int(d)), first.name) for d in np.unique(first.match.depth)}
    clean = {d: v for d, v in per.items() if v[1] >= 0.95}
    if len(clean) != len(per):
        return []
    offs = {d: v[0] for d, v in clean.items()}
    ev = tuple(f"depth {d}: {v[1]:.1%} of {v[2]} rows differ by exactly {v[0]:+d}" for d, v in sorted(clean.items()))
    fix = ("the draft attends at position t + k (SGLang draft extend: the token's own position; draft step k: "
           "seq_len + k - 1); check the position offset the draft is given")
    vals = set(offs.values())
    if vals == {0}:
        return []
    if len(vals) == 1:
        best = vals.pop()
        return [Explanation("position_offset",
                            f"the draft's rope positions on {lab.y} are {lab.x}'s {best:+d}: row t at depth k is "
                            f"rotated at t + k {best:+d} instead of t + k", ev, fix)]
    wrong = sorted(d for d, o in offs.items() if o)
    k0 = wrong[0]
    if all(offs[d] == 0 for d in offs if d < k0) and len({offs[d] for d in wrong}) == 1 and wrong == \
            sorted(d for d in offs if d >= k0):
        c = offs[k0]
        ahead = "ahead of" if c > 0 else "behind"
        return [Explanation("position_offset_depth",
                            f"draft positions at depth >= {k0} are {abs(c)} {ahead} {lab.x} ({c:+d} at depth >= {k0}) "
                            f"on {lab.y}, depth < {k0} agree: rope positions "
                            + ("advanced before each draft step instead of after" if c > 0 else
                               "not advanced for each draft step"), ev, fix)]
    d0, ds = min(offs), sorted(offs)
    step = offs[ds[1]] - offs[d0] if len(ds) > 1 else 0
    if step and all(offs[d] == offs[d0] + step * (d - d0) for d in ds):  # the offset grows with the depth
        return [Explanation("position_offset_depth",
                            f"the draft's rope positions on {lab.y} drift by {step:+d} per draft depth from {lab.x}'s "
                            f"(offset {offs[d0]:+d} at depth {d0}): the position is advanced by the wrong amount "
                            "per draft step", ev, fix)]
    return []


def explain(traces: Pair, alignment: Alignment, comps: dict[str, TensorComparison],
            first: TensorComparison | None) -> list[Explanation]:
    """Every explanation whose transform closes the gap at the first divergence."""
    if first is None:
        return []
    traces = traces.map(_Memo)
    if first.kind == "structure":
        return explain_structure(traces, first)
    if first.kind == "tokens":
        return explain_token_format(traces, alignment)
    out: list[Explanation] = []
    if first.name.startswith("target.aux"):
        out += explain_aux_permutation(traces, alignment, first.tolerance.rel) or \
            explain_aux(traces, alignment, first.tolerance.rel)
    if first.name in ("draft.topk_target", "draft.topk", "verify") or first.name.startswith("draft.logits"):
        out += explain_vocab_map(traces, alignment)
    if first.name in ("draft.fc_in", "draft.fc_out"):
        out += explain_norm_before_fc(traces, alignment, first)
    out += explain_halves(traces, comps, first)
    out += explain_positions(traces, first)
    out += explain_history(traces, alignment, comps, first)  # draft KV history (history.py)
    if not out:
        out += explain_position_shift(traces, alignment, first)
    # Non-finite values lead when they appear at the first divergence itself (later: evidence after it);
    # a contract difference acting inside the first stage explains it when no transform closed the gap
    # (a transform is the sharper proof of the same fact), before "no known cause" (their modules).
    nonfinite = explain_nonfinite(traces, comps, first, side_names(traces))
    at_first = [e for e in nonfinite if f"appear at {first.name} " in e.message]
    contract = [] if out else explain_contract(traces, comps, first)
    # a divergence called in a structural group (groups.py) names the group when nothing sharper did
    group = [] if out or contract or at_first else explain_group(first)
    return at_first + out + contract + group + [e for e in nonfinite if e not in at_first]
