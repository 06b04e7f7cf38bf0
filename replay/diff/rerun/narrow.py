"""Narrow a divergence no explanation fits: which serving input, grafted into the training draft,
reproduces what serving's draft computed on the rows that fail?

The draft as trained (the training contract's ``draft_name``, as in replay.graft) is re-run,
teacher-forced through the first divergence's depth, on the aligned sequences that hold its
failing rows (``TensorComparison.judged_fail``; the first failing one first), once on every
training input and once per serving input substituted: ``target.aux_cat`` (the target's hidden
states), ``tokens`` (the draft's input tokens), ``draft.d2t`` (the vocab map) and the norm flags
(when the contracts differ). Each run's draft stages are compared with the rows serving recorded
**at the failing rows' positions and depth** (never a sample that misses them: a depth-1 bug
re-run at depth 0 finds nothing to reproduce). A substitution that makes the training draft
compute what serving computed there is where the difference enters.

The verdict never contradicts the first divergence: when the training inputs alone already give
serving's values on the failing rows, or nothing reproduces serving while the contracts agree
(the difference lies in state the re-run does not take from the trace: the draft's KV history),
or the first divergence is not a draft stage the re-run computes, it says it cannot decide and
why. Only when the contracts differ does "inside the draft's own computation" name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdiff.replay.diff.align.align import match_rows, pack_keys
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.rerun import id_ties
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
from specdiff.tracer.schema import layer_out_index

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
        matches: stage -> within tolerance of serving's rows.
        reproduces: every compared stage from the first diverging one on matches serving.
    """

    name: str
    scores: dict
    matches: dict
    reproduces: bool


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


def failing_rows(first) -> tuple[int, set]:
    """(depth, {(pair, pos)}) of the first divergence's failing rows at its divergence depth: the
    rows the narrowing must re-run (all of them; none of another depth)."""
    d = first.divergence_depth or 0
    bad = first.judged_fail & (first.match.depth == d)
    return d, set(zip(first.match.pair[bad].tolist(), first.match.pos[bad].tolist(), strict=True))


