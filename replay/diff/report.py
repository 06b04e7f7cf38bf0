"""The diff report rendered: the text ``specdiff diff`` prints and its JSON. Rendering only: the report
(``DiffReport``, replay/diff/result.py) is built by the pipeline (replay/diff/pipeline.py); nothing here
computes a comparison, an explanation or a finding.
"""

from __future__ import annotations

import json
import textwrap

from specdiff.replay.diff.compare.acceptance import Acceptance
from specdiff.replay.diff.compare.accounting import share
from specdiff.replay.diff.contract.crash import crash_text
from specdiff.replay.diff.judge.groups import GROUP_ALPHA, GROUP_FAR
from specdiff.replay.diff.result import DiffReport
from specdiff.replay.diff.textwidth import output_width
from specdiff.replay.diff.types import ContractMismatch, Pair, TensorComparison
from specdiff.tracer.schema import spec_for


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _acc_rows(labels: Pair, acc: Pair) -> list[str]:
    def line(label, a: Acceptance):
        if a.mean_accept_length is None:
            return f"  {label:9s} (not recorded)"
        depths = "  ".join(f"{d:.2f}" for d in a.per_depth or ())
        return f"  {label:9s} mean accept length {a.mean_accept_length:.2f}   per depth [{depths}]   ({a.samples} samples)"
    rows = [line(labels.x, acc.x), line(labels.y, acc.y)]
    if acc.x.mean_accept_length is not None and acc.y.mean_accept_length is not None:
        rows.append(f"  gap       {acc.x.mean_accept_length - acc.y.mean_accept_length:+.2f} tokens per verify step")
    return rows


def _outcome_rows(report) -> list[str]:
    """Only when the acceptance gap is the verdict (``DiffReport.outcome_differs``): every depth of the paired
    verify steps, so the depths that agree are seen beside those that do not."""
    if not report.outcome_differs:
        return []
    s, t = report.outcome.labels
    rows = [f"  at the same {report.outcome.steps} verify steps ({s} against {t}'s chain at each step's root):"]
    for d in report.outcome.depths:
        rows.append(f"    depth {d.depth}: {s} {d.serving / d.steps:.2f}, {t} {d.training / d.steps:.2f}, gap "
                    f"{d.gap:+.2f} ± {d.half_width:.2f} ({d.only_serving} steps only {s} accepted, {d.only_training} "
                    f"only {t}; McNemar p {d.p_value:.1e})")
    return rows


def _graft_rows(grafts: list) -> list[str]:
    if not grafts:
        return ["graft: nothing to substitute"]
    g0 = grafts[0]
    rows = [f"graft (training's draft re-run on serving's inputs, {g0.samples} positions): baseline "
            f"{g0.baseline_accept_length:.2f}, all training inputs {g0.training_accept_length:.2f}"]
    for g in grafts:
        depths = "  ".join(f"{d:.2f}" for d in g.per_depth)
        rows.append(f"  {g.message()}   per depth [{depths}]")
    return rows


def _narrowing_rows(n) -> list[str]:
    if n is None:
        return []
    if isinstance(n, str):
        return [f"  narrowing not run: {n}"]
    rows = [f"  narrowing: the training draft re-run through depth {n.depth} on {n.positions} positions, compared "
            f"with what serving recorded on {n.rows} failing row(s) from {n.from_stage} on"]
    judged = n.stages[n.stages.index(n.from_stage):]
    for v in n.variants:
        # the first judged stage the run misses (a float stage at its noise, rerun/noise.py), else the worst
        worst = next((s for s in judged if not v.matches.get(s, True)), None) or max(judged, key=lambda s: v.scores[s])
        noise = getattr(v, "noise", {}).get(worst)
        at = f", {noise:.2g}x its rows' noise floors" if noise is not None else ""
        mark = "REPRODUCES serving" if v.reproduces else f"differs ({worst} {_fmt(v.scores[worst])}{at})"
        rows.append(f"    {v.name:28s} {mark}")
    rows.append(f"  -> {n.conclusion}")
    return rows


