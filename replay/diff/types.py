"""The diff's types and the naming of its two sides, at the bottom of replay/diff (imports no stage).

- the pairing: ``Pair`` (one value per side), ``SeqPair`` / ``TokenFormat`` / ``Alignment`` (which
  sequences pair, replay/diff/align/align.py builds them) and ``RowMatch`` (which rows of a tensor pair);
- the comparison: ``TensorComparison`` and its row statuses (``MATCH`` .. ``UNREADABLE``,
  replay/diff/compare/compare.py fills it);
- the causes: ``Cause``, the one shape every named cause has (a cause id, the tensor it appears at,
  a sentence); ``Explanation`` (a known mistake, replay/diff/explain/) and the legitimate differences
  the judges name (replay/diff/judge/) conform to it, and replay/diff/causes.py lists every id;
- the sides: ``serve_side`` (which side is serving), ``side_labels`` ('training' / 'serving') and
  ``side_names`` (by engine when two engines served), computed here once for every stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from specdiff.eagle3.engines import EngineSpec, UnknownEngineError, engine_spec
from specdiff.tracer.contract import known

T = TypeVar("T")


@dataclass(frozen=True)
class Pair(Generic[T]):
    """Something that exists once per side: ``x`` (side A, e.g. training), ``y`` (side B, serving)."""

    x: T
    y: T

    def map(self, fn) -> Pair:
        return Pair(fn(self.x), fn(self.y))


@dataclass(frozen=True)
class TokenFormat:
    """How two content-paired sequences differ (token ids only; the report decodes them).

    Attributes:
        first_diff: token index where the two sequences first differ (their common prefix length).
        head: per side, the tokens before the common run (e.g. a BOS, a role marker).
        tail: per side, up to ``align.align.TAIL`` tokens right after the common run (e.g. a template suffix).
        run: length of the common run.
    """

    first_diff: int
    head: Pair[tuple[int, ...]]
    tail: Pair[tuple[int, ...]]
    run: int


@dataclass(frozen=True)
class SeqPair:
    """Two aligned sequences: ids on each side and the common token length.

    ``start`` is the token index where the common part begins on each side (0 for sequences
    that pair exactly or by prefix); aligned position p is position ``start + p`` of each side.
    ``format`` is set when the sequences paired only by content.
    """

    index: int  # position in Alignment.seq_pairs, the "seq" the report shows
    seq: Pair[int]
    length: int
    prompt_len: int
    start: Pair[int] = Pair(0, 0)
    format: TokenFormat | None = None


@dataclass(frozen=True)
class Alignment:
    """Which sequences pair up, and which did not (a plan: printable, no tensors)."""

    seq_pairs: tuple[SeqPair, ...]
    unmatched: Pair[tuple[int, ...]]

    def summary(self) -> str:
        by_content = sum(p.format is not None for p in self.seq_pairs)
        how = f" ({by_content} paired by content: their token formats differ)" if by_content else ""
        return (f"{len(self.seq_pairs)} aligned sequences{how}; unmatched: {len(self.unmatched.x)} on A, "
                f"{len(self.unmatched.y)} on B")

    @property
    def token_formats(self) -> list[SeqPair]:
        """Pairs whose token formats differ (paired by content), in pair order."""
        return [p for p in self.seq_pairs if p.format is not None]


@dataclass(frozen=True)
class RowMatch:
    """Row pairing of one tensor: ``rows.x[i]`` on A pairs with ``rows.y[i]`` on B.

    ``pair``/``pos``/``depth`` [n] int give the aligned key of each pair (``pair`` indexes
    Alignment.seq_pairs). ``only`` counts rows present on one side only (within common length).
    """

    rows: Pair[np.ndarray]
    pair: np.ndarray
    pos: np.ndarray
    depth: np.ndarray
    only: Pair[int]

    @property
    def coverage(self) -> float:
        """Fraction of the rows either side holds that found a partner."""
        n = len(self.pair)
        total = n + max(self.only.x, self.only.y)
        return n / total if total else 1.0


MATCH, CLOSE, DIVERGED = 0, 1, 2
#: a row in a damaged chunk on either side (tracer.store.damage): not compared, never counted as a match
UNREADABLE = 4


@dataclass(frozen=True)
class Tolerance:
    """When a row, and then a tensor, counts as diverged.

    Attributes:
        rel: a float row fails when its relative error ||x-y||/max(||x||,||y||) exceeds this...
        cos: ...or its cosine similarity is below this.
        ids: an id row fails when its top-k overlap is below this (1.0 = identical set).
        max_fail_frac: a tensor diverges when more than this fraction of its aligned rows fail
            (non-finite rows always count as failing, and any one of them makes it diverge).
    """

    rel: float
    cos: float
    ids: float = 1.0
    max_fail_frac: float = 0.02


@dataclass
class TensorComparison:
    """One tensor compared over its aligned rows.

    Attributes:
        name: canonical tensor name.
        tolerance: the tolerance used.
        match: which rows paired (``pair``/``pos``/``depth`` [n]).
        status: int8 [n] per row: MATCH (bit-identical), CLOSE (within tolerance), DIVERGED, or
            UNREADABLE (the row lies in a damaged chunk on either side; excluded from every stat).
        score: float32 [n] per row: relative error (float) or 1 - overlap (ids).
        cos: float32 [n] per-row cosine (float tensors; 1 for ids).
        nonfinite: bool [n] rows holding NaN/Inf on either side.
        stats: summary numbers (max_abs, max_rel, mean_rel, min_cos, match_rate, argmax_agree,
            topk_overlap, kl_mean, nonfinite_rows, rows, fail_rows, coverage, unreadable_rows);
            fractions are over the readable rows.
        worst: the worst row: its index, pair, pos, depth, element index and both values.
        diverged: fail fraction above tolerance, or any non-finite row; always True for a
            ``structure`` finding.
        kind: ``values`` (rows compared), ``structure`` (the layouts differ: no row compared,
            ``structure`` holds the replay.diff.align.structure.StructureMismatch) or ``tokens`` (the token
            sequences pair only by content: ``alignment.token_formats`` say how they differ).
        structure: the StructureMismatch of a ``structure`` finding, else None.
        counted: bool [n], the rows that judge the tensor: their inputs agree (replay/diff/
            inherited.py); None = every row. ``diverged``, ``divergence_depth`` and
            ``first_failing_row`` are decided on the counted failing rows (``own_fail``).
        inherited: bool [n], rows whose inputs already differ upstream; ``inherited_src`` int
            [n] indexes ``inherited_names`` (the tensor each came from), -1 elsewhere.
        explained: bool [n], counted failing rows a named legitimate cause explains
            (``explanation``, a ``Cause`` a judge named, e.g. judge/routing.py ``RoutingFlips``); None = none.
        concentration: the structural group its counted failing rows concentrate in most
            (replay/diff/judge/groups.py ``Concentration``; ``fired``: the tensor diverges because of it,
            though under its fail fraction over all rows), or None.
        carried: bool [n], counted rows after an earlier differing cached row that a draft re-run
            showed are what the draft computes from each side's inputs (replay/diff/judge/context_proof.py),
            passing or not: later stages inherit them (inherited.source_rows); None = none.
        shift: how far the rows sit above the pair's noise floor (replay/diff/judge/shift.py ``Shift``;
            ``fired``: the tensor diverges because of it, every row inside the tolerance or not), or
            None (no side measured a floor); shift_rows: bool [n], the usable rows above the shift
            judge's bound, the rows a shift divergence points at.
    """

    name: str
    tolerance: Tolerance
    match: RowMatch
    status: np.ndarray
    score: np.ndarray
    cos: np.ndarray
    nonfinite: np.ndarray
    stats: dict = field(default_factory=dict)
    worst: dict | None = None
    diverged: bool = False
    kind: str = "values"
    structure: object = None
    counted: np.ndarray | None = None
    inherited: np.ndarray | None = None
    inherited_src: np.ndarray | None = None
    inherited_names: list = field(default_factory=list)
    explained: np.ndarray | None = None
    explanation: Cause | None = None
    concentration: object = None
    carried: np.ndarray | None = None
    shift: object = None
    shift_rows: np.ndarray | None = None

    @property
    def own_fail(self) -> np.ndarray:
        """bool [n]: failing rows that count against this tensor: counted (inputs agree) and not
        explained; a non-finite row always counts."""
        fail = self.status == DIVERGED
        if self.counted is not None:
            fail = fail & (self.counted | self.nonfinite)
        if self.explained is not None:
            fail = fail & ~self.explained
        return fail

    @property
    def judged_fail(self) -> np.ndarray:
        """bool [n]: the failing rows the verdict rests on: ``own_fail``, or only the fired group's
        failing rows when the tensor diverges because of a concentration (groups.py), not over all rows."""
        own = self.own_fail
        if self.shift_only:
            return self.shift_rows
        group = self._group_only(own)
        return own if group is None else own & group

    @property
    def shift_only(self) -> bool:
        """The tensor diverges only because of its shift above the noise floor, not over its fail
        fraction, a non-finite row or a structural group: judge/shift.py ``judge_shift`` sets
        ``shift_rows`` only on a tensor that had not diverged otherwise."""
        return self.shift_rows is not None

    def _group_only(self, own: np.ndarray) -> np.ndarray | None:
        """The fired group's failing rows when the tensor diverges only because of them, else None."""
        c = self.concentration
        if c is None or not c.fired or self._diverged_overall(own):
            return None
        return c.mask

    def _diverged_overall(self, own: np.ndarray) -> bool:
        counted = self.counted if self.counted is not None else np.ones(len(own), bool)
        n = int((counted & (self.status != UNREADABLE)).sum())
        return bool(self.nonfinite.any()) or (n > 0 and own.sum() / n > self.tolerance.max_fail_frac)

    @property
    def first_where(self) -> dict | None:
        """Where the divergence first shows: ``{"pair", "pos", "depth"}`` (aligned keys), or None
        (a ``structure`` finding has no row). A ``tokens`` finding points at the first pair whose
        token formats differ, at the first differing token."""
        if self.kind == "structure":
            return None
        if self.kind == "tokens" and self.worst is not None:
            return {k: self.worst[k] for k in ("pair", "pos", "depth")}
        i = self.first_failing_row
        if i is None:
            return None
        return {"pair": int(self.match.pair[i]), "pos": int(self.match.pos[i]), "depth": int(self.match.depth[i])}

    @property
    def divergence_depth(self) -> int | None:
        """The shallowest draft depth whose rows diverge by the tensor's rule (fail fraction above
        ``max_fail_frac`` or a non-finite row); 0 for tensors without depths; None if not diverged.

        Depth k of the draft runs after every stage of depth k-1 (its hidden_in is depth k-1's
        hidden_out), so this orders the first divergence (``first_divergence``).
        """
        if not self.diverged:
            return None
        depth = self.match.depth
        fail = self.own_fail
        if self.shift_only:
            return int(depth[self.shift_rows].min()) if self.shift_rows.any() else 0
        group = self._group_only(fail)
        if group is not None:  # diverged only in a structural group: where that group's rows fail
            return int(depth[fail & group].min())
        counted = self.counted if self.counted is not None else np.ones(len(depth), bool)
        for d in np.unique(depth):
            sel = depth == d
            n = int(counted[sel].sum())
            if self.nonfinite[sel].any() or (n and fail[sel].sum() / n > self.tolerance.max_fail_frac):
                return int(d)
        return int(depth[fail].min()) if fail.any() else 0

    @property
    def first_failing_row(self) -> int | None:
        """Index (into the aligned rows) of the failing row at the earliest position, then pair,
        among the rows at ``divergence_depth`` when that depth has failing rows."""
        bad = np.nonzero(self.judged_fail if self.diverged else self.own_fail)[0]
        if not len(bad):
            return None
        d = self.divergence_depth
        at_depth = bad[self.match.depth[bad] == d] if d is not None else bad
        bad = at_depth if len(at_depth) else bad
        order = np.lexsort((self.match.depth[bad], self.match.pair[bad], self.match.pos[bad]))
        return int(bad[order[0]])