def narrow(inputs: DiffInputs, comparisons: dict, first, *, draft_path: str | None = None,
           target_path: str | None = None) -> Narrowing:
    """Re-run the training draft on the first diverging sequences with each serving input grafted in.

    ``inputs``: the diff's (types.DiffInputs); ``comparisons``: name -> TensorComparison; ``first``: the
    first divergence (a ``values`` TensorComparison).

    Raises:
        NarrowError: no draft checkpoint, no aux rows on both sides, nothing to compare.
        CheckpointError: the checkpoint cannot be loaded.
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
    traces, model, d2t, flags = inputs.traces, run.model, run.d2t, run.flags
    first_pair = (first.first_where or {}).get("pair", 0)
    pair_idx = {getattr(p.seq, tr): p.index for p in inputs.alignment.seq_pairs}
    bad_pairs = {p for p, _ in failing}
    # every sequence that holds a failing row the re-run reaches (its leading positions with aux rows)
    holding = [s for s in run.plan if any(pair_idx[s.seq_train] == p and t < s.n for p, t in failing)]
    if not holding:
        raise NarrowError(f"no failing row of {first.name} lies in the leading positions with aux rows on both "
                          f"sides of its sequence (pairs {sorted(bad_pairs)[:4]}): nothing to re-run there")
    plan = sorted(holding, key=lambda s: (s.seq_train != _seq_of(inputs, first_pair, tr)))[:MAX_SEQS]

    batch = batch_inputs(inputs, run, plan)
    ids, aux, lengths = batch.ids, batch.aux, batch.lengths
    tokens_differ = not torch.equal(ids["train"], ids["serve"])

    variants = {BASE: ("train", "train", "train", "train"),
                "serving's target.aux_cat": ("serve", "train", "train", "train"),
                "serving's tokens": ("train", "serve", "train", "train"),
                "serving's draft.d2t": ("train", "train", "serve", "train")}
    if not tokens_differ:
        variants.pop("serving's tokens")
    if flags["train"] != flags["serve"]:
        variants["serving's norm flags"] = ("train", "train", "train", "serve")
    variants["every serving input"] = ("serve", "serve", "serve", "serve")
    upstream = ("serve", "serve", "train", "train")  # serving's data, the draft's own configuration

    # Serving's recorded rows of each stage at the failing rows, at (batch row, position): by-depth
    # stages at the divergence depth, fc stages (no depth) at depth 0.
    from specdiff.tracer.schema import spec_for

    want = np.array(sorted(pack_keys(np.array([p]), np.array([t]), np.zeros(1, np.int64))[0] for p, t in failing))

    def serving_rows(name):
        m = match_rows(traces, inputs.alignment, name)
        by_depth = spec_for(name).by_depth
        keep = m.depth == (depth if by_depth else 0)
        keep &= np.isin(pack_keys(m.pair, m.pos, np.zeros_like(m.depth)), want)
        idx = np.nonzero(keep)[0]
        b, ok = batch.coords(m.pair[idx], m.pos[idx], np.full(len(idx), depth), by_depth)
        idx, b = idx[ok], b[ok]
        if not len(idx):
            return None
        return b, m.pos[idx].astype(np.int64), strace.take_float(name, getattr(m.rows, sv)[idx])

    recorded = {name: r for name in stages if (r := serving_rows(name)) is not None}
    stages = tuple(s for s in stages if s in recorded)
    ties = id_ties.TieProof.load(traces, comparisons, serving_rows(id_ties.TOPK_IDS), serving_rows(id_ties.TOPK_VALUES), strace)
    if computed(first.name):
        if first.name not in stages:
            raise NarrowError(f"serving recorded no {first.name} row at depth {depth} on the failing positions the "
                              "re-run reaches")
        from_stage = first.name
    else:
        diverged = [s for s in stages if s in comparisons and comparisons[s].diverged]
        from_stage = diverged[0] if diverged else stages[0]
    judged = stages[stages.index(from_stage):]

    res = Narrowing(stages, from_stage, int(lengths.sum()), depth=depth, rows=len(recorded[from_stage][0]))
    dev = next(model.parameters()).device
    for name, (a, tk, d, f) in [*variants.items(), (UPSTREAM, upstream)]:
        with with_norm_flags(model, flags[f]), torch.no_grad():
            out = model.ttt_forward(aux[a].to(dev), ids[tk].to(dev), depth + 1, lengths=lengths)
        scores, matches = {}, {}
        for st in stages:
            rb, rt, ys = recorded[st]
            id_stage = st in ("draft.logits_topk.ids", "draft.topk", "draft.topk_target")
            width = ys.reshape(len(ys), -1).shape[1] if id_stage and len(ys) else 1
            xs = computed_rows(out, d2t[d], st, rb, rt, np.full(len(rb), depth), width)
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
                        differ[differ] &= ~ties.reproduced(out, d2t[d], st, rb[differ], rt[differ], depth,
                                                           ys2[differ])
                    disagree = float(differ.mean())
                else:
                    disagree = 1.0
                scores[st], matches[st] = disagree, disagree <= 1 - ID_AGREE
            else:
                rel = float(metrics.relative_error(xs, ys).mean())
                tol = comparisons[st].tolerance.rel if st in comparisons else 0.05
                scores[st], matches[st] = rel, rel <= tol
        v = Variant(name, scores, matches, all(matches[s] for s in judged))
        if name == UPSTREAM:
            res.upstream = v
        else:
            res.variants.append(v)
    res.contract_fields = [f"{m.field} ({m.x} vs {m.y})" for m in inputs.contract]
    # a substitution of an input serving holds as training does changes nothing: with the ids' tie
    # allowance it may reproduce serving as training's own inputs do, but the difference cannot enter there
    def same(x, y) -> bool:
        return x is y or (x is not None and y is not None and torch.equal(x, y))

    res.unchanged = [v for v, (a, tk, d, f) in variants.items() if v != BASE and
                     (a == "train" or same(aux["train"], aux["serve"])) and (tk == "train" or not tokens_differ)
                     and (d == "train" or same(d2t["train"], d2t["serve"])) and (f == "train" or flags["train"] == flags["serve"])]
    hits = [v for v in res.variants[1:-1] if v.reproduces and v.name not in res.unchanged]
    base, every = res.variants[0], res.variants[-1]
    where = f"{res.rows} failing row(s) of {from_stage} at depth {depth}"
    if base.reproduces:
        res.decided = False
        res.conclusion = (f"cannot decide: on the {where}, the training draft re-run on training's own inputs "
                          "computes what serving recorded, not what training recorded: the re-run is not the draft "
                          "training recorded (another checkpoint than the trace's draft_name?)")
    elif hits:
        res.conclusion = (f"substituting {' / '.join(v.name for v in hits)} reproduces serving from {from_stage} on: "
                          "the difference enters with that input")
    elif every.reproduces:
        res.conclusion = ("no single serving input reproduces serving, every serving input together does: "
                          "the difference is a combination of inputs")
    elif res.contract_fields:
        res.conclusion = (f"no serving input reproduces serving on the {where}, not even all together: the "
                          "difference is inside the draft's own computation; differing contract fields: "
                          + ", ".join(res.contract_fields))
    else:
        res.decided = False
        res.conclusion = (f"cannot decide: no serving input reproduces serving on the {where}, not even all "
                          "together, and the recorded contracts agree: the difference lies in state the re-run "
                          "does not take from the trace (the draft's KV history of earlier positions or rounds, "
                          "the engine's attention kernel)")
    return res


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


__all__ = ["Narrowing", "Variant", "NarrowError", "UPSTREAM", "narrow", "narrow_or_reason"]
