"""Re-execution decides the verdict: a draft stage is the first divergence only
where the draft, re-run on serving's own inputs, does not reproduce serving there.

Row comparison says *where* the two sides' values differ; it cannot say *why*. A correct MoE pair
(measured: random tiny DeepSeek-V3 and Qwen3-MoE targets, 2.4-2.7 % of ``draft.hidden_out`` rows failing
against 2 %) differs at the draft because the target's routing near-ties moved earlier positions'
aux rows, which reach later rows through the draft's attention: the narrowing then printed "every
serving input REPRODUCES serving" under a verdict that blamed the draft. Here the proof decides:

for the first divergence, when it is a draft stage the re-run computes (rerun/narrow.py ``STAGES``),
the training draft is re-run (``narrow``) on serving's upstream inputs, ``target.aux_cat`` and
``tokens``, with the draft's *own* configuration (training's vocab map and norm flags: serving's
would be a difference of the draft, not of its inputs; ``Narrowing.upstream``), teacher-forced over
each sequence from position 0, so the KV history of earlier positions is rebuilt from serving's
inputs too. Float stages are judged at their measured noise, not their tolerance (rerun/noise.py): a
re-run that shows a shift inside the tolerance has not computed what serving did. Then:

- it reproduces what serving recorded on the failing rows, from that stage on: the draft computed
  what serving did on what serving fed it. The stage is not the first divergence; its difference is
  inherited from those inputs (the single substitutions that reproduce it are named, else both
  together), and so are the draft stages computed from it (``inherited.feeds``). The verdict moves
  on to the next diverging tensor, which is judged the same way; "no divergence" when none is left;
- it does not, and the narrowing names where the difference lies (a serving input, or the contract
  fields that differ): the stage stays the first divergence, now proven (``not_reproduced``);
- it cannot run or cannot decide (no draft checkpoint, no aux rows, a stage the re-run does not
  compute; the re-run on training's own inputs already gives serving's values: not the draft
  training recorded; nothing reproduces serving while the recorded contracts agree: the difference
  lies in state the re-run does not take from the trace, which proves nothing; or the inputs taken
  from serving are training's own, so a match comes only from the ids' tie allowance): the stage
  stays the first divergence by today's row judgement, marked ``not_run`` with the reason.

A first divergence at a target stage or ``tokens`` is not re-executed (the trace holds no target
forward to re-run) and carries no step: its report is what it always was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdiff.replay.diff.compare.compare import first_divergence
from specdiff.replay.diff.judge.inherited import feeds
from specdiff.replay.diff.rerun.narrow import Narrowing, narrow_or_reason
from specdiff.replay.diff.types import DiffInputs

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not_reproduced", "not_run"
#: the inputs ``Narrowing.upstream`` takes from serving, by the narrowing's variant of each alone
_INPUT_VARIANTS = {"serving's target.aux_cat": "target.aux_cat", "serving's tokens": "tokens"}


@dataclass(frozen=True)
class ReexecStep:
    """One candidate stage, re-executed (JSON-safe).

    Attributes:
        stage: the candidate first divergence.
        outcome: ``reproduced`` (not a divergence: inherited from ``inputs``), ``not_reproduced``
            (the first divergence, proven) or ``not_run`` (judged by its rows as before; ``reason``).
        reason: one line: what the re-run showed, or why it could not run.
        inputs: serving's inputs the difference is inherited from (``reproduced`` only).
        stages: the stages moved past with it (``reproduced`` only): itself and those it feeds.
        rows, depth: the failing rows re-run and their draft depth.
    """

    stage: str
    outcome: str
    reason: str
    inputs: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    rows: int = 0
    depth: int = 0


@dataclass
class Reexecution:
    """How re-execution decided the verdict: ``steps`` in the order the candidates came;
    ``narrowing``: the last candidate's narrowing (or why it could not run), for the report's
    narrowing section when that candidate stays the first divergence."""

    steps: list[ReexecStep] = field(default_factory=list)
    narrowing: Narrowing | str | None = None

    @property
    def inherited(self) -> list[ReexecStep]:
        """The steps whose stage re-execution moved past."""
        return [s for s in self.steps if s.outcome == REPRODUCED]

    def words(self) -> str:
        """The verdict's clause on the stages moved past ("" when none)."""
        return "".join(f"; {s.stage} is not a divergence: the draft re-run on serving's inputs reproduces "
                       f"serving ({s.rows} failing rows), its difference is inherited from serving's "
                       f"{' and '.join(s.inputs)}" for s in self.inherited)