@runtime_checkable
class Cause(Protocol):
    """What every named cause says, whoever names it: an ``Explanation`` (explain/), a legitimate
    difference a judge names (judge/: ``RoutingFlips``, ``ContextRows``, ``TopkBoundaryTies``) and a
    structural group a divergence concentrates in (judge/groups.py ``Concentration``).

    Attributes:
        cause: the cause id, a row of replay/diff/causes.py ``CAUSES`` (``cause_row``).
        tensor: the tensor it appears at (None: not known).
        message: one plain-words sentence for the header / report.
    """

    @property
    def cause(self) -> str: ...

    @property
    def tensor(self) -> str | None: ...

    @property
    def message(self) -> str: ...


@dataclass(frozen=True)
class Explanation:
    """A known mistake whose transform closes the gap, with its evidence.

    Attributes:
        cause: short id, e.g. ``"aux_layer_shift"``, ``"d2t_direct_ids"``.
        message: one plain-words sentence for the header / report.
        evidence: lines of numbers that show the transform closing the gap.
        fix: what to change.
        matrix: for aux checks, ``{"rows": [...], "cols": [...], "rel": [[...]]}`` (rel error).
        tensor: where the cause appears when that is not the first divergence itself (non-finite
            values: the tensor they first appear at), else None. Not in the report's JSON
            (``DiffReport.to_json`` keeps the explanation keys it has always written).
        named_only: a recorded fact that differs, named where no transform closed the gap
            (explain/differences.py): it says what differs, not that it is the cause, so the narrowing
            still runs. Not in the JSON either.
    """

    cause: str
    message: str
    evidence: tuple[str, ...] = ()
    fix: str = ""
    matrix: dict | None = field(default=None, compare=False)
    tensor: str | None = None
    named_only: bool = field(default=False, compare=False)


