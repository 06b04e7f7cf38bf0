"""Rich renderables for the detail and explain panes: views of a DiffReport, nothing recomputed.

The detail pane reads one stored row per side (``Trace.take_float`` / ``take``) to show the
values around the worst element; the numbers it prints (score, cosine, tolerance, stats) come
from the report's ``TensorComparison``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from specdiff.tracer.schema import spec_for
from specdiff.tui.view import CELLS, MISSING, NONE, UNOBSERVED, UNREADABLE, Sel, ViewModel

SLICE = 3  # elements either side of the worst one
TOPK = 5
#: tensors whose ids are target-vocab token ids (decodable with the target tokenizer)
TARGET_IDS = {"tokens", "draft.topk_target", "target.argmax"}


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        return f"{v:.4g}"
    return str(v)


@dataclass
class Detail:
    """The detail pane's content for one cell: metrics, |x-y| for the sparkline, values."""

    body: Group
    diffs: list[float]
    values: Group | str = ""


def _status_text(code: int) -> Text:
    sym, colour, text = CELLS[code]
    return Text(f"{sym} {text}", style=f"bold {colour}" if colour else "")


def _metrics(vm: ViewModel, sel: Sel, i: int) -> Text:
    """This row's numbers, the tolerance and the tensor's stats, a few compact lines."""
    comp = vm.report.comparisons[sel.name]
    float_kind = spec_for(sel.name).kind == "float"
    t = Text()
    if float_kind:
        t.append("rel err ", style="dim")
        t.append(fmt(comp.score[i]), style="bold")
        t.append("   cos ", style="dim")
        t.append(fmt(comp.cos[i]), style="bold")
        if comp.nonfinite[i]:
            t.append("   NaN/Inf in this row", style="bold red")
    else:
        t.append("overlap ", style="dim")
        t.append(fmt(1.0 - float(comp.score[i])), style="bold")
    tol = comp.tolerance
    t.append("\ntolerance ", style="dim")
    t.append(f"rel ≤ {tol.rel:g}  cos ≥ {tol.cos:g}  fail ≤ {tol.max_fail_frac:g}" if float_kind else
             f"overlap ≥ {tol.ids:g}  fail ≤ {tol.max_fail_frac:g}")
    s = comp.stats
    t.append("\ntensor ", style="dim")
    t.append(f"{s['fail_rows']}/{s['rows']} rows fail, coverage {s['coverage']:.0%}")
    t.append(" — DIVERGED" if comp.diverged else " — within tolerance",
             style="bold red" if comp.diverged else "green")
    keys = ("max_rel", "mean_rel", "min_cos", "max_abs") if float_kind else \
        ("match_rate", "topk_overlap", "argmax_agree", "kl_mean")
    nums = "  ".join(f"{k} {fmt(s[k])}" for k in keys if k in s)
    if nums:
        t.append("\nstats ", style="dim")
        t.append(nums)
    if comp.worst and comp.worst.get("row") == i and int(comp.status[i]) != 0:
        t.append(f"\nthis row is the tensor's worst (element {comp.worst['element']})", style="italic")
    return t


def _float_values(vm: ViewModel, sel: Sel, rows: tuple[int, int]) -> tuple[Group, list[float], Text | str]:
    traces, labels = vm.report.traces, vm.report.labels
    x = traces.x.take_float(sel.name, np.array([rows[0]])).reshape(-1)
    y = traces.y.take_float(sel.name, np.array([rows[1]])).reshape(-1)
    bad = ~np.isfinite(x) | ~np.isfinite(y)
    d = np.where(bad, np.inf, np.abs(np.nan_to_num(x.astype(np.float64)) - np.nan_to_num(y.astype(np.float64))))
    e = int(np.argmax(d)) if d.size else 0
    t = Table(box=None, padding=(0, 1), header_style="bold")
    t.add_column("elem", justify="right", style="dim")
    t.add_column(labels.x, justify="right")
    t.add_column(labels.y, justify="right")
    t.add_column("|x-y|", justify="right")
    for k in range(max(e - SLICE, 0), min(e + SLICE + 1, d.size)):
        style = "bold red" if k == e else ""
        t.add_row(("▶ " if k == e else "") + str(k), fmt(x[k]), fmt(y[k]), fmt(d[k]), style=style)
    finite = np.where(np.isfinite(d), d, np.nan)
    series = _pool(np.nan_to_num(finite, nan=float(np.nanmax(finite)) if np.isfinite(finite).any() else 0.0))
    extra = ""
    if sel.name == "draft.logits" and x.size:
        extra = _topk_lines(vm, labels, np.argsort(-x)[:TOPK], np.argsort(-y)[:TOPK], decode=False)
    return Group(Text(f"values at the worst element {e} of {d.size}", style="bold"), t), series, extra