def _wrap(lines: list[str], width: int) -> list[str]:
    """Wrap each prose line at ``width``, continuation lines indented two more than the line's own
    indent; words longer than the width (paths, hashes) stay whole."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(line.strip(), width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                             break_long_words=False, break_on_hyphens=False)
    return out


def _crash_rows(report: DiffReport) -> list[str]:
    c = report.crash
    out = [f"crash ({c['label']}): {c.get('type')} in {c.get('forward')}"]
    out += [f"  {line}" for line in str(c.get("message", "")).splitlines()[:3]]
    for key, shape in {**{f"{c.get('forward')} {k}": v for k, v in (c.get("forward_shapes") or {}).items()},
                       **(c.get("shapes") or {})}.items():
        out.append(f"  {key}: {shape}")
    if c.get("where"):
        out.append(f"  raised at {c.get('engine_where') or c['where'][-1]}")
    return out + crash_text(c)


def _first_rows(report: DiffReport) -> list[str]:
    """The first diverging tensor's numbers: rows failing, tolerance, worst element."""
    f = report.first
    if f.kind == "structure":
        m = f.structure
        return [f"  {m.message} — the layouts differ, so no row of it is compared"]
    s = f.stats
    nums = ", ".join(f"{k} {_fmt(s[k])}" for k in ("max_rel", "min_cos", "max_abs", "match_rate", "topk_overlap",
                                                    "fail_frac", "nonfinite_rows") if k in s)
    out = [f"  {f.name}: {s['fail_rows']}/{s['rows']} rows fail ({nums})"]
    if s.get("routing_not_named"):
        out.append(f"  MoE target ({s.get('routing_family', 'unknown family')}): not MoE routing near-ties: "
                   f"{s['routing_not_named']}")
    if s.get("inherited_rows") or s.get("explained_rows"):
        out.append(f"  judged on {s['counted_rows']} rows whose inputs agree: {s['own_fail_rows']} fail "
                   f"({s['own_fail_frac']:.3g}){_inherited_note(f)}")
    if f.shift_only:
        out.append(f"  a systematic shift inside the fail fraction: {f.shift.words()}")
    tol = f.tolerance
    out.append(f"  tolerance: rel <= {tol.rel:g}, cos >= {tol.cos:g}, ids overlap >= {tol.ids:g}, "
               f"fail fraction <= {tol.max_fail_frac:g}")
    if f.worst and f.kind != "tokens":
        w = f.worst
        out.append(f"  worst: seq {w['pair']} pos {w['pos']} depth {w['depth']} element {w['element']}: "
                   f"{report.labels.x} {_fmt(w['x'])} vs {report.labels.y} {_fmt(w['y'])}")
    return out


def _explanation_rows(report: DiffReport) -> list[str]:
    """The causes: the headline already says the first one's message, so it is named, not repeated.
    Recorded facts that differ, named where nothing closes the gap (``named_only``), are listed with
    their fixes, then the narrowing."""
    if not report.explanations:
        return ["explanation: no known cause — no known mistake's transform closes the gap",
                *_narrowing_rows(report.narrowing)]
    if all(e.named_only for e in report.explanations):
        stage = spec_for(report.first.name).stage
        out = [f"explanation: no known mistake's transform closes the gap; the recorded facts that differ and act at "
               f"or before {stage} (or where, no table says):"]
        for e in report.explanations:
            said = e.message.split(" — ")[0]
            out.append(f"  {said}" if e.cause == "unlisted_difference" else f"  {e.cause}: {said}")
            out += [f"    fix: {e.fix}"] + [f"    {line}" for line in e.evidence[1:]]
        return out + _narrowing_rows(report.narrowing)
    out = []
    for k, e in enumerate(report.explanations):
        out.append(f"explanation: {e.cause} (the headline)" if k == 0 else f"also: {e.cause}: {e.message}")
        if e.fix:
            out.append(f"  fix: {e.fix}")
        out += [f"  {line}" for line in e.evidence]
    return out


def _contract_rows(mismatches: list[ContractMismatch], bearing: list[ContractMismatch], first: str | None) -> list[str]:
    """Each contract difference once, with its fix; those acting at the first divergence's stage are marked."""
    out = []
    for m in mismatches:
        mark = f" (bears on {first})" if first and m in bearing else ""
        said = m.message if m.message.startswith(m.field) else f"{m.field}: {m.message}"
        out.append(f"  [{m.severity}] {said}{mark}")
        if m.fix:
            out.append(f"    fix: {m.fix}")
    return out


def _alignment_line(report: DiffReport) -> str:
    a, lab = report.alignment, report.labels
    by_content = sum(p.format is not None for p in a.seq_pairs)
    how = f" ({by_content} paired by content: their token formats differ)" if by_content else ""
    return (f"{len(a.seq_pairs)} aligned sequences{how}; unmatched: {len(a.unmatched.x)} on {lab.x}, "
            f"{len(a.unmatched.y)} on {lab.y}")


