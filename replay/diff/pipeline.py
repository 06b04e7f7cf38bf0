"""The diff pipeline: two traces in, one ``DiffReport`` (replay/diff/result.py) out.

``diff_opened`` is the whole pipeline, read top to bottom; each stage is one call that returns one
field of the report, and the report is built from them by keyword. The stages, the report field
each fills, and the module that computes it:

====  ==========================  ===============  ===================================================
 #    stage                       report field     module (under replay/diff/)
====  ==========================  ===============  ===================================================
 1    refuse different targets    (raises)         contract/check.refuse_different_targets
 2    name the sides              labels           types.side_names
 3    a side's engine crashed     crash            ``crash_record`` (here); a side that crashed before
                                                   recording any sequence ends the pipeline here
                                                   (``crash_only``: contract and findings alone)
 4    layouts                     (feeds 5, 6)     align/structure.structure_mismatches
 5    align sequences             alignment        align/align.align_sequences
 6    compare every tensor        comparisons      compare/compare.compare_all: rows compared in
                                                   compare/ (blocks, early) with measure/ (metrics,
                                                   tolerance), judged in judge/ (inherited, then
                                                   the first of ``judge.JUDGES``: topk_ties, routing,
                                                   context, then groups); judge/context_proof re-runs
                                                   the draft (runner.py) when
                                                   the context judge asks
 7    first divergence            first            compare/compare.first_divergence, then
                                  reexecution      rerun/reexec.decide (a draft stage serving's own
                                                   inputs reproduce is moved past: inherited);
                                                   contract/crash.crash_divergence (where the crashed
                                                   side stopped)
 8    explain it                  explanations     explain.explain (``explain.CHECKS`` in order);
                                                   contract/crash.crash_explanations when the crash leads
 9    contract check              contract         contract/check.check_contracts, run once,
                                                   after 2 (``types.DiffInputs`` carries it to the
                                                   re-runs of 6, 7, 12 and to 8)
 10   acceptance                  acceptance       compare/acceptance.acceptance
                                  outcome          compare/outcome.outcome_gap (serving's accept decisions
                                                   against training's at the same verify steps)
 11   pre-flight findings         findings         contract/findings.matching_findings / crash_findings;
                                                   contract/crash.crash_cause (the crash's cause);
                                  unfound_paths    contract/findings.unfound_paths (model paths not found)
 12   narrow an unexplained one   narrowing        rerun/narrow.narrow_or_reason (re-runs the draft)
====  ==========================  ===============  ===================================================

Every cause an explanation, a judge or a crash can name is a row of causes.py.

The stages after alignment read one ``types.DiffInputs`` (traces, labels, alignment, contract), never a
report being built. The folders import in the order they run (tests/architecture/test_layering.py
``LAYERS``): types and causes, measure/, align/, contract/, runner.py (the draft re-run's setup),
judge/, compare/, rerun/, explain/, then this module, result.py and report.py.

Rendering is elsewhere: replay/diff/report.py (text, JSON) and tui/ (the app) only read the report.
``specdiff diff --graft`` adds ``grafts`` afterwards (tui/cmd_diff.py, replay/diff/rerun/graft.py).
"""

from __future__ import annotations

from specdiff.replay.diff.align.align import AlignmentError, align_sequences
from specdiff.replay.diff.align.structure import structure_mismatches
from specdiff.replay.diff.align.token_format import decoder, load_tokenizer
from specdiff.replay.diff.compare.acceptance import Acceptance, acceptance
from specdiff.replay.diff.compare.compare import compare_all, first_divergence
from specdiff.replay.diff.compare.outcome import outcome_gap
from specdiff.replay.diff.contract.check import check_contracts, refuse_different_targets
from specdiff.replay.diff.contract.crash import crash_cause, crash_divergence, crash_explanations
from specdiff.replay.diff.contract.findings import crash_findings, matching_findings, unfound_paths
from specdiff.replay.diff.explain import explain
from specdiff.replay.diff.judge.context_proof import ContextProver
from specdiff.replay.diff.rerun.narrow import narrow_or_reason
from specdiff.replay.diff.rerun.reexec import decide
from specdiff.replay.diff.result import DiffReport
from specdiff.replay.diff.types import Alignment, DiffInputs, Pair, side_names
from specdiff.tracer.schema import ordered
from specdiff.tracer.store import open_trace


def diff_traces(path_x: str, path_y: str, *, preset: str = "default", overrides: dict | None = None,
                progress=None, narrow: bool = True, on_first=None, on_rows=None, runner=None,
                draft_path: str | None = None, target_path: str | None = None) -> DiffReport:
    """Diff two traces (paths or fsspec URLs); A is usually training, B serving.

    ``on_first`` / ``on_rows`` / ``runner`` / ``draft_path`` / ``target_path``: see ``diff_opened``.

    Raises:
        TraceError: a trace cannot be opened. AlignmentError: no common sequence.
    """
    traces = Pair(open_trace(path_x), open_trace(path_y))
    return diff_opened(traces, preset=preset, overrides=overrides, progress=progress, narrow=narrow,
                       on_first=on_first, on_rows=on_rows, runner=runner, draft_path=draft_path,
                       target_path=target_path)


