"""Narrow a divergence no explanation fits: which serving input, grafted into the training draft,
reproduces what serving's draft computed on the rows that fail?

The draft as trained (the training contract's ``draft_name``, as in replay.graft) is re-run,
teacher-forced through the first divergence's depth, on the aligned sequences that hold its
failing rows (``TensorComparison.judged_fail``; the first failing one first), once on every
training input and once per serving input substituted: ``target.aux_cat`` (the target's hidden
states), ``tokens`` (the draft's input tokens), ``draft.d2t`` (the vocab map) and the norm flags
(when the contracts differ). Each run's draft stages are compared with the rows serving recorded
**at the failing rows' positions and depth** (never a sample that misses them: a depth-1 bug
re-run at depth 0 finds nothing to reproduce), every stage at its measured noise, not its
tolerance (rerun/limits.py). A substitution that makes the training draft
compute what serving computed there is where the difference enters.

The verdict never contradicts the first divergence: when the training inputs alone already give
serving's values on the failing rows, or nothing reproduces serving while the contracts agree
(the difference lies in state the re-run does not take from the trace: the draft's KV history),
or the first divergence is not a draft stage the re-run computes, it says it cannot decide and
why. Only when the contracts differ does "inside the draft's own computation" name them.

``narrow`` is two steps: ``plan_narrowing`` decides everything before a re-run (the sequences, the
stages, each run's inputs: a ``NarrowPlan``, printable with ``describe()``), ``run_plan`` re-runs and
concludes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdiff.replay.diff.align.align import match_rows, pack_keys
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.rerun import id_ties
from specdiff.replay.diff.rerun.limits import run_limits
from specdiff.replay.diff.runner import (
    RerunError,
    batch_inputs,
    computed_rows,
    prepare,
    sides,
    with_norm_flags,
)
from specdiff.replay.diff.types import DiffInputs
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.schema import layer_out_index, spec_for

#: draft stages a depth-0 re-run computes, in dataflow order (ids compared on the top-1 id)
STAGES = ("draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.attn_in", "draft.hidden_out",
          "draft.logits_topk.ids", "draft.topk", "draft.topk_target")
# (a multi-layer draft's draft.layer_out.{i} are computed too, before draft.hidden_out: ``recorded_stages``)
MAX_SEQS = 4
#: the name of ``Narrowing.upstream``'s re-run
UPSTREAM = "serving's upstream inputs"
BASE = "training inputs"
ID_AGREE = 0.95  # ids: near-tie flips in bf16 allowed in a few rows


def computed(name: str) -> bool:
    """Whether the re-run computes stage ``name``: ``STAGES`` and every ``draft.layer_out.{i}``."""
    return name in STAGES or layer_out_index(name) is not None


def recorded_stages(names) -> tuple[str, ...]:
    """``STAGES`` that serving recorded (``names``), a multi-layer draft's ``draft.layer_out.{i}`` among
    them in layer order just before ``draft.hidden_out`` (the re-run computes every layer's output)."""
    layers = sorted((i, n) for n in names if (i := layer_out_index(n)) is not None)
    at = STAGES.index("draft.hidden_out")
    full = (*STAGES[:at], *(n for _, n in layers), *STAGES[at:])
    return tuple(s for s in full if s in names)


class NarrowError(RerunError):
    """The narrowing cannot run (no draft checkpoint, no aux rows): one clear line."""


@dataclass(frozen=True)
class Variant:
    """One re-run of the training draft.

    Attributes:
        name: ``training inputs``, ``serving's target.aux_cat`` ..., ``every serving input``.
        scores: stage -> mean relative error (float stages) or top-1 disagreement (id stages)
            against the rows SERVING recorded.
        matches: stage -> reproduces serving's rows there: ids within the tie allowance, floats at the
            stage's noise (rerun/noise.py ``Limit``).
        reproduces: every compared stage from the first diverging one on matches serving.
        noise: float stage -> the mean of its rows' errors in units of each row's noise floor (where the
            pair's floor is measured; rerun/noise.py).
    """

    name: str
    scores: dict
    matches: dict
    reproduces: bool
    noise: dict = field(default_factory=dict)


@dataclass
class Narrowing:
    """The narrowing of one divergence (``DiffReport.narrowing``).

    Attributes:
        stages: the stages compared (recorded by serving, computed by the re-run).
        from_stage: the first diverging draft stage (reproduction is judged from it on).
        positions: positions re-run (of the sequences holding the failing rows).
        depth: the draft depth compared (the first divergence's).
        rows: failing rows of the first divergence the comparison is made on.
        decided: False when the conclusion says it cannot decide.
        variants: training inputs first, then one per substitution, then every serving input.
        conclusion: one line: the substitution that reproduces serving, or why none does.
        contract_fields: differing contract fields, the candidates when no input reproduces serving.
        upstream: the re-run on serving's upstream inputs only (``target.aux_cat`` and ``tokens``)
            with training's own vocab map and norm flags, the draft's own configuration: where it
            reproduces serving, the draft computed what serving did on what serving fed it
            (replay/diff/rerun/reexec.py decides the verdict on it). Not in ``variants``.
        unchanged: the substitutions whose inputs serving holds as training does (never named
            as where the difference enters).
        limits: float stage -> how its runs were judged (rerun/noise.py ``Limit.words``).
    """

    stages: tuple[str, ...]
    from_stage: str
    positions: int
    variants: list[Variant] = field(default_factory=list)
    depth: int = 0
    rows: int = 0
    decided: bool = True
    conclusion: str = ""
    contract_fields: list[str] = field(default_factory=list)
    upstream: Variant | None = None
    unchanged: list[str] = field(default_factory=list)
    limits: dict = field(default_factory=dict)


def failing_rows(first) -> tuple[int, set]:
    """(depth, {(pair, pos)}) of the first divergence's failing rows at its divergence depth: the
    rows the narrowing must re-run (all of them; none of another depth)."""
    d = first.divergence_depth or 0
    bad = first.judged_fail & (first.match.depth == d)
    return d, set(zip(first.match.pair[bad].tolist(), first.match.pos[bad].tolist(), strict=True))


#: the inputs a re-run takes from one side or the other, in the order of a run's sources
RUN_INPUTS = ("target.aux_cat", "tokens", "draft.d2t", "norm flags")
#: ``UPSTREAM``'s sources: serving's data, the draft's own configuration
UPSTREAM_SOURCES = ("serve", "serve", "train", "train")


@dataclass
class NarrowPlan:
    """What ``narrow`` re-runs and compares, decided before any re-run (``plan_narrowing``): the
    sequences, the stages, and each run's inputs. ``describe()`` (and ``str``) says it in lines;
    ``run_plan`` carries it out.

    Attributes:
        divergence: the first divergence's name.
        depth: the draft depth re-run through and compared (the first divergence's).
        rows: failing rows of the first divergence the comparison is made on (serving's rows of ``from_stage``).
        positions: positions re-run (of the sequences holding the failing rows).
        seqs: the training seq ids re-run, one batch row each (the first divergence's first).
        stages: the stages compared (recorded by serving at the failing rows, computed by the re-run).
        from_stage: the first diverging draft stage; ``judged``: it and every stage after it.
        runs: run name -> the side ("train" / "serve") of each of ``RUN_INPUTS``: training inputs first,
            one per substitution, every serving input last (``Narrowing.variants``).
        upstream: ``UPSTREAM``'s sources (``UPSTREAM_SOURCES``; ``Narrowing.upstream``).
        unchanged: the substitutions whose inputs serving holds as training does (never named).
        contract_fields: the differing contract fields, ``field (x vs y)``.
        model / batch / d2t / flags / recorded / ties / comparisons / traces: what the re-runs read: the
            draft as trained, the batch (``runner.Batch``), each side's vocab map and norm flags ("train" /
            "serve"), serving's rows per stage as (batch row int64 [n], position int64 [n], values
            float [n, ...]), the tie proof (``id_ties.TieProof``), name -> TensorComparison, the pair
            (types.Pair: its noise floors).
    """

    divergence: str
    depth: int
    rows: int
    positions: int
    seqs: list[int]
    stages: tuple[str, ...]
    from_stage: str
    judged: tuple[str, ...]
    runs: dict
    upstream: tuple
    unchanged: list[str]
    contract_fields: list[str]
    model: object = field(repr=False)
    batch: object = field(repr=False)
    d2t: dict = field(repr=False)
    flags: dict = field(repr=False)
    recorded: dict = field(repr=False)
    ties: object = field(repr=False)
    comparisons: dict = field(repr=False)
    traces: object = field(default=None, repr=False)

    def describe(self) -> str:
        """The plan, one line per step: what is re-run, what is compared, then each run's inputs."""
        lines = [f"narrow {self.divergence}: re-run the training draft through depth {self.depth} on "
                 f"{len(self.seqs)} sequence(s) (training seq {', '.join(map(str, self.seqs))}; "
                 f"{self.positions} positions)",
                 f"compare {', '.join(self.stages)} with serving's {self.rows} failing row(s) at depth {self.depth}; "
                 f"a run reproduces serving when every stage from {self.from_stage} on matches"]
        for i, (name, sources) in enumerate([*self.runs.items(), (UPSTREAM, self.upstream)], 1):
            inputs = ", ".join(f"{what} {side}" for what, side in zip(RUN_INPUTS, sources, strict=True))
            why = (" (serving holds these inputs as training does: never named)" if name in self.unchanged else
                   " (the re-execution's verdict, not a variant)" if name == UPSTREAM else "")
            lines.append(f"run {i}. {name}: {inputs}{why}")
        if self.contract_fields:
            lines.append("differing contract fields: " + ", ".join(self.contract_fields))
        return "\n".join(lines)

    __str__ = describe


def narrow(inputs: DiffInputs, comparisons: dict, first, *, draft_path: str | None = None,
           target_path: str | None = None) -> Narrowing:
    """Re-run the training draft on the first diverging sequences with each serving input grafted in:
    ``run_plan(plan_narrowing(...))``.

    ``inputs``: the diff's (types.DiffInputs); ``comparisons``: name -> TensorComparison; ``first``: the
    first divergence (a ``values`` TensorComparison).

    Raises:
        NarrowError: no draft checkpoint, no aux rows on both sides, nothing to compare.
        CheckpointError: the checkpoint cannot be loaded.
    """
    return run_plan(plan_narrowing(inputs, comparisons, first, draft_path=draft_path, target_path=target_path))


def plan_narrowing(inputs: DiffInputs, comparisons: dict, first, *, draft_path: str | None = None,
                   target_path: str | None = None) -> NarrowPlan:
    """The plan of ``narrow`` (arguments as there): loads the draft as trained, batches the sequences
    that hold the failing rows and reads serving's rows there; re-runs nothing.

    Raises:
        NarrowError / CheckpointError: as ``narrow``.
    """
    tr, sv = sides(inputs)
    strace = getattr(inputs.traces, sv)
    stages = recorded_stages(strace.names)
    if not stages:
        raise NarrowError(f"{strace.path}: serving recorded no draft stage to compare a re-run with")
    import torch

    if first is None or first.kind != "values":
        raise NarrowError("no value divergence to narrow")
    if not computed(first.name) and first.name.startswith("draft."):
        raise NarrowError(f"cannot decide by re-running the draft: the first divergence {first.name} is not a "
                          "draft stage the re-run computes")
    # an input's divergence (target.*, tokens) is re-run at its failing positions, judged from the
    # first draft stage that diverged
    depth, failing = failing_rows(first)
    if not failing:
        raise NarrowError(f"{first.name} has no failing row at depth {depth} to re-run")
    run = prepare(inputs, draft_path=draft_path, target_path=target_path, error=NarrowError)
    seqs = _sequences(inputs, run, first, failing, tr)
    batch = batch_inputs(inputs, run, seqs)
    tokens_differ = not torch.equal(batch.ids["train"], batch.ids["serve"])
    runs = _runs(tokens_differ, run.flags)
    serving_rows = _serving_rows(inputs, batch, sv, failing, depth)
    recorded = {name: r for name in stages if (r := serving_rows(name)) is not None}
    stages = tuple(s for s in stages if s in recorded)
    ties = id_ties.TieProof.load(inputs.traces, comparisons, serving_rows(id_ties.TOPK_IDS),
                                 serving_rows(id_ties.TOPK_VALUES), strace)
    from_stage = _from_stage(first, stages, comparisons, depth)
    return NarrowPlan(first.name, depth, len(recorded[from_stage][0]), int(batch.lengths.sum()),
                      [s.seq_train for s in seqs], stages, from_stage, stages[stages.index(from_stage):], runs,
                      UPSTREAM_SOURCES, _unchanged(runs, batch.aux, run.d2t, run.flags, tokens_differ),
                      [f"{m.field} ({m.x} vs {m.y})" for m in inputs.contract], model=run.model, batch=batch,
                      d2t=run.d2t, flags=run.flags, recorded=recorded, ties=ties, comparisons=comparisons,
                      traces=inputs.traces)


def _sequences(inputs: DiffInputs, run, first, failing: set, tr: str) -> list:
    """The sequences of ``run.plan`` (``runner.ReplaySeq``) to re-run: every one that holds a failing
    row the re-run reaches (its leading positions with aux rows), the first divergence's first, at
    most ``MAX_SEQS``.

    Raises:
        NarrowError: no failing row lies where the re-run reaches.
    """
    first_pair = (first.first_where or {}).get("pair", 0)
    pair_idx = {getattr(p.seq, tr): p.index for p in inputs.alignment.seq_pairs}
    bad_pairs = {p for p, _ in failing}
    # every sequence that holds a failing row the re-run reaches (its leading positions with aux rows)
    holding = [s for s in run.plan if any(pair_idx[s.seq_train] == p and t < s.n for p, t in failing)]
    if not holding:
        raise NarrowError(f"no failing row of {first.name} lies in the leading positions with aux rows on both "
                          f"sides of its sequence (pairs {sorted(bad_pairs)[:4]}): nothing to re-run there")
    return sorted(holding, key=lambda s: (s.seq_train != _seq_of(inputs, first_pair, tr)))[:MAX_SEQS]


def _runs(tokens_differ: bool, flags: dict) -> dict:
    """Run name -> the side of each of ``RUN_INPUTS``: training's own, one substitution per serving input
    that can differ (tokens only when they do, norm flags only when the contracts differ), all of them."""
    variants = {BASE: ("train", "train", "train", "train"),
                "serving's target.aux_cat": ("serve", "train", "train", "train"),
                "serving's tokens": ("train", "serve", "train", "train"),
                "serving's draft.d2t": ("train", "train", "serve", "train")}
    if not tokens_differ:
        variants.pop("serving's tokens")
    if flags["train"] != flags["serve"]:
        variants["serving's norm flags"] = ("train", "train", "train", "serve")
    variants["every serving input"] = ("serve", "serve", "serve", "serve")
    return variants


def _serving_rows(inputs: DiffInputs, batch, sv: str, failing: set, depth: int):
    """A function of a stage name: serving's recorded rows of it at the failing rows, as (batch row
    int64 [n], position int64 [n], values float [n, ...]), or None when the re-run computes none of
    them. By-depth stages are read at the divergence depth, fc stages (no depth) at depth 0."""
    strace = getattr(inputs.traces, sv)
    want = np.array(sorted(pack_keys(np.array([p]), np.array([t]), np.zeros(1, np.int64))[0] for p, t in failing))

    def serving_rows(name):
        m = match_rows(inputs.traces, inputs.alignment, name)
        by_depth = spec_for(name).by_depth
        keep = m.depth == (depth if by_depth else 0)
        keep &= np.isin(pack_keys(m.pair, m.pos, np.zeros_like(m.depth)), want)
        idx = np.nonzero(keep)[0]
        b, ok = batch.coords(m.pair[idx], m.pos[idx], np.full(len(idx), depth), by_depth)
        idx, b = idx[ok], b[ok]
        if not len(idx):
            return None
        return b, m.pos[idx].astype(np.int64), strace.take_float(name, getattr(m.rows, sv)[idx])

    return serving_rows


def _from_stage(first, stages: tuple[str, ...], comparisons: dict, depth: int) -> str:
    """The stage reproduction is judged from: the first divergence when the re-run computes it, else
    (an input's divergence) the first draft stage that diverged, else the first compared.

    Raises:
        NarrowError: serving recorded no row of the first divergence where the re-run reaches.
    """
    if computed(first.name):
        if first.name not in stages:
            raise NarrowError(f"serving recorded no {first.name} row at depth {depth} on the failing positions the "
                              "re-run reaches")
        return first.name
    diverged = [s for s in stages if s in comparisons and comparisons[s].diverged]
    return diverged[0] if diverged else stages[0]


def _unchanged(runs: dict, aux: dict, d2t: dict, flags: dict, tokens_differ: bool) -> list[str]:
    """The substitutions of ``runs`` that change nothing: serving holds each input they take as
    training does. With the ids' tie allowance such a run may reproduce serving as training's own
    inputs do, but the difference cannot enter there."""
    import torch

    def same(x, y) -> bool:
        return x is y or (x is not None and y is not None and torch.equal(x, y))

    return [v for v, (a, tk, d, f) in runs.items() if v != BASE and
            (a == "train" or same(aux["train"], aux["serve"])) and (tk == "train" or not tokens_differ)
            and (d == "train" or same(d2t["train"], d2t["serve"])) and (f == "train" or flags["train"] == flags["serve"])]


def run_plan(plan: NarrowPlan) -> Narrowing:
    """Carry out ``plan``: re-run the training draft once per run (``plan.runs``, then ``UPSTREAM``),
    judge each stage at its noise (rerun/limits.py), score each run against serving's rows, and conclude."""
    res = Narrowing(plan.stages, plan.from_stage, plan.positions, depth=plan.depth, rows=plan.rows)
    runs = [*plan.runs.items(), (UPSTREAM, plan.upstream)]
    outs = {name: _forward(plan.model, plan, sources) for name, sources in runs}
    limits, ties = run_limits(plan, outs[UPSTREAM], _forward)
    res.limits = {st: lim.words for st, lim in limits.items()}
    for name, (_a, _tk, d, _f) in runs:
        v = _score(plan, name, outs[name], plan.d2t[d], limits, ties)
        if name == UPSTREAM:
            res.upstream = v
        else:
            res.variants.append(v)
    res.contract_fields = list(plan.contract_fields)
    res.unchanged = list(plan.unchanged)
    res.decided, res.conclusion = _conclusion(res)
    return res


def _forward(model, plan: NarrowPlan, sources: tuple):
    """``model``'s teacher-forced forward through the plan's depth on the inputs ``sources`` name (the side of
    each of ``RUN_INPUTS``)."""
    import torch

    a, tk, _d, f = sources
    dev = next(model.parameters()).device
    with with_norm_flags(model, plan.flags[f]), torch.no_grad():
        return model.ttt_forward(plan.batch.aux[a].to(dev), plan.batch.ids[tk].to(dev), plan.depth + 1,
                                 lengths=plan.batch.lengths)


def _score(plan: NarrowPlan, name: str, out, d2t, limits: dict, ties) -> Variant:
    """Run ``name``'s ``Variant``: its draft output ``out`` (with vocab map ``d2t``) against serving's
    rows of every compared stage; float stages judged by ``limits``, id stages by the tie proof ``ties``
    (rerun/limits.py ``run_limits``)."""
    depth = plan.depth
    scores, matches, ratios = {}, {}, {}
    for st in plan.stages:
        rb, rt, ys = plan.recorded[st]
        id_stage = id_ties.is_id_stage(st)
        width = ys.reshape(len(ys), -1).shape[1] if id_stage and len(ys) else 1
        xs = computed_rows(out, d2t, st, rb, rt, np.full(len(rb), depth), width)
        if id_stage:
            # the whole id set of each row: a row fails its comparison on any id (top-k overlap),
            # so a top-1 check cannot tell which side's inputs give serving's set; a row whose
            # set is the re-run's top-k up to the measured logit noise is reproduced (id_ties)
            xs, ys2 = np.sort(xs.reshape(len(xs), -1), axis=1), np.sort(ys.reshape(len(ys), -1), axis=1)
            if xs.shape == ys2.shape:
                differ = (xs != ys2).any(axis=1)
                # not for training's own inputs: that run asks whether the re-run is another draft
                # than training's, which only serving's exact ids on the failing rows would show (a
                # near tie is consistent with both sides' logits)
                if name != BASE:
                    differ[differ] &= ~ties.reproduced(out, d2t, st, rb[differ], rt[differ], depth, ys2[differ])
                disagree = float(differ.mean())
            else:
                disagree = 1.0
            scores[st], matches[st] = disagree, disagree <= 1 - ID_AGREE
        else:
            rel = metrics.relative_error(xs, ys)
            scores[st] = float(rel.mean())
            ratio, matches[st] = limits[st].judge(rel)
            if ratio is not None:
                ratios[st] = ratio
    return Variant(name, scores, matches, all(matches[s] for s in plan.judged), ratios)


def _conclusion(res: Narrowing) -> tuple[bool, str]:
    """(decided, conclusion) of a narrowing whose runs are scored: the substitution that reproduces
    serving, or why none does."""
    hits = [v for v in res.variants[1:-1] if v.reproduces and v.name not in res.unchanged]
    base, every = res.variants[0], res.variants[-1]
    where = f"{res.rows} failing row(s) of {res.from_stage} at depth {res.depth}"
    if base.reproduces:
        return False, (f"cannot decide: on the {where}, the training draft re-run on training's own inputs "
                       "computes what serving recorded, not what training recorded: the re-run is not the draft "
                       "training recorded (another checkpoint than the trace's draft_name?)")
    if hits:
        return True, (f"substituting {' / '.join(v.name for v in hits)} reproduces serving from {res.from_stage} on: "
                      "the difference enters with that input")
    if every.reproduces and every.name not in res.unchanged:
        return True, ("no single serving input reproduces serving, every serving input together does: "
                      "the difference is a combination of inputs")
    if res.contract_fields:
        return True, (f"no serving input reproduces serving on the {where}, not even all together: the "
                      "difference is inside the draft's own computation; differing contract fields: "
                      + ", ".join(res.contract_fields))
    return False, (f"cannot decide: no serving input reproduces serving on the {where}, not even all "
                   "together, and the recorded contracts agree: the difference lies in state the re-run "
                   "does not take from the trace (the draft's KV history of earlier positions or rounds, "
                   "the engine's attention kernel)")


def _seq_of(inputs: DiffInputs, pair_index: int, attr: str) -> int:
    for p in inputs.alignment.seq_pairs:
        if p.index == pair_index:
            return getattr(p.seq, attr)
    return -1


def narrow_or_reason(inputs: DiffInputs, comparisons: dict, first, **kw) -> Narrowing | str:
    """``narrow(inputs, comparisons, first)``, or the one-line reason it could not run (never raises
    SpecdiffError)."""
    try:
        return narrow(inputs, comparisons, first, **kw)
    except SpecdiffError as exc:
        return str(exc)


__all__ = ["Narrowing", "Variant", "NarrowError", "NarrowPlan", "UPSTREAM", "narrow", "narrow_or_reason",
           "plan_narrowing", "run_plan"]