def render_text(report: DiffReport, *, width: int | None = None) -> str:
    """The text report, each thing said once, most important first: the headline (``verdict``); what
    invalidates or limits the comparison (a crash, damage, contract errors); the first divergence's
    numbers; its explanation with the fix; the other contract differences; then the evidence
    (pre-flight findings, margins, acceptance, grafts, the tensor table, the alignment).

    ``width``: prose lines wrap at it (the tensor table does not); default the terminal's width, or
    ``DEFAULT_WIDTH`` when the output is not a terminal (``textwidth.output_width``).
    """
    width = output_width(width)
    out = [report.verdict(), ""]
    if report.crash is not None:
        out += [*_crash_rows(report), ""]
    if report.damage:
        out += ["damage", *[f"  {d.message()}" for d in report.damage], ""]
    errors = [m for m in report.contract if m.severity == "error"]
    if errors:
        out += ["contract errors (the two sides cannot agree while these differ)",
                *_contract_rows(errors, [], None), ""]
    silent = [m for m in report.silent_warnings() if m.severity != "error"]
    if silent:
        out += ["contract warnings (recorded facts that differ though no tensor shows it)",
                *_contract_rows(silent, [], None), ""]
    if report.first is not None:
        out += ["first divergence", *_first_rows(report), "", *_explanation_rows(report), ""]
    out += _reexec_rows(report)
    others = [m for m in report.contract if m.severity != "error" and m not in silent]
    out.append("contract")
    if others:
        out += _contract_rows(others, report.contract_bearing(), report.first.name if report.first else None)
    elif silent:
        out.append("  no other difference")
    elif not errors:
        out.append("  the contract facts both sides recorded agree")
    else:
        out.append("  no other difference")
    if report.unfound_paths:
        out += ["", "paths not found here (what needs them is left out)", *[f"  {m}" for m in report.unfound_paths]]
    if report.findings and report.crash is None:
        out += ["", "pre-flight findings (specdiff check) that bear on it",
                *[f"  [{f['severity']}] {f['kind']}: {f['message']}" for f in report.findings]]
    out += _legitimate_rows(report)
    out += _left_out_rows(report)
    out += ["", "acceptance (over the aligned positions)", *_acc_rows(report.labels, report.acceptance),
            *_outcome_rows(report)]
    if report.grafts is not None:
        out += ["", *_graft_rows(report.grafts)]
    out = _wrap(out, width)
    out += ["", "tensors"]  # a table: its rows are not wrapped
    for name, c in report.comparisons.items():
        if c.kind == "structure":
            out.append(f"  {name:26s} {'STRUCTURE':8s} {c.structure.message}")
            continue
        mark = "DIVERGED" if c.diverged else "DAMAGED" if c.stats.get("unreadable_rows") else "ok"
        key = "max_rel" if "max_rel" in c.stats else "match_rate"
        out.append(f"  {name:26s} {mark:8s} rows {c.stats['rows']:<6d} {key} {_fmt(c.stats.get(key, float('nan')))}"
                   f"  coverage {c.stats['coverage']:.0%}{_inherited_note(c)}{_unreadable_note(report, name, c)}")
    out += ["", *_wrap([_alignment_line(report)], width)]
    if report.alignment_error:
        out += _wrap([f"no row compared: {report.alignment_error}"], width)
    return "\n".join(out)


def _reexec_rows(report: DiffReport) -> list[str]:
    """How re-execution decided the verdict (replay/diff/rerun/reexec.py): each candidate draft stage,
    moved past (inherited from serving's inputs), proven, or judged by its rows because it could not run."""
    r = report.reexecution
    if r is None or not r.steps:
        return []
    said = {"reproduced": "not a divergence, inherited from serving's inputs",
            "not_reproduced": "the first divergence, proven by re-execution",
            "not_run": "judged by its rows (re-execution could not decide)"}
    out = ["re-execution (the training draft re-run on serving's own inputs decides the verdict)"]
    for st in r.steps:
        out.append(f"  {st.stage}: {said[st.outcome]}: {st.reason}")
        if len(st.stages) > 1:
            out.append(f"    with it: {', '.join(s for s in st.stages if s != st.stage)}")
    return [*out, ""]