def _pool(d: np.ndarray, n: int = 120) -> list[float]:
    """Max-pool ``d`` to at most ``n`` points (the sparkline's width)."""
    if d.size <= n:
        return d.astype(float).tolist()
    k = -(-d.size // n)
    pad = np.full(k * n - d.size, 0.0)
    return np.concatenate([d, pad]).reshape(n, k).max(1).astype(float).tolist()


def _topk_lines(vm: ViewModel, labels, ix, iy, *, decode: bool) -> Text:
    out = Text()
    for label, ids in ((labels.x, ix), (labels.y, iy)):
        ids = [int(v) for v in np.asarray(ids).reshape(-1)]
        out.append(f"{label:>9s}  ", style="bold")
        out.append(" ".join(str(v) for v in ids))
        words = [vm.decode([v]) for v in ids] if decode else []
        if words and all(w is not None for w in words):
            out.append("   " + " ".join(repr(w) for w in words), style="italic")
        out.append("\n")
    return out


def detail(vm: ViewModel, sel: Sel) -> Detail:
    """Metrics, |x-y| and the values side by side for the selected cell (or why there is none)."""
    code, i = vm.cell(sel)
    head = Text()
    head.append(f"{sel.name}", style="bold")
    head.append(f"  seq {sel.pair} pos {sel.pos} depth {sel.depth}  ")
    head.append_text(_status_text(code))
    damaged = [Text(f"{label}: {d.message()}", style="bold magenta") for label, d in vm.damage_at(sel)]
    if code == UNREADABLE:
        return Detail(Group(head, Text("not compared: this row lies in a damaged chunk", style="dim"), *damaged), [])
    if code in (NONE, MISSING, UNOBSERVED) or i < 0:
        px, py = vm.present(sel)
        labels = vm.report.labels
        comp = vm.report.comparisons.get(sel.name)
        if comp is not None and comp.kind == "structure":
            why = f"structure: {comp.structure.message} — the layouts differ, so no row is compared"
        elif (hidden := vm.unobserved(sel)) is not None:
            why = f"not observable on {hidden[0]}: {hidden[1]}"
        elif px or py:
            why = (f"recorded by {labels.x if px else labels.y} only" if px != py else
                   "recorded by both sides but not compared (the draft's input tokens differ on this "
                   "depth path; serving drafts from its own guesses)")
        else:
            why = "no row on either side at this cell"
        if damaged:
            why += " (or its row keys lie in a damaged chunk)"
        return Detail(Group(head, Text(why, style="dim"), *damaged), [])
    rows = vm.pair_rows(sel)
    if spec_for(sel.name).kind == "float":
        table, series, extra = _float_values(vm, sel, rows)
        body = Group(head, _metrics(vm, sel, i), Text("|x-y| over the row (max-pooled):", style="dim"))
        values = Group(table, Text("top-k of the row", style="bold"), extra) if extra else Group(table)
        return Detail(body, series, values)
    traces = vm.report.traces
    ix = traces.x.take(sel.name, np.array([rows[0]]))
    iy = traces.y.take(sel.name, np.array([rows[1]]))
    decodable = sel.name in TARGET_IDS
    title = Text("ids" + (" (target vocab, decoded)" if decodable and vm.tokenizer
                          else "" if decodable else " (draft vocab)"), style="bold")
    return Detail(Group(head, _metrics(vm, sel, i)), [],
                  Group(title, _topk_lines(vm, vm.report.labels, ix, iy, decode=decodable)))


def explain(vm: ViewModel) -> Group:
    """Explanations (message, evidence, fix, similarity matrix), contract mismatches, acceptance."""
    r = vm.report
    parts: list = []
    if r.damage:
        parts.append(Text("Damage", style="bold underline magenta"))
        parts += [Text(d.message(), style="magenta") for d in r.damage]
        parts.append(Text(""))
    parts.append(Text("Explanation", style="bold underline"))
    if r.first is None:
        parts.append(Text("no divergence: nothing to explain", style="green"))
    elif not r.explanations:
        parts.append(Text("no known cause: no known mistake's transform closes the gap; inspect the tensors "
                          "in the grid", style="yellow"))
        parts += _narrowing(r.narrowing)
    for e in r.explanations:
        parts.append(Text.assemble((f"{e.cause}: ", "bold red"), e.message))
        for line in e.evidence:
            parts.append(Text(f"  • {line}", style="dim"))
        if e.fix:
            parts.append(Text.assemble(("  fix: ", "bold green"), e.fix))
        if e.matrix:
            parts.append(_matrix(e.matrix))
    if r.findings:
        parts.append(Text(""))
        parts.append(Text("Pre-flight findings (specdiff check)", style="bold underline"))
        for f in r.findings:
            colour = "red" if f["severity"] == "error" else "yellow"
            parts.append(Text.assemble((f"[{f['severity']}] {f['kind']}: ", f"bold {colour}"), f["message"]))
    parts.append(Text(""))
    parts.append(Text("Contract", style="bold underline"))
    if r.contract:
        for m in r.contract:
            colour = {"error": "red", "warn": "yellow"}.get(m.severity, "")
            parts.append(Text.assemble((f"[{m.severity}] ", f"bold {colour}".strip()), m.message))
    else:
        parts.append(Text("the contract facts both sides recorded agree", style="green"))
    parts.append(Text(""))
    parts.append(Text("Acceptance", style="bold underline"))
    parts.append(_acceptance(vm))
    if r.grafts is not None:
        parts.append(Text(""))
        parts.append(Text("Graft", style="bold underline"))
        parts.append(_grafts(r.grafts))
    return Group(*parts)


def _narrowing(n) -> list:
    """The narrowing of an unexplained divergence: each serving input grafted into the training draft."""
    if n is None:
        return []
    if isinstance(n, str):
        return [Text(f"narrowing not run: {n}", style="dim")]
    t = Table(title=f"training's draft re-run on {n.positions} positions vs serving's rows from {n.from_stage} on",
              title_justify="left", box=None, padding=(0, 2), header_style="bold")
    t.add_column("inputs")
    t.add_column("vs serving")
    judged = n.stages[n.stages.index(n.from_stage):]
    for v in n.variants:
        worst = max(judged, key=lambda s: v.scores[s])
        t.add_row(v.name, Text("reproduces serving", style="bold green") if v.reproduces
                  else Text(f"differs ({worst} {fmt(v.scores[worst])})", style="dim"))
    return [t, Text.assemble(("→ ", "bold"), n.conclusion)]


def _grafts(grafts: list) -> Table | Text:
    """The graft ranking: each training input substituted into the serving-input replay."""
    if not grafts:
        return Text("nothing to substitute", style="dim")
    g0 = grafts[0]
    t = Table(title=f"training's draft on serving's inputs: baseline {g0.baseline_accept_length:.2f}, "
                    f"all training inputs {g0.training_accept_length:.2f} ({g0.samples} positions)",
              title_justify="left", box=None, padding=(0, 2), header_style="bold")
    t.add_column("substituted")
    t.add_column("accept length", justify="right")
    t.add_column("gap recovered", justify="right")
    for g in grafts:
        rec = "-" if g.recovered is None else f"{g.recovered:.0%}"
        good = g.recovered is not None and g.recovered >= 0.5
        t.add_row(g.name, f"{g.mean_accept_length:.2f}", Text(rec, style="bold green" if good else ""))
    return t


def _matrix(m: dict) -> Table:
    t = Table(title=m.get("title", "rel err: slot vs HF hidden_states"), title_justify="left", box=None, padding=(0, 1),
              header_style="bold")
    t.add_column("")
    for c in m["cols"]:
        t.add_column(str(c), justify="right")
    for name, vals in zip(m["rows"], m["rel"]):
        best = int(np.argmin(vals)) if len(vals) else -1
        t.add_row(name, *[Text(f"{v:.2g}", style="bold green" if k == best else "dim")
                          for k, v in enumerate(vals)])
    return t


def _acceptance(vm: ViewModel) -> Table | Text:
    acc, labels = vm.report.acceptance, vm.report.labels
    if acc.x.mean_accept_length is None and acc.y.mean_accept_length is None:
        return Text("not recorded on either side", style="dim")
    t = Table(box=None, padding=(0, 2), header_style="bold")
    t.add_column("depth")
    t.add_column(labels.x, justify="right")
    t.add_column(labels.y, justify="right")
    n = max(len(acc.x.per_depth or ()), len(acc.y.per_depth or ()))
    for d in range(n):
        cell = [f"{a.per_depth[d]:.2f}" if a.per_depth and d < len(a.per_depth) else "-" for a in (acc.x, acc.y)]
        t.add_row(str(d + 1), *cell)
    t.add_row("mean accept", *[f"{a.mean_accept_length:.2f}" if a.mean_accept_length is not None else "-"
                               for a in (acc.x, acc.y)], style="bold")
    t.add_row("samples", str(acc.x.samples), str(acc.y.samples), style="dim")
    return t

