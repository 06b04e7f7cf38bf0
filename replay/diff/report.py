"""The diff of two traces as one value: computed once, rendered by the text report, JSON and the TUI.

``diff_traces`` runs align -> compare -> first divergence -> contract check -> explain ->
acceptance and returns a ``DiffReport``; nothing downstream recomputes.
"""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from dataclasses import asdict, dataclass, field

import numpy as np

from specdiff.replay.diff.acceptance import Acceptance, acceptance
from specdiff.replay.diff.align import Alignment, AlignmentError, Pair, align_sequences
from specdiff.replay.diff.compare import TensorComparison, compare_all, first_divergence
from specdiff.replay.diff.contract_check import (
    ContractMismatch,
    bearing_on,
    check_contracts,
    refuse_different_targets,
    unknown_facts,
)
from specdiff.replay.diff.crash import (
    crash_cause,
    crash_divergence,
    crash_explanations,
    crash_text,
    crash_verdict,
)
from specdiff.replay.diff.explain import Explanation, explain, side_names
from specdiff.replay.diff.findings import crash_findings, matching_findings
from specdiff.replay.diff.routing import target_family
from specdiff.replay.diff.structure import structure_mismatches
from specdiff.tracer.schema import ordered, spec_for
from specdiff.tracer.store import open_trace

#: a passing tensor this close to a limit (limit_use) is named in the verdict: another prompt
#: set may push it over (issue 20: a Qwen3 control passed at max_rel 0.0486 against 0.05)
CLOSE_TO_LIMIT = 0.8


