"""The diff of two traces as one value (``DiffReport``): built by the pipeline (replay/diff/pipeline.py),
read by the renderers (replay/diff/report.py: text and JSON) and the app (tui/view.py); nothing downstream
recomputes. Its properties are lookups into what the pipeline computed (divergent rows, margins, the
one-line verdict), but for ``serving_rows``: serving's rows accounted for (compare/accounting.py), counted
once on first use from the comparisons as they stand; ``to_json`` is the exact, JSON-safe form of the whole value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from specdiff.replay.diff.compare.accounting import RowAccounting, account, share
from specdiff.replay.diff.contract.crash import crash_verdict
from specdiff.replay.diff.types import (
    DIVERGED,
    Alignment,
    ContractMismatch,
    DiffInputs,
    Explanation,
    Pair,
    TensorComparison,
    bearing_on,
    serve_side,
)
from specdiff.tracer.contract import unknown_facts
from specdiff.tracer.schema import spec_for

#: a passing tensor this close to a limit (limit_use) is named in the verdict: another prompt
#: set may push it over (measured: a correct tiny Qwen3 pair on SGLang 0.5.23, CPU, passed at max_rel
#: 0.0486 against 0.05)
CLOSE_TO_LIMIT = 0.8

#: ``report_format`` of ``to_json`` (``specdiff diff --format json``), its first key: raised when a
#: key is removed or changes meaning, so a script can refuse a layout it does not know (new keys
#: may appear within one version)
REPORT_FORMAT = 1


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
            and version for two engines' traces, else 'A' / 'B' (types.side_names).
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
        unfound_paths: one line per model path a contract records that is not found here, with
            what the report leaves out for it (contract/findings.unfound_paths).
        narrowing: when no explanation fits the first divergence: ``replay.narrow.Narrowing`` (which
            serving input, grafted into the training draft, reproduces serving), or the one-line
            reason it could not run; None when not run.
        reexecution: how re-execution decided ``first`` (replay/diff/rerun/reexec.py ``Reexecution``:
            the draft stages it moved past and why, or why it could not run); None when the first
            row divergence is no draft stage, or nothing re-ran (``narrow=False``).
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
    unfound_paths: list = field(default_factory=list)
    reexecution: object = None  # replay/diff/rerun/reexec.py Reexecution, or None
    #: each trace its writer never closed ({"label", "sequences", "records"}: pipeline.cut_off_traces):
    #: what it lost is not compared, so "no divergence" is never said over it
    cut_off: list = field(default_factory=list)
    #: serving's accept decisions against training's at the same verify steps (compare/outcome.py
    #: ``OutcomeGap``), or None when the pair is not a serving and a training trace with those rows
    outcome: object = None

    @property
    def inputs(self) -> DiffInputs:
        """What the draft re-runs read of this diff (traces, labels, alignment, contract): ``specdiff diff
        --graft`` re-runs the draft on them after the report is built (rerun/graft.py)."""
        return DiffInputs(self.traces, self.labels, self.alignment, self.contract)

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
            bad = [int(i) for i in (comp.status == DIVERGED).nonzero()[0]]
            bad.sort(key=lambda i: (int(comp.match.pos[i]), int(comp.match.pair[i]), int(comp.match.depth[i])))
            out += [(name, i) for i in bad]
        return out

    @property
    def legitimate(self) -> list:
        """Named legitimate differences (``types.Cause``: judge/routing.py ``RoutingFlips``, judge/context.py
        ``ContextRows``, judge/topk_ties.py ``TopkBoundaryTies``), in dataflow order: rows that differ
        beyond tolerance for a reason the engines legitimately have; not divergences."""
        return [c.explanation for c in self.comparisons.values() if c.explanation is not None]

    def inherited(self) -> dict:
        """tensor -> ``{"rows", "from": {tensor: rows}}`` for every tensor with inherited rows
        (rows whose inputs already differ upstream; replay/diff/judge/inherited.py)."""
        return {n: {"rows": c.stats["inherited_rows"], "from": c.stats.get("inherited_from", {})}
                for n, c in self.comparisons.items() if c.stats.get("inherited_rows")}

    @cached_property
    def serving_rows(self) -> RowAccounting:
        """Serving's rows of every compared tensor, per draft depth, accounted for (compare/accounting.py):
        compared (agreeing, failing, inherited, explained) or left out and why. Computed once, on first
        use (the verdict and the JSON read it), from the comparisons as re-execution left them."""
        return account(self.traces, self.alignment, self.comparisons, side=serve_side(self.traces),
                       labels=self.labels)

    def _left_out_words(self) -> str:
        """The clean verdict's clause when some of serving's rows were not compared, or "": rows left out
        never count as agreement, so the verdict says over what share of them it holds."""
        acc = self.serving_rows
        if not acc.left:
            return ""
        # the share over all tensor-rows is diluted by wholly compared tensors (every target.aux row): the
        # lowest place's share is the one a bug in what was left out would hide behind
        names, low = acc.places()[0]
        return (f" ({acc.label} rows compared: {share(acc.compared, acc.rows)}; {share(acc.left, acc.rows)} left "
                f"out; lowest: {share(low.compared, low.rows)} of {acc.place_words(names, low, shown=2)}: see "
                f"'{acc.label} rows left out')")

    def margin(self) -> dict | None:
        """The compared tensor that came closest to a limit without diverging: ``{"tensor",
        "limit", "use"}`` plus its numbers (``use`` 1.0 = at the limit; ``limit``: ``rel``, ``cos``
        or ``fail_frac``), or None when no tensor passed (a stage re-execution moved past did not:
        its rows failed)."""
        best = None
        for n, c in self.comparisons.items():
            use = c.stats.get("limit_use") or {}
            # a stage re-execution moved past failed its rows, proven inherited: no margin to measure
            if c.diverged or c.kind != "values" or not use or c.stats.get("reproduced_by_reexecution"):
                continue
            k = max(use, key=use.get)
            if best is None or use[k] > best["use"]:
                best = {"tensor": n, "limit": k, "use": use[k], "max_rel_passing": c.stats.get("max_rel_passing"),
                        "rel_limit": c.tolerance.rel, "own_fail_rows": c.stats.get("own_fail_rows"),
                        "counted_rows": c.stats.get("counted_rows"), "max_fail_frac": c.tolerance.max_fail_frac}
        return best

    def group_margin(self):
        """The most concentrated group of a tensor that did not diverge (replay/diff/judge/groups.py
        ``Concentration``, not fired): how close a control came to a group divergence; None when
        no tensor's failing rows reach ``GROUP_MIN_ROWS`` in any group."""
        held = [c.concentration for c in self.comparisons.values()
                if not c.diverged and c.concentration is not None and not c.stats.get("reproduced_by_reexecution")]
        return min(held, key=lambda c: c.p) if held else None

    def contract_bearing(self) -> list[ContractMismatch]:
        """Contract differences (and unknown facts) that bear on the first divergence's stage."""
        if self.first is None:
            return []
        return bearing_on(self.contract, spec_for(self.first.name).stage)

    def silent_warnings(self) -> list[ContractMismatch]:
        """Contract warnings of a pair with no divergence (and no crash): recorded facts that differ though
        no tensor shows it (other target weights, an option whose effect the rows stay within tolerance
        of). The text report leads with them."""
        if self.first is not None or self.crash is not None:
            return []
        return [m for m in self.contract if m.severity in ("warn", "error")]

    @property
    def nothing_compared(self) -> bool:
        """No divergence and no crash, yet no row of any tensor was compared (``stats["rows"]`` 0 everywhere):
        a serving trace that holds its sequences' tokens and nothing else (a server that died on its first
        request with no crash recorded), or two traces with no tensor in common. "No divergence" over
        nothing is no verdict."""
        return (self.first is None and self.crash is None
                and not any(c.stats.get("rows", 0) > 0 for c in self.comparisons.values()))

    @property
    def outcome_differs(self) -> list:
        """With no divergence and no crash, the depths at which serving's acceptance differs from training's
        over the same verify steps beyond chance (compare/outcome.py ``OutcomeGap.differing``): the outcome
        is then evidence of a difference in what was not compared. Empty otherwise."""
        if self.first is not None or self.crash is not None or self.outcome is None:
            return []
        return self.outcome.differing()

    def not_compared_rows(self) -> list[str]:
        """Where serving's rows were left out, one phrase per tensor(s) and depth, least compared first
        (``serving_rows``: compare/accounting.py ``RowAccounting.places``), e.g. "draft.hidden_out at depth 2:
        31 of 93 rows left out, off training's path": where an outcome gap with no divergence can come from."""
        acc = self.serving_rows
        return [acc.left_words(names, d) for names, d in acc.places()]

    @property
    def conclusive(self) -> bool:
        """A clean verdict may stand: nothing lost to damage, no trace cut off (``cut_off``), some row
        compared (``nothing_compared``) and no acceptance gap beyond chance (``outcome_differs``)."""
        return not self.incomplete and not self.cut_off and not self.nothing_compared and not self.outcome_differs

    def _cut_words(self) -> str:
        """The verdict's lead naming each cut-off trace (``cut_off``), or ""."""
        return "; ".join(f"{c['label']} trace cut off (not closed: it holds {c['sequences']} sequences, "
                         f"{c['records']} records)" for c in self.cut_off)

    def verdict(self, *, short: bool = False) -> str:
        """The one-line verdict the text report leads with, led by each cut-off trace (``cut_off``:
        then never a plain "no divergence"). ``short``: an explained divergence's cause by its name
        only (``aux_layer_shift``), for the app's header, whose Explain pane says it in full."""
        cut = self._cut_words()
        if not cut or self.nothing_compared:  # nothing compared says each cut-off trace itself
            return self._verdict(short)
        if self.first is None and self.crash is None and not self.incomplete:
            return (f"{cut}: no divergence in what it holds, but what it lost is not compared, so equivalence "
                    f"is not shown{self._damage_note()}")
        return f"{cut}; {self._verdict(short)}"

    def _verdict(self, short: bool) -> str:
        if self.first is None and self.crash is not None:
            return crash_verdict(self.crash)
        if self.nothing_compared:
            return self._nothing_words() + self._damage_note()
        if self.outcome_differs:
            return self._outcome_words() + self._damage_note()
        if self.first is None:
            if self.incomplete:
                return (f"no divergence in the rows that could be read, but the traces are damaged "
                        f"({self._damage_summary()}), so equivalence is not shown; see damage")
            named = "".join(f"; explained: {e.message.split(':')[0]} at {e.tensor} ({len(e.rows)} rows)"
                            for e in self.legitimate)
            m = self.margin()
            close = (f"; close to a limit: {m['tensor']} at {m['use']:.0%} of its {m['limit']} limit"
                     if m is not None and m["use"] >= CLOSE_TO_LIMIT else "")
            silent = self.silent_warnings()
            differs = (f"; but the contract differs: {silent[0].field}"
                       + (f" (+{len(silent) - 1} more)" if len(silent) > 1 else "") + ", see contract warnings"
                       if silent else "")
            return (f"no divergence: {len(self.comparisons)} tensors agree within tolerance over "
                    f"{len(self.alignment.seq_pairs)} sequences{self._left_out_words()}{named}{self._reexec_words()}"
                    f"{close}{differs}{self._damage_note()}")
        e0 = self.explanations[0] if self.explanations else None
        why = "" if e0 is None else f" — {e0.cause}" if short else f" — {e0.message}"
        if self.first.kind == "structure":
            m = self.first.structure
            return (f"first divergence: {self.first.name} (structure: {m.kind.replace('_', ' ')})"
                    + (why or f" — {m.message}") + self._damage_note())
        w = self.first.first_where or self.first.worst or {}
        where = f"seq {w.get('pair')} pos {w.get('pos')}" + (f" depth {w['depth']}" if w.get("depth") else "")
        return f"first divergence: {self.first.name} at {where}{why}{self._reexec_words()}{self._damage_note()}"

    def _nothing_words(self) -> str:
        """The verdict when no row was compared (``nothing_compared``): what each side holds and what to do."""
        held = Pair(self.traces.x.records, self.traces.y.records)
        sides = ((self.labels.x, self.traces.x), (self.labels.y, self.traces.y))
        unwritten = [lab for lab, t in sides if not t.sequences]
        empty = [lab for lab, t in sides if t.records == 0]
        todo = (f"record the {unwritten[0]} side again: its server ended before it wrote a request (see its "
                "log for why)" if len(unwritten) == 1 else
                f"record the {empty[0]} side again (a server that died on its first request leaves its sequences "
                "and no tensor)" if len(empty) == 1 else
                "the traces hold no tensor in common: record both sides of one pipeline (record train --replay "
                "SERVE_TRACE)")
        return (f"nothing compared: no tensor row of the {len(self.alignment.seq_pairs)} aligned sequences is held "
                f"by both sides ({self.labels.x} {held.x} records, {self.labels.y} {held.y}){self._cut_held()}, so "
                f"equivalence is not shown; {todo}")

    def _cut_held(self) -> str:
        """For ``_nothing_words``: each cut-off trace, what it holds (its tensors' names, up to 3) and that no
        crash is recorded (a crash leads the verdict instead), led by "; "; "" when every trace was closed."""
        out = ""
        for c in self.cut_off:
            names = (self.traces.x if c["label"] == self.labels.x else self.traces.y).names
            what = f": {', '.join(names[:3])}" + (f" (+{len(names) - 3} more)" if len(names) > 3 else "") if names else ""
            out += (f"; {c['label']} trace cut off (not closed: it holds {c['sequences']} sequences, {c['records']} "
                    f"records{what}), no crash recorded")
        return out

    def _outcome_words(self) -> str:
        """The verdict of an acceptance gap with no divergence (``outcome_differs``)."""
        left, label = self.not_compared_rows(), self.serving_rows.label
        where = (f"; {label} rows not compared: {'; '.join(left[:3])}"
                 + (f"; {len(left) - 3} more places (see '{label} rows left out')" if len(left) > 3 else "")
                 if left else f"; every {label} row of the {len(self.comparisons)} compared tensors was compared")
        return (f"the outcome differs: no tensor diverged, yet serving accepts differently from training at the "
                f"same steps ({self.outcome.words()}){where}")

    def _reexec_words(self) -> str:
        """The verdict's clause on the draft stages re-execution moved past (rerun/reexec.py), or ""."""
        return self.reexecution.words() if self.reexecution is not None else ""

    def to_json(self) -> dict:
        """JSON-safe dict (``specdiff diff --format json``), exact values (``json_safe``); its
        first key is ``report_format`` (``REPORT_FORMAT``)."""
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
            "report_format": REPORT_FORMAT,
            "verdict": self.verdict(),
            "diverged": self.diverged,
            "incomplete": self.incomplete,
            **({"cut_off": self.cut_off} if self.cut_off else {}),  # only then: other reports' JSON as it was
            **({"nothing_compared": True} if self.nothing_compared else {}),  # likewise
            **({"outcome_differs": [asdict(d) for d in self.outcome_differs]} if self.outcome_differs else {}),
            "crash": self.crash,
            "damage": [{"message": d.message(), **asdict(d)} for d in self.damage],
            "labels": [self.labels.x, self.labels.y],
            "traces": [self.paths.x, self.paths.y],
            "first_divergence": first,
            "explanations": [_explanation_json(e) for e in self.explanations],
            "narrowing": (None if self.narrowing is None else {"not_run": self.narrowing}
                          if isinstance(self.narrowing, str) else asdict(self.narrowing)),
            # only where a draft stage was re-executed: other reports' JSON stays as it was
            **({"reexecution": [asdict(st) for st in self.reexecution.steps]}
               if self.reexecution is not None and self.reexecution.steps else {}),
            "contract_mismatches": [asdict(m) for m in self.contract],
            "unknown_facts": {self.labels.x: unknown_facts(self.traces.x.contract),
                              self.labels.y: unknown_facts(self.traces.y.contract)},
            "preflight_findings": self.findings,
            # only when a path is missing: the JSON of a pair whose paths are all found stays as it was
            **({"paths_not_found": self.unfound_paths} if self.unfound_paths else {}),
            "explained_differences": [{"cause": e.cause, "message": e.message, **asdict(e)} for e in self.legitimate],
            "inherited": self.inherited(),
            # per compared tensor and depth: serving's rows compared, and those left out with why
            "serving_rows": self.serving_rows.to_json(),
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


def _explanation_json(e: Explanation) -> dict:
    """An explanation as the report's JSON has always written it: without ``tensor`` (where a cause
    off the first divergence appears), which its message already names; ``named_only`` only where it
    is true (a recorded fact that differs, named, not proven: explain/differences.py)."""
    out = asdict(e)
    del out["tensor"]
    if not out["named_only"]:
        del out["named_only"]
    return out