def diff_opened(traces: Pair, *, preset: str = "default", overrides: dict | None = None,
                progress=None, narrow: bool = True, on_first=None, on_rows=None,
                on_partial=None, runner=None, draft_path: str | None = None,
                target_path: str | None = None) -> DiffReport:
    """``diff_traces`` on already opened traces (the TUI re-runs this with another preset): the
    stages of the module docstring, in order.

    A side whose engine crashed (contract ``crash``, tracer/crash.py) before recording any
    sequence is compared by its contract and the pre-flight findings alone; the crash is the
    first divergence, with the finding that explains it.

    ``narrow``: when no explanation fits a value divergence, re-run the training draft with each
    serving input grafted in (replay.narrow; loads torch and the draft checkpoint when at hand);
    and when too few rows show the draft attention agrees over agreeing context, re-run it on both
    sides' inputs instead (replay/diff/judge/context_proof.py). False: no re-run at all.
    ``draft_path`` / ``target_path``: the draft as trained (and its target, when the draft shares its
    embedding) for every such re-run; default the training contract's ``draft_name`` / ``model_name``
    (``specdiff diff --draft / --target``).

    ``on_first(replay.diff.compare.early.EarlyFirst)``: called once, as soon as the rows read so far prove
    the first divergence (the same the report's ``first`` names), before the totals, the
    explanation and the narrowing are computed; not called when nothing diverges.
    ``on_rows(done, total)``: rows compared so far (see ``compare.compare_all``).
    ``on_partial(DiffReport)``: the report as it stands while tensors are compared (comparisons so
    far, ``first`` once proven; no explanation, contract or acceptance yet), for the app's grid.
    ``runner``: where the per-block metrics are computed (``replay.diff.compare.blocks.LocalBlocks``, the
    default, or ``ExecutorBlocks`` on Dask workers); the report is the same either way.

    Raises:
        DifferentTargetsError: the traces' target identity facts differ (contract/check.py), before
            anything is compared.
    """
    refuse_different_targets(traces)  # traces of two different targets: nothing below is meaningful
    labels = side_names(traces)  # by engine (and version) when two engines served
    contract = check_contracts(traces)  # once per diff: re-execution and the explanations read it
    crash = crash_record(traces, labels)
    if crash is not None and not (traces.x.sequences and traces.y.sequences):
        return crash_only(traces, labels, crash, contract)
    structure = structure_mismatches(traces, labels)
    alignment, alignment_error = align(traces, structure)
    inputs = DiffInputs(traces, labels, alignment, contract)
    # the draft re-run a context judgement asks for when too few rows show the attention agrees
    prove = ContextProver(inputs, draft_path=draft_path, target_path=target_path) if narrow else None
    comparisons = compare_all(traces, alignment, preset=preset, overrides=overrides, progress=progress,
                              structure=structure, on_first=on_first, on_rows=on_rows, runner=runner,
                              prove_context=prove,
                              on_partial=None if on_partial is None else lambda comps, early:
                              on_partial(partial_report(traces, labels, alignment, comps, early)))
    first, reexec = first_divergence(comparisons), None
    if narrow:  # a draft stage is the first divergence only where re-execution does not reproduce serving
        first, reexec = decide(inputs, comparisons, draft_path=draft_path, target_path=target_path)
    if crash is not None:  # where the crashed side stopped; the crash leads unless a value diverged earlier
        first, crash = crash_divergence(traces, labels, alignment, comparisons, first, crash)
    explanations = explain(inputs, comparisons, first)
    accepted = acceptance(traces, alignment)
    findings = relevant_findings(traces, labels, first, crash, contract)  # and the crash's cause
    report = _report(
        traces, labels,
        alignment=alignment, alignment_error=alignment_error,
        comparisons=comparisons,
        first=first,
        explanations=explanations or crash_explanations(crash, first),
        contract=contract,
        acceptance=accepted,
        findings=findings,
        crash=crash,
        unfound_paths=unfound_paths(traces, labels, draft_given=draft_path is not None),
        reexecution=reexec,
        cut_off=cut_off_traces(traces, labels),
        outcome=outcome_gap(traces, alignment, labels),
    )
    # the last stage reads the report built so far (the draft, the failing rows, the contract)
    report.narrowing = narrowing(report, draft_path=draft_path, target_path=target_path, done=reexec) if narrow else None
    return report


def cut_off_traces(traces: Pair, labels: Pair) -> list[dict]:
    """``{"label", "sequences", "records"}`` of each trace its writer never closed (a server killed
    before its writer wrote everything, or a trace still being written): what it lacks is not compared."""
    return [{"label": label, "sequences": len(t.sequences), "records": int(t.records)}
            for label, t in ((labels.x, traces.x), (labels.y, traces.y)) if not t.closed]