def json_safe(v):
    """``v`` with numpy scalars as Python numbers and non-finite floats as strings ("nan", "inf"),
    through dicts, lists and tuples: what ``json.dumps`` writes as strict JSON, values exact."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


@dataclass
class DiffReport:
    """Everything ``specdiff diff`` knows about two traces.

    Attributes:
        paths, labels: per side (``Pair``); labels are 'training' / 'serving', each engine
            and version for two engines' traces, else 'A' / 'B' (explain.side_names).
        alignment: sequence pairs.
        comparisons: tensor name -> TensorComparison, dataflow order.
        first: the first diverging tensor, or None.
        explanations: causes whose transform closes the gap at ``first``.
        contract: contract mismatches, most severe first.
        acceptance: per side.
        traces: the opened traces (for views that show values).
        grafts: ``replay.graft.GraftResult`` per substitution, ranked (``specdiff diff --graft``),
            or None when not computed.
        findings: pre-flight findings that bear on the first divergence.
        narrowing: when no explanation fits the first divergence: ``replay.narrow.Narrowing`` (which
            serving input, grafted into the training draft, reproduces serving), or the one-line
            reason it could not run; None when not run.
    """

    paths: Pair
    labels: Pair
    alignment: Alignment
    comparisons: dict[str, TensorComparison]
    first: TensorComparison | None
    explanations: list[Explanation]
    contract: list[ContractMismatch]
    acceptance: Pair
    traces: Pair
    grafts: list | None = None
    findings: list = field(default_factory=list)
    narrowing: object = None  # replay.narrow.Narrowing, or the reason it could not run (str), or None
    alignment_error: str | None = None  # why no sequence paired (only kept when a structure finding leads)
    crash: dict | None = None  # {"label": side, **the contract's crash record}: a side's engine died

    @property
    def diverged(self) -> bool:
        return self.first is not None or self.crash is not None

    @property
    def damage(self) -> list:
        """``tracer.store.damage.Damage`` found in either trace (at open and while diffing)."""
        return self.traces.x.damage + self.traces.y.damage

    @property
    def incomplete(self) -> bool:
        """Recorded values of either trace could not be read, so "no divergence" cannot be claimed."""
        return any(d.lost for d in self.damage)

    def unreadable_rows(self) -> int:
        """Recorded rows of both traces that could not be read (union of damaged row ranges per tensor)."""
        total = 0
        for trace in (self.traces.x, self.traces.y):
            spans: dict[str, list[tuple[int, int]]] = {}
            for d in trace.damage:
                if d.lost and d.rows is not None:
                    spans.setdefault(d.tensor, []).append(d.rows)
            for ranges in spans.values():
                end = 0
                for a, b in sorted(ranges):
                    total += max(b - max(a, end), 0)
                    end = max(end, b)
        return total

    def _damage_summary(self) -> str:
        damage = self.damage
        parts = f"{len(damage)} damaged part{'s' if len(damage) > 1 else ''}"
        return f"{parts}, {self.unreadable_rows()} recorded rows unreadable" if self.incomplete else \
            f"{parts}, nothing lost"

    def _damage_note(self) -> str:
        return f" (damaged traces: {self._damage_summary()}; see damage)" if self.damage else ""

    @property
    def divergences(self) -> list[tuple[str, int]]:
        """(tensor name, aligned row) of every failing row, in dataflow then position order."""
        out = []
        for name, comp in self.comparisons.items():
            if not comp.diverged:
                continue
            bad = [int(i) for i in (comp.status == 2).nonzero()[0]]
            bad.sort(key=lambda i: (int(comp.match.pos[i]), int(comp.match.pair[i]), int(comp.match.depth[i])))
            out += [(name, i) for i in bad]
        return out

    @property
    def legitimate(self) -> list:
        """Named legitimate differences (``routing.RoutingFlips``), in dataflow order: rows that
        differ beyond tolerance for a reason the target family makes legitimate; not divergences."""
        return [c.explanation for c in self.comparisons.values() if c.explanation is not None]

    def inherited(self) -> dict:
        """tensor -> ``{"rows", "from": {tensor: rows}}`` for every tensor with inherited rows
        (rows whose inputs already differ upstream; replay/diff/inherited.py)."""
        return {n: {"rows": c.stats["inherited_rows"], "from": c.stats.get("inherited_from", {})}
                for n, c in self.comparisons.items() if c.stats.get("inherited_rows")}

    def margin(self) -> dict | None:
        """The compared tensor that came closest to a limit without diverging: ``{"tensor",
        "limit", "use"}`` plus its numbers (``use`` 1.0 = at the limit; ``limit``: ``rel``, ``cos``
        or ``fail_frac``), or None when no tensor passed."""
        best = None
        for n, c in self.comparisons.items():
            use = c.stats.get("limit_use") or {}
            if c.diverged or c.kind != "values" or not use:
                continue
            k = max(use, key=use.get)
            if best is None or use[k] > best["use"]:
                best = {"tensor": n, "limit": k, "use": use[k], "max_rel_passing": c.stats.get("max_rel_passing"),
                        "rel_limit": c.tolerance.rel, "own_fail_rows": c.stats.get("own_fail_rows"),
                        "counted_rows": c.stats.get("counted_rows"), "max_fail_frac": c.tolerance.max_fail_frac}
        return best

    def group_margin(self):
        """The most concentrated group of a tensor that did not diverge (replay/diff/groups.py
        ``Concentration``, not fired): how close a control came to a group divergence; None when
        no tensor's failing rows reach ``GROUP_MIN_ROWS`` in any group."""
        held = [c.concentration for c in self.comparisons.values()
                if not c.diverged and c.concentration is not None]
        return min(held, key=lambda c: c.p) if held else None

    def contract_bearing(self) -> list[ContractMismatch]:
        """Contract differences (and unknown facts) that bear on the first divergence's stage."""
        if self.first is None:
            return []
        return bearing_on(self.contract, spec_for(self.first.name).stage)

    def verdict(self, *, short: bool = False) -> str:
        """The one-line verdict the text report leads with. ``short``: an explained divergence's cause
        by its name only (``aux_layer_shift``), for the app's header, whose Explain pane says it in full."""
        if self.first is None and self.crash is not None:
            return crash_verdict(self.crash)
        if self.first is None:
            if self.incomplete:
                return (f"no divergence in the rows that could be read, but the traces are damaged "
                        f"({self._damage_summary()}), so equivalence is not shown; see damage")
            named = "".join(f"; explained: {e.message().split(':')[0]} at {e.tensor} ({len(e.rows)} rows)"
                            for e in self.legitimate)
            m = self.margin()
            close = (f"; close to a limit: {m['tensor']} at {m['use']:.0%} of its {m['limit']} limit"
                     if m is not None and m["use"] >= CLOSE_TO_LIMIT else "")
            return (f"no divergence: {len(self.comparisons)} tensors agree within tolerance over "
                    f"{len(self.alignment.seq_pairs)} sequences{named}{close}{self._damage_note()}")
        e0 = self.explanations[0] if self.explanations else None
        why = "" if e0 is None else f" — {e0.cause}" if short else f" — {e0.message}"
        if self.first.kind == "structure":
            m = self.first.structure
            return (f"first divergence: {self.first.name} (structure: {m.kind.replace('_', ' ')})"
                    + (why or f" — {m.message}") + self._damage_note())
        w = self.first.first_where or self.first.worst or {}
        where = f"seq {w.get('pair')} pos {w.get('pos')}" + (f" depth {w['depth']}" if w.get("depth") else "")
        return f"first divergence: {self.first.name} at {where}{why}{self._damage_note()}"

    def to_json(self) -> dict:
        """JSON-safe dict (``specdiff diff --format json``), exact values (``json_safe``)."""
        clean = json_safe
        first = None
        if self.first is not None:
            w = self.first.first_where or {}
            first = {"tensor": self.first.name, "seq": w.get("pair"), "pos": w.get("pos"), "depth": w.get("depth"),
                     "stats": self.first.stats, "worst": self.first.worst,
                     "tolerance": asdict(self.first.tolerance), "kind": self.first.kind,
                     "structure": asdict(self.first.structure) if self.first.structure is not None else None,
                     # the mismatches themselves are in contract_mismatches (said once): their fields here
                     "contract_bearing": [m.field for m in self.contract_bearing()]}
        # most important first: the verdict, what invalidates it (crash, damage, contract errors), the
        # first divergence and its explanation, then the evidence
        return clean({
            "verdict": self.verdict(),
            "diverged": self.diverged,
            "incomplete": self.incomplete,
            "crash": self.crash,
            "damage": [{"message": d.message(), **asdict(d)} for d in self.damage],
            "labels": [self.labels.x, self.labels.y],
            "traces": [self.paths.x, self.paths.y],
            "first_divergence": first,
            "explanations": [asdict(e) for e in self.explanations],
            "narrowing": (None if self.narrowing is None else {"not_run": self.narrowing}
                          if isinstance(self.narrowing, str) else asdict(self.narrowing)),
            "contract_mismatches": [asdict(m) for m in self.contract],
            "unknown_facts": {self.labels.x: unknown_facts(self.traces.x.contract),
                              self.labels.y: unknown_facts(self.traces.y.contract)},
            "preflight_findings": self.findings,
            "explained_differences": [{"cause": e.cause, "message": e.message(), **asdict(e)} for e in self.legitimate],
            "inherited": self.inherited(),
            "margin": self.margin(),
            "acceptance": {lab: asdict(a) for lab, a in ((self.labels.x, self.acceptance.x),
                                                        (self.labels.y, self.acceptance.y))},
            "grafts": None if self.grafts is None else [asdict(g) for g in self.grafts],
            "alignment_error": self.alignment_error,
            "sequences": [{"seq": p.index, "ids": [p.seq.x, p.seq.y], "length": p.length,
                           "start": [p.start.x, p.start.y], "format": asdict(p.format) if p.format else None}
                          for p in self.alignment.seq_pairs],
            "tensors": {n: {"diverged": c.diverged, "kind": c.kind, **c.stats, "tolerance": asdict(c.tolerance)}
                        for n, c in self.comparisons.items()},
        })