def row_lines(rows: list[dict], line, limit: int = 8) -> list[str]:
    """The evidence lines of a legitimate difference's named rows: ``line(row)`` for the first
    ``limit`` rows (dicts with at least ``seq`` and ``pos``), then how many more."""
    return [line(r) for r in rows[:limit]] + ([f"... {len(rows) - limit} more"] if len(rows) > limit else [])


def serve_side(traces: Pair) -> str:
    """``"x"`` or ``"y"``: the serving side (the one whose row keys hold decode iterations, radix-cache
    hits and prefill chunks). Side B unless only side A is a serving trace."""
    return "x" if traces.x.side == "serve" and traces.y.side != "serve" else "y"


def side_labels(traces: Pair) -> Pair[str]:
    """'training' / 'serving' from each trace's side; 'A' / 'B' when both are the same side."""
    sides = traces.map(lambda t: t.side)
    if sides.x == sides.y:
        return Pair("A", "B")
    return sides.map(lambda s: "training" if s == "train" else "serving")


def trace_engine(trace) -> EngineSpec | None:
    """The registered serving engine that recorded ``trace`` (its ``engine`` contract fact), or
    None for a training side, an older trace without the fact, or an engine specdiff does not know."""
    name = known(trace.contract, "engine")
    try:
        return engine_spec(str(name)) if name else None
    except UnknownEngineError:
        return None