def _inherited_note(c: TensorComparison) -> str:
    n, e = c.stats.get("inherited_rows", 0), c.stats.get("explained_rows", 0)
    shift = c.stats.get("recorded_shift")
    return ((f"  inherited {n}" if n else "") + (f"  explained {e}" if e else "")
            + (f"  recorded shifts {shift[0]:+d}/{shift[1]:+d} removed" if shift else "")
            + ("  reproduced by re-execution" if c.stats.get("reproduced_by_reexecution") else ""))


def _legitimate_rows(report: DiffReport) -> list[str]:
    """Named legitimate differences, inherited rows and the closest margin (text report)."""
    out = []
    if report.legitimate:
        out += ["", "explained differences (legitimate for this target family, not divergences)"]
        for e in report.legitimate:
            out.append(f"  {e.cause}: {e.message}")
            out += [f"    {line}" for line in e.evidence()]
    inh = report.inherited()
    if inh:
        out += ["", "inherited rows (their inputs already differ upstream; not counted as new divergences)"]
        for n, v in inh.items():
            src = ", ".join(f"{k} ({c})" for k, c in v["from"].items())
            out.append(f"  {n:26s} {v['rows']} rows from {src}")
    m = report.margin()
    if m is not None and m["use"] == 0:  # "0% of the 0 fail fraction" named one tensor of many at nothing
        out += ["", "margin: every tensor that passed is at 0% of its limits: none of their counted rows fails"]
    elif m is not None:
        if m["limit"] == "fail_frac":
            words = (f"{m['own_fail_rows']} of {m['counted_rows']} counted rows fail, {m['use']:.0%} of the "
                     f"{m['max_fail_frac']:g} fail fraction allowed")
        else:
            words = (f"worst passing row max_rel {_fmt(m['max_rel_passing'])} against rel <= {m['rel_limit']:g}"
                     if m["limit"] == "rel" else "worst passing row's cosine")
            words += f" ({m['use']:.0%} of its {m['limit']} limit)"
        out += ["", f"margin: closest to a limit: {m['tensor']}: {words}"]
    g = report.group_margin()
    if g is not None:

        far = g.min_fail_rel / g.noise_floor if g.noise_floor else float("inf")
        out.append(f"margin: most concentrated failures: {g.tensor} on {g.group}: {g.fail_rows} of {g.rows} rows, "
                   f"chance {g.p:.2g} (a divergence at <= {GROUP_ALPHA:g}), {far:.1f}x the group's noise floor "
                   f"(at >= {GROUP_FAR:g}x)")
    return out


def _left_out_rows(report: DiffReport) -> list[str]:
    """Serving's rows left out, per tensor and depth (``DiffReport.serving_rows``, compare/accounting.py):
    tensors whose left-out counts are the same share one line (a draft row off training's path is so at
    every stage of its depth), then what each reason means. Nothing when every row was compared."""
    acc = report.serving_rows
    if not acc.left:
        return []
    lines: dict[tuple, list[str]] = {}
    for name, depths in acc.tensors.items():
        key = tuple((d.depth, d.rows, tuple(d.left_out.items())) for d in depths if d.left)
        if key:
            lines.setdefault(key, []).append(name)
    out = ["", f"{acc.label} rows left out (never counted as agreement): {acc.left} of {acc.rows} rows "
               f"({share(acc.left, acc.rows)})"]
    for key, names in lines.items():
        out.append("  " + "; ".join(f"depth {depth}: {sum(n for _, n in why)} of {rows} ("
                                    + (acc.label_of(why[0][0]) if len(why) == 1 else
                                       ", ".join(f"{acc.label_of(r)} {n}" for r, n in why)) + ")"
                                    for depth, rows, why in key))
        out.append(f"    at {', '.join(names)}")
    return out + [f"  {acc.label_of(r)}: {acc.words(r)}" for r in acc.reasons()]


def _unreadable_note(report: DiffReport, name: str, c: TensorComparison) -> str:
    """``; N rows unreadable: <side> chunk K (+ M more), <what to do>`` for a tensor with damaged rows."""
    n = c.stats.get("unreadable_rows", 0)
    if not n:
        return ""
    found = [(label, d) for label, t in ((report.labels.x, report.traces.x), (report.labels.y, report.traces.y))
             for d in t.damage if d.tensor == name]
    if not found:
        return f"; {n} rows unreadable"
    label, d = found[0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return f"; {n} rows unreadable: {label} chunk {d.key}{more} {d.problem}; {d.action}"


def render_json(report: DiffReport) -> str:
    return json.dumps(report.to_json(), indent=2)