def diff_traces(path_x: str, path_y: str, *, preset: str = "default", overrides: dict | None = None,
                progress=None, narrow: bool = True, on_first=None, on_rows=None, runner=None) -> DiffReport:
    """Diff two traces (paths or fsspec URLs); A is usually training, B serving.

    ``on_first`` / ``on_rows`` / ``runner``: see ``diff_opened``.

    Raises:
        TraceError: a trace cannot be opened. AlignmentError: no common sequence.
    """
    traces = Pair(open_trace(path_x), open_trace(path_y))
    return diff_opened(traces, preset=preset, overrides=overrides, progress=progress, narrow=narrow,
                       on_first=on_first, on_rows=on_rows, runner=runner)


def _crash(traces: Pair, labels: Pair) -> dict | None:
    for label, trace in ((labels.x, traces.x), (labels.y, traces.y)):
        crash = trace.contract.get("crash")
        if isinstance(crash, dict):
            return {"label": label, **crash}
    return None


def diff_opened(traces: Pair, *, preset: str = "default", overrides: dict | None = None,
                progress=None, narrow: bool = True, on_first=None, on_rows=None,
                on_partial=None, runner=None) -> DiffReport:
    """``diff_traces`` on already opened traces (the TUI re-runs this with another preset).

    A side whose engine crashed (contract ``crash``, tracer/crash.py) before recording any
    sequence is compared by its contract and the pre-flight findings alone; the crash is the
    first divergence, with the finding that explains it.

    ``narrow``: when no explanation fits a value divergence, re-run the training draft with each
    serving input grafted in (replay.narrow; loads torch and the draft checkpoint when at hand).

    ``on_first(replay.diff.early.EarlyFirst)``: called once, as soon as the rows read so far prove
    the first divergence (the same the report's ``first`` names), before the totals, the
    explanation and the narrowing are computed; not called when nothing diverges.
    ``on_rows(done, total)``: rows compared so far (see ``compare.compare_all``).
    ``on_partial(DiffReport)``: the report as it stands while tensors are compared (comparisons so
    far, ``first`` once proven; no explanation, contract or acceptance yet), for the app's grid.
    ``runner``: where the per-block metrics are computed (``replay.diff.blocks.LocalBlocks``, the
    default, or ``ExecutorBlocks`` on Dask workers); the report is the same either way.

    Raises:
        DifferentTargetsError: the traces' target identity facts differ (contract_check), before
            anything is compared.
    """
    refuse_different_targets(traces)  # traces of two different targets: nothing below is meaningful
    labels = side_names(traces)  # by engine (and version) when two engines served
    crash = _crash(traces, labels)
    if crash is not None and not (traces.x.sequences and traces.y.sequences):
        empty = Alignment((), Pair((), ()))
        none = Acceptance(None, None, {}, 0)
        _, crash = crash_divergence(traces, labels, empty, {}, None, crash)
        mismatches, findings = check_contracts(traces), crash_findings(traces, crash)
        crash["cause"] = crash_cause(traces, labels, crash, findings, mismatches)
        return DiffReport(traces.map(lambda t: t.path), labels, empty, {}, None, crash_explanations(crash, None),
                          mismatches,
                          Pair(none, none), traces, findings=findings, crash=crash)
    structure = structure_mismatches(traces, labels)
    alignment_error = None
    try:
        alignment = align_sequences(traces, decode=_LazyDecode(traces))
    except AlignmentError as exc:
        if not structure:
            raise
        # The layouts differ: that is the finding, even when no row can be paired.
        alignment, alignment_error = Alignment((), Pair((), ())), str(exc)
    comps = compare_all(traces, alignment, preset=preset, overrides=overrides, progress=progress,
                        structure=structure, on_first=on_first, on_rows=on_rows, runner=runner,
                        on_partial=None if on_partial is None else
                        lambda comps, early: on_partial(_partial_report(traces, labels, alignment, comps, early)))
    first = first_divergence(comps)
    if crash is not None:  # where the crashed side stopped; the crash leads unless a value diverged earlier
        first, crash = crash_divergence(traces, labels, alignment, comps, first, crash)
    report = DiffReport(traces.map(lambda t: t.path), labels, alignment, comps, first,
                        explain(traces, alignment, comps, first), check_contracts(traces),
                        acceptance(traces, alignment), traces,
                        findings=matching_findings(traces, first) if crash is None or first is not None
                        else crash_findings(traces, crash), crash=crash, alignment_error=alignment_error)
    if crash is not None:
        crash["cause"] = crash_cause(traces, labels, crash, crash_findings(traces, crash), report.contract)
        report.explanations = report.explanations or crash_explanations(crash, first)
    if narrow and first is not None and first.kind == "values" and not report.explanations:
        from specdiff.replay.diff.narrow import narrow_or_reason

        report.narrowing = narrow_or_reason(report)
    return report