def crash_record(traces: Pair, labels: Pair) -> dict | None:
    """``{"label": side, **the contract's crash record}`` of the first side (x, then y) whose engine
    died while recording (contract ``crash``, tracer/crash.py), or None."""
    for label, trace in ((labels.x, traces.x), (labels.y, traces.y)):
        crash = trace.contract.get("crash")
        if isinstance(crash, dict):
            return {"label": label, **crash}
    return None


def crash_only(traces: Pair, labels: Pair, crash: dict, contract: list) -> DiffReport:
    """The report when a side crashed before recording any sequence: nothing to align or compare;
    the crash is the divergence, explained by the contract (``contract``: its mismatches) and the
    pre-flight findings."""
    nothing = Alignment((), Pair((), ()))
    _, crash = crash_divergence(traces, labels, nothing, {}, None, crash)
    findings = crash_findings(traces, crash)
    crash["cause"] = crash_cause(traces, labels, crash, findings, contract)
    return _report(traces, labels, alignment=nothing, comparisons={}, first=None,
                   explanations=crash_explanations(crash, None), contract=contract, findings=findings, crash=crash,
                   unfound_paths=unfound_paths(traces, labels))


def align(traces: Pair, structure: list) -> tuple[Alignment, str | None]:
    """``(alignment, alignment_error)``: the sequence pairs, or, when no sequence pairs but the
    layouts differ (``structure`` non-empty), no pairs and why (the layout difference leads); no pairs
    and no error when a trace never closed holds no sequence (a server that ended before it wrote a
    request: nothing is compared, ``DiffReport.nothing_compared`` says what it holds).

    Raises:
        AlignmentError: no common sequence, the layouts agree and every trace without a sequence was closed.
    """
    try:
        return align_sequences(traces, decode=_LazyDecode(traces)), None
    except AlignmentError as exc:
        if any(not t.sequences and not t.closed for t in (traces.x, traces.y)):
            return Alignment((), Pair(*(tuple(s.id for s in t.sequences) for t in (traces.x, traces.y)))), None
        if not structure:
            raise
        # The layouts differ: that is the finding, even when no row can be paired.
        return Alignment((), Pair((), ())), str(exc)


def relevant_findings(traces: Pair, labels: Pair, first, crash: dict | None, contract: list) -> list[dict]:
    """Pre-flight findings that bear on the first divergence, or on the crash when it leads; a
    crash's record gets its ``cause`` here (crash.crash_cause: its findings, then the contract)."""
    if crash is None:
        return matching_findings(traces, first)
    if first is None:  # the crash leads: its findings are the report's
        found = for_crash = crash_findings(traces, crash)
    else:
        found, for_crash = matching_findings(traces, first), crash_findings(traces, crash)
    crash["cause"] = crash_cause(traces, labels, crash, for_crash, contract)
    return found


def narrowing(report: DiffReport, *, draft_path: str | None = None, target_path: str | None = None,
              done=None):
    """``replay.narrow.Narrowing`` (or the one-line reason it could not run) when the first
    divergence is of values and nothing explains it (recorded facts that differ, named by
    explain/differences.py, do not count: they are not proven); None otherwise. Imported lazily: it loads torch.
    ``draft_path`` / ``target_path``: as in ``diff_opened``. ``done``: the verdict's re-execution
    (rerun/reexec.py), whose last narrowing is reused when it is of the same first divergence."""
    first = report.first
    if first is None or first.kind != "values" or any(not e.named_only for e in report.explanations):
        return None
    if done is not None and done.steps and done.steps[-1].stage == first.name and done.narrowing is not None:
        return done.narrowing

    return narrow_or_reason(report.inputs, report.comparisons, first, draft_path=draft_path, target_path=target_path)


def partial_report(traces: Pair, labels: Pair, alignment: Alignment, comps: dict, early) -> DiffReport:
    """A report of the comparisons so far; ``first`` only once proven (``early``, replay/diff/compare/early.py)."""
    first = comps.get(early.name) if early is not None else None
    if first is not None and first.kind != early.kind:
        first = None
    return _report(traces, labels, alignment=alignment, comparisons={n: comps[n] for n in ordered(comps)},
                   first=first, explanations=[], contract=[])


def _report(traces: Pair, labels: Pair, **fields) -> DiffReport:
    """``DiffReport`` of ``traces`` (paths and side labels filled in); acceptance unknown on both
    sides unless ``fields`` gives it."""
    fields.setdefault("acceptance", Pair(Acceptance(None, None, {}, 0), Acceptance(None, None, {}, 0)))

    return DiffReport(paths=traces.map(lambda t: t.path), labels=labels, traces=traces, **fields)


class _LazyDecode:
    """``ids -> str`` with the target tokenizer, loaded on first use (only an error message needs it)."""

    def __init__(self, traces: Pair):
        self.traces, self.fn, self.loaded = traces, None, False

    def __call__(self, ids):
        if not self.loaded:

            self.fn, self.loaded = decoder(load_tokenizer(self.traces)), True
        return self.fn(ids) if self.fn else None
