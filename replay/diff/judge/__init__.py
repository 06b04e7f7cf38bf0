"""Judging a tensor's rows (pipeline stage 6, per tensor): which failing rows count against it, and
which a legitimate difference explains. In order, for each tensor ``compare/compare.py`` compares:

1. rows that count: a row whose inputs already differ upstream is inherited (``inherited``), and a
   row past the common token run of its sequence is not counted (``inherited.beyond_common_run``);
2. the legitimate cause: the first judge of ``JUDGES`` that applies to the tensor is bound to it
   (``bind``) and asked, once its rows are compared, whether it names every counted failing row
   (a ``types.Cause``) or none (why not goes to the tensor's stats); ``context_proof`` re-runs the
   draft when the context judge needs a proof;
3. the fail fraction of the rest against the tolerance (compare/compare.py ``compare_tensor``);
4. a tensor under its fail fraction whose failures concentrate in one structural group of its rows
   diverges there (``groups``);
5. a float tensor whose rows sit, on the median, well above the pair's measured noise floor diverges
   as a shift, every row inside the tolerance or not (``shift``).

A judge is an object with ``applies(name, scene) -> bool``, ``watch_frac(tolerance) -> float`` (the
fail fraction the early watch proves a divergence above: the largest the judge may explain) and
``bind(name, scene) -> judge(comp, candidates) -> Cause | None``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.judge import context, shift
from specdiff.replay.diff.judge.context import ContextJudge
from specdiff.replay.diff.judge.inherited import Inheritance
from specdiff.replay.diff.judge.prefix_carry import CachedPrefixes
from specdiff.replay.diff.judge.routing import RoutingJudge, TargetFamily
from specdiff.replay.diff.judge.topk_ties import TiesJudge
from specdiff.replay.diff.measure.tolerance import compute_dtype, looser_dtype
from specdiff.replay.diff.types import Pair, TensorComparison
from specdiff.tracer.schema import spec_for

#: The judges, in order: the first that applies to a tensor judges it.
JUDGES = (
    # Before the context judge, which applies too: draft.topk and draft.logits_topk.ids are draft stages
    # after the attention, so they consume the context. For them the ties judge replaces the context
    # judge: their rows are id sets picked from the draft's logits, and a row is excused only where
    # every swapped id is a near tie at rank k, whatever moved the logits (the context included),
    # not for where it lies. The rows the context moved still do not set their margin
    # (``Judging.context_rows`` is read from the context whichever judge is bound).
    TiesJudge(),
    RoutingJudge(),  # aux slots j >= 1 of an MoE target: never a draft stage, so never with the two others
    ContextJudge(),
)


@dataclass
class Scene:
    """What the judges read for one tensor: the diff so far.

    Attributes:
        traces: both sides; family: the target family (routing.target_family).
        upstream: the source rows of the tensors compared so far (inherited.Inheritance).
        comparisons: the tensors compared so far, by name.
        counted: bool [n], this tensor's rows that count (step 1 of the module doc).
        prove_context: the draft re-run the context judge may ask for (context_proof.ContextProver), or None.
        prefixes: serving's radix-cached prefixes and tokens (prefix_carry.CachedPrefixes), or None.
    """

    traces: Pair
    family: TargetFamily
    upstream: Inheritance
    comparisons: dict[str, TensorComparison]
    counted: np.ndarray
    prove_context: Callable | None = None
    prefixes: CachedPrefixes | None = None

    @functools.cached_property
    def first_sources(self) -> dict[int, int]:
        """pair -> first position of a context source upstream (context.first_sources)."""
        return context.first_sources(self.upstream)


@dataclass(frozen=True)
class Judging:
    """What the judges settle about one tensor before its rows are compared (``compare_tensor``).

    Attributes:
        counted: bool [n], the rows that count (None: all); inheritance: ``Inheritance.inherited``'s
            (mask, source index, names), kept for the report.
        judge: ``judge(comp, candidates)``, the bound judge of ``JUDGES`` (None: none applies).
        watch_frac: the fail fraction the early watch proves a divergence above (None: the tolerance's).
        context_rows: bool [n], counted rows after an earlier differing cached row of their sequence
            (context.attributed_rows): they do not set ``limit_use`` (None: every counted row does).
        row_groups: the structural groups of the rows (groups.row_groups; None: not group-judged).
        noise_floor: the pair's noise floor of the tensor, ``shift.pair_floor``'s (floor, how measured);
            None: no side measured one (no shift judgement).
    """

    counted: np.ndarray | None = None
    inheritance: tuple | None = None
    judge: Callable | None = None
    watch_frac: float | None = None
    context_rows: np.ndarray | None = None
    row_groups: list | None = None
    noise_floor: tuple | None = None


def judging_for(name: str, scene: Scene, tolerance, match, *, inheritance: tuple, row_groups: list | None) -> Judging:
    """The ``Judging`` of tensor ``name`` (its aligned rows ``match``): the first of ``JUDGES`` that
    applies, bound to the scene, and the rows the context moved."""
    chosen = next((j for j in JUDGES if j.applies(name, scene)), None)
    moved = (context.attributed_rows(name, match, scene.first_sources, scene.counted)
             if context.consumes_context(name) else None)
    return Judging(scene.counted, inheritance, None if chosen is None else chosen.bind(name, scene),
                   None if chosen is None else chosen.watch_frac(tolerance), moved, row_groups,
                   stage_floor(name, scene.traces))


def stage_floor(name: str, traces: Pair) -> tuple | None:
    """The pair's noise floor of float tensor ``name`` (shift.pair_floor at the looser of the sides' compute
    dtypes: a float32 logsumexp computed from bf16 logits carries bf16 rounding, measure/tolerance.py)."""
    if spec_for(name).kind != "float":
        return None
    return shift.pair_floor(traces, name, looser_dtype(compute_dtype(traces.x, name), compute_dtype(traces.y, name)))


__all__ = ["JUDGES", "Scene", "Judging", "judging_for", "stage_floor"]