def _partial_report(traces: Pair, labels: Pair, alignment: Alignment, comps: dict, early) -> DiffReport:
    """A report of the comparisons so far; ``first`` only once proven (``early``, replay/diff/early.py)."""
    none = Acceptance(None, None, {}, 0)
    first = comps.get(early.name) if early is not None else None
    if first is not None and first.kind != early.kind:
        first = None
    return DiffReport(traces.map(lambda t: t.path), labels, alignment, {n: comps[n] for n in ordered(comps)},
                      first, [], [], Pair(none, none), traces)


class _LazyDecode:
    """``ids -> str`` with the target tokenizer, loaded on first use (only an error message needs it)."""

    def __init__(self, traces: Pair):
        self.traces, self.fn, self.loaded = traces, None, False

    def __call__(self, ids):
        if not self.loaded:
            from specdiff.replay.diff.token_format import decoder, load_tokenizer

            self.fn, self.loaded = decoder(load_tokenizer(self.traces)), True
        return self.fn(ids) if self.fn else None


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
    for v in n.variants:
        worst = max(n.stages[n.stages.index(n.from_stage):], key=lambda s: v.scores[s])
        mark = "REPRODUCES serving" if v.reproduces else f"differs ({worst} {_fmt(v.scores[worst])})"
        rows.append(f"    {v.name:28s} {mark}")
    rows.append(f"  -> {n.conclusion}")
    return rows