def _engine_label(trace) -> str | None:
    spec = trace_engine(trace)
    if spec is None:
        return None
    version = known(trace.contract, "engine_version")
    return f"{spec.title} {version}" if version else spec.title


def side_names(traces: Pair) -> Pair[str]:
    """How explanations and the report name the two sides: 'training' / 'serving'; for two serving
    traces of different engines or engine versions, each by its engine ('SGLang 0.5.23' / 'vLLM
    0.32.0'); else 'A' / 'B' (``side_labels``)."""
    if traces.x.side == traces.y.side == "serve":
        names = traces.map(_engine_label)
        if names.x and names.y and names.x != names.y:
            return names
    return side_labels(traces)


@dataclass(frozen=True)
class ContractMismatch:
    """One contract field that differs: its values on each side, a plain-words message, the
    stages it bears on (tracer/schema.py STAGE_ORDER names, "*" = all) and what to change."""

    field: str
    severity: str
    x: object
    y: object
    message: str
    stages: tuple[str, ...] = ()
    fix: str = ""

    def bears_on(self, stage: str) -> bool:
        """True when this difference can explain a divergence at ``stage``."""
        return "*" in self.stages or stage in self.stages


def bearing_on(mismatches: list[ContractMismatch], stage: str) -> list[ContractMismatch]:
    """The mismatches that bear on a first divergence at ``stage`` (unknown facts included)."""
    return [m for m in mismatches if m.bears_on(stage)]


@dataclass(frozen=True)
class DiffInputs:
    """What the stages after alignment read of a diff, built once by the pipeline (replay/diff/pipeline.py)
    and handed down: the context prover (judge/context_proof.py), the draft runner (runner.py), re-execution
    and the narrowing (rerun/), the explanations (explain/). Nothing in it is an output of those stages.

    Attributes:
        traces: the opened traces (``Pair`` of tracer.store traces).
        labels: how the sides are named (``side_names``).
        alignment: the sequence pairs (align/align.py).
        contract: the contract mismatches, most severe first (contract/check.py ``check_contracts``,
            run once per diff).
    """

    traces: Pair
    labels: Pair
    alignment: Alignment
    contract: list[ContractMismatch]

    @property
    def paths(self) -> Pair[str]:
        """Each trace's path (or fsspec URL)."""
        return self.traces.map(lambda t: t.path)