def decide(inputs: DiffInputs, comparisons: dict, *, draft_path: str | None = None,
           target_path: str | None = None) -> tuple[object, Reexecution]:
    """(first divergence, ``Reexecution``) of ``comparisons`` (name -> TensorComparison) by the
    module doc's rule; the stages moved past are marked so in ``comparisons`` (``diverged`` False,
    ``stats["reproduced_by_reexecution"]``: their rows failed, re-execution showed why). ``inputs``: the
    diff's (types.DiffInputs), which ``narrow`` reads with ``comparisons`` and each candidate. Never raises
    SpecdiffError: a re-run that cannot run is a ``not_run`` step."""
    out = Reexecution()
    moved: set[str] = set()
    first = first_divergence(comparisons)
    while first is not None and first.kind == "values" and first.name.startswith("draft."):
        n = narrow_or_reason(inputs, comparisons, first, draft_path=draft_path, target_path=target_path)
        out.narrowing = n
        step = _step(first.name, n, comparisons)
        out.steps.append(step)
        if step.outcome != REPRODUCED:
            break
        moved |= set(step.stages)
        first = first_divergence({k: c for k, c in comparisons.items() if k not in moved})
        out.narrowing = None
    for name in moved:  # not divergences: every reader (table, JSON, app, watch) sees them so
        comparisons[name].diverged = False
        comparisons[name].stats["reproduced_by_reexecution"] = True
    return first, out


def _step(stage: str, n: Narrowing | str, comparisons: dict) -> ReexecStep:
    """The step of candidate ``stage`` from its narrowing ``n`` (or why it could not run)."""
    if isinstance(n, str):
        return ReexecStep(stage, NOT_RUN, n)
    up = n.upstream
    where = dict(rows=n.rows, depth=n.depth)
    rows = f"{n.rows} failing rows of {n.from_stage} at depth {n.depth}"
    if n.variants and n.variants[0].reproduces:  # the re-run is not the draft training recorded
        return ReexecStep(stage, NOT_RUN, n.conclusion, **where)
    taken = [v.name for v in n.variants if v.name in _INPUT_VARIANTS]
    if up is not None and up.reproduces and taken and all(v in n.unchanged for v in taken):
        # serving's aux rows and tokens are training's own: the run on them is training's run, which
        # reproduces serving only through the ids' tie allowance the training-inputs run is not given
        same = ", ".join(_INPUT_VARIANTS[v] for v in taken)
        return ReexecStep(stage, NOT_RUN, f"cannot decide: the inputs the re-run takes from serving ({same}) are "
                          f"training's own, so the re-run on them is training's run; it matches serving on the {rows} "
                          "only up to near ties of the ids, and no input shows where the difference enters", **where)
    if up is None or not up.reproduces:
        if not n.decided:  # nothing reproduces serving and nothing recorded differs: no proof either way
            return ReexecStep(stage, NOT_RUN, n.conclusion, **where)
        return ReexecStep(stage, NOT_REPRODUCED, f"the draft re-run on serving's inputs does not reproduce serving "
                          f"on {rows}{_at(n, up)}", **where)
    single = tuple(_INPUT_VARIANTS[v.name] for v in n.variants
                   if v.name in _INPUT_VARIANTS and v.reproduces and v.name not in n.unchanged)
    inputs = single or tuple(_INPUT_VARIANTS.values())
    stages = tuple(s for s in comparisons if s == stage or s in n.stages[n.stages.index(n.from_stage):]
                   or feeds(stage, s))
    return ReexecStep(stage, REPRODUCED, f"the draft re-run on serving's {' and '.join(inputs)} reproduces serving "
                      f"on {rows}{_at(n, up)}", inputs, stages, **where)


def _at(n: Narrowing, up) -> str:
    """The clause on how ``n.from_stage`` was judged for the run ``up`` (float stages: rerun/noise.py), or ""."""
    words = n.limits.get(n.from_stage)
    if not words or up is None or n.from_stage not in up.scores:
        return ""
    ratio = up.noise.get(n.from_stage)
    got = f"mean rel {up.scores[n.from_stage]:.3g}" + (f", {ratio:.2g}x the rows' noise floors" if ratio is not None
                                                     else "")
    return f" ({got}; judged at {words})"


__all__ = ["ReexecStep", "Reexecution", "decide", "REPRODUCED", "NOT_REPRODUCED", "NOT_RUN"]