#: the width the text report wraps at when the output is not a terminal (tests, pipes, CI logs)
DEFAULT_WIDTH = 120


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
        fam = target_family(report.traces, report.labels).words()
        out.append(f"  MoE target ({fam}): not MoE routing near-ties: {s['routing_not_named']}")
    if s.get("inherited_rows") or s.get("explained_rows"):
        out.append(f"  judged on {s['counted_rows']} rows whose inputs agree: {s['own_fail_rows']} fail "
                   f"({s['own_fail_frac']:.3g}){_inherited_note(f)}")
    tol = f.tolerance
    out.append(f"  tolerance: rel <= {tol.rel:g}, cos >= {tol.cos:g}, ids overlap >= {tol.ids:g}, "
               f"fail fraction <= {tol.max_fail_frac:g}")
    if f.worst and f.kind != "tokens":
        w = f.worst
        out.append(f"  worst: seq {w['pair']} pos {w['pos']} depth {w['depth']} element {w['element']}: "
                   f"{report.labels.x} {_fmt(w['x'])} vs {report.labels.y} {_fmt(w['y'])}")
    return out


def _explanation_rows(report: DiffReport) -> list[str]:
    """The causes: the headline already says the first one's message, so it is named, not repeated."""
    if not report.explanations:
        return ["explanation: no known cause — no known mistake's transform closes the gap",
                *_narrowing_rows(report.narrowing)]
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
    ``DEFAULT_WIDTH`` when the output is not a terminal.
    """
    width = width or shutil.get_terminal_size((DEFAULT_WIDTH, 40)).columns
    out = [report.verdict(), ""]
    if report.crash is not None:
        out += [*_crash_rows(report), ""]
    if report.damage:
        out += ["damage", *[f"  {d.message()}" for d in report.damage], ""]
    errors = [m for m in report.contract if m.severity == "error"]
    if errors:
        out += ["contract errors (the two sides cannot agree while these differ)",
                *_contract_rows(errors, [], None), ""]
    if report.first is not None:
        out += ["first divergence", *_first_rows(report), "", *_explanation_rows(report), ""]
    others = [m for m in report.contract if m.severity != "error"]
    out.append("contract")
    if others:
        out += _contract_rows(others, report.contract_bearing(), report.first.name if report.first else None)
    elif not errors:
        out.append("  the contract facts both sides recorded agree")
    else:
        out.append("  no other difference")
    if report.findings and report.crash is None:
        out += ["", "pre-flight findings (specdiff check) that bear on it",
                *[f"  [{f['severity']}] {f['kind']}: {f['message']}" for f in report.findings]]
    out += _legitimate_rows(report)
    out += ["", "acceptance (over the aligned positions)", *_acc_rows(report.labels, report.acceptance)]
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


def _inherited_note(c: TensorComparison) -> str:
    n, e = c.stats.get("inherited_rows", 0), c.stats.get("explained_rows", 0)
    return (f"  inherited {n}" if n else "") + (f"  explained {e}" if e else "")


def _legitimate_rows(report: DiffReport) -> list[str]:
    """Named legitimate differences, inherited rows and the closest margin (text report)."""
    out = []
    if report.legitimate:
        out += ["", "explained differences (legitimate for this target family, not divergences)"]
        for e in report.legitimate:
            out.append(f"  {e.cause}: {e.message()}")
            out += [f"    {line}" for line in e.evidence()]
    inh = report.inherited()
    if inh:
        out += ["", "inherited rows (their inputs already differ upstream; not counted as new divergences)"]
        for n, v in inh.items():
            src = ", ".join(f"{k} ({c})" for k, c in v["from"].items())
            out.append(f"  {n:26s} {v['rows']} rows from {src}")
    m = report.margin()
    if m is not None:
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
        from specdiff.replay.diff.groups import GROUP_ALPHA, GROUP_FAR

        far = g.min_fail_rel / g.noise_floor if g.noise_floor else float("inf")
        out.append(f"margin: most concentrated failures: {g.tensor} on {g.group}: {g.fail_rows} of {g.rows} rows, "
                   f"chance {g.p:.2g} (a divergence at <= {GROUP_ALPHA:g}), {far:.1f}x the group's noise floor "
                   f"(at >= {GROUP_FAR:g}x)")
    return out


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
