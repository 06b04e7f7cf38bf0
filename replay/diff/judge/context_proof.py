"""Prove draft attention context by re-running the draft: when too few rows precede every
differing cached row to show the draft attention agrees (replay/diff/judge/context.py), re-run it.

The context rule reads the rows before every context source as evidence that the draft's
attention over agreeing context agrees on both sides. When the sources come at the first positions
of every sequence (measured on the tiny GPT-OSS correct pair: router near ties at seq 0 pos 1, seq 1
pos 5, seq 2 pos 7 left 8 of 128 draft rows before every source), that evidence is missing. A re-run
supplies it directly: the draft as trained (``runner.prepare``: the training contract's draft_name,
training's vocab map and norm flags) is re-run, teacher-forced, on every sequence that holds a
failing row, once on training's recorded inputs (``target.aux_cat`` and tokens) and once on
serving's. When the first re-run reproduces training's rows and the second serving's, on every row
after a differing cached row (failing or not), the draft maps the same inputs to the same outputs on
both sides: the rows differ only because their inputs (the cached rows of earlier positions
included, recomputed from each side's ``target.aux_cat``) differ, and those differences the upstream
stages already judged as noise or explained. Passing rows are checked too because later stages
inherit them (compare.py ``carried``): the draft's logits at a row moved just under
``draft.hidden_out``'s tolerance may swap a top-k id (measured on the tiny GPT-OSS chain pair: 16
such rows at rel 0.033-0.048).

What it cannot hide: a serving draft that computes differently (its attention's rope, mask, scale,
its KV cache) is not reproduced by the training draft re-run on serving's inputs, so the rows stay
failing and counted; a different draft checkpoint on the training side is not reproduced on
training's inputs. Each re-run must match its side on every one of those rows within the
tensor's own ``rel`` (no fail fraction: a bug on a few rows would hide in one; a non-finite row
is a miss), every one of them must be one the re-run computes, the draft's top-1 id must match
on every such row that recorded one (``draft.logits_topk.ids``, else ``draft.topk``; another id
within a bf16 near tie of the re-run's top-1 logit, ``tolerance.is_near_tie``, is the same choice), and only
float stages the re-run computes are proven. It is asked only when the first differing cached
row of every sequence is one a named cause explains (context.py ``context_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.align.align import match_rows, pack_keys
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.measure.tolerance import is_near_tie
from specdiff.replay.diff.runner import RerunError, batch_inputs, computed_rows, prepare, with_norm_flags
from specdiff.replay.diff.types import DiffInputs
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.schema import spec_for

#: stages a re-run can prove (float stages after the draft attention that ``rerun.stage_outputs`` gives)
PROVABLE = ("draft.hidden_out",)
#: the draft's chosen ids, checked at the same rows (later stages inherit the proven rows): the
#: first of these both sides recorded
IDS = ("draft.logits_topk.ids", "draft.topk")
BATCH = 8  # sequences per re-run


@dataclass(frozen=True)
class ReplayProof:
    """A re-run that reproduced both sides on a tensor's rows after a differing cached row (JSON-safe).

    Attributes:
        rows: rows checked (every counted row after a source); sequences: sequences re-run.
        ids_rows: rows of the draft's top-1 id checked at the same positions (0: none recorded).
        training_rel: largest relative error, re-run on training's inputs vs training's rows.
        serving_rel: largest relative error, re-run on serving's inputs vs serving's rows.
        sides_rel: largest relative error between the two sides' recorded rows there.
    """

    rows: int
    sequences: int
    ids_rows: int
    training_rel: float
    serving_rel: float
    sides_rel: float

    def message(self) -> str:
        return (f"re-running the training draft reproduces each side on all {self.rows} rows after it, and the top-1 "
                f"id on {self.ids_rows} (on training's inputs: "
                f"max_rel {self.training_rel:.3g} to training's rows; on serving's: {self.serving_rel:.3g} to serving's; "
                f"the sides differ by up to {self.sides_rel:.3g}): the draft computes the same from the same inputs")


class ContextProver:
    """``prove(comp, idx)`` for ``context.context_rows``; loads the draft once, on first use.

    ``inputs``: the diff's ``types.DiffInputs`` (the prover runs while the comparisons are computed).
    ``draft_path`` / ``target_path``: as ``runner.prepare``.
    """

    def __init__(self, inputs: DiffInputs, *, draft_path: str | None = None, target_path: str | None = None):
        self.inputs, self.draft_path, self.target_path = inputs, draft_path, target_path
        self.run, self.error = None, None

    def _prepared(self):
        if self.run is None and self.error is None:
            try:
                self.run = prepare(self.inputs, draft_path=self.draft_path, target_path=self.target_path,
                                   error=RerunError)
            except SpecdiffError as exc:
                self.error = f"the draft re-run cannot run: {exc}"
        return self.run

    def __call__(self, comp, idx: np.ndarray) -> ReplayProof | str:
        """Re-run the draft on the sequences holding rows ``idx`` (indices into ``comp.match``, rows
        of tensor comparison ``comp``); the proof, or why there is none, in words."""
        if comp.name not in PROVABLE:
            return f"a re-run proves only {', '.join(PROVABLE)}"
        run = self._prepared()
        if run is None:
            return self.error
        try:
            return prove(self.inputs, run, comp, idx)
        except (RuntimeError, ValueError, IndexError) as exc:  # optional evidence: never abort the diff
            return f"the draft re-run failed ({type(exc).__name__}: {exc})"


def prove(inputs: DiffInputs, run, comp, idx: np.ndarray) -> ReplayProof | str:
    """Re-run ``run`` (runner.Rerun) on both sides' inputs; the module doc's proof for rows
    ``idx`` of ``comp`` (``types.TensorComparison``), or why it does not hold. The
    draft's top-1 id (``IDS``) at the same rows is checked too: later stages inherit the rows."""
    import torch


    m, tol = comp.match, comp.tolerance
    if not len(idx):
        return "no rows to re-run"
    pairs = set(m.pair[idx].tolist())
    index_of = {getattr(p.seq, run.tr): p.index for p in inputs.alignment.seq_pairs}
    seqs = [s for s in run.plan if index_of.get(s.seq_train) in pairs]
    steps = int(m.depth[idx].max()) + 1
    checks = [_Check(inputs, run, comp.name, m, idx)]
    ids = next((n for n in IDS if all(n in t.names for t in (run.ttrace, run.strace))), None)
    if ids is not None:
        checks.append(_Check(inputs, run, ids, match_rows(inputs.traces, inputs.alignment, ids), idx, among=m))
    dev = next(run.model.parameters()).device
    for b0 in range(0, len(seqs), BATCH):
        batch = batch_inputs(inputs, run, seqs[b0:b0 + BATCH])
        outs = {}
        for side in ("train", "serve"):
            with with_norm_flags(run.model, run.flags["train"]), torch.no_grad():
                outs[side] = run.model.ttt_forward(batch.aux[side].to(dev), batch.ids[side].to(dev), steps,
                                                   lengths=batch.lengths)
        for c in checks:
            c.score(batch, outs, run.d2t["train"], computed_rows)
    for c in checks:
        if not c.reached.all():
            return (f"the re-run does not compute {int((~c.reached).sum())} of the {len(c.rows)} {c.name} rows (no aux "
                    "rows on both sides there, or a depth past the sequence's end)")
        for side, words in (("train", "training's"), ("serve", "serving's")):
            if (why := c.fails(side, tol)) is not None:
                return (f"re-run on {words} inputs, the training draft does not reproduce {words} {c.name} rows ({why})"
                        + (": the serving draft computes differently from the same inputs" if side == "serve" else
                           ": the re-run is not the draft training recorded"))
    main = checks[0]
    sides_rel = metrics.relative_error(main.recorded["train"], main.recorded["serve"])
    return ReplayProof(len(idx), len(seqs), len(checks[1].rows) if len(checks) > 1 else 0,
                       float(main.err["train"].max()), float(main.err["serve"].max()), float(sides_rel.max()))


class _Check:
    """One stage the proof compares: its rows at the proven rows' (pair, pos, depth), both sides'
    recorded values, and the re-run's error on each (float: relative error; ids: the top-1 differs
    beyond a near tie in the re-run's logits)."""

    def __init__(self, inputs: DiffInputs, run, name: str, match, idx: np.ndarray, among=None):

        self.name, self.match, self.ids = name, match, spec_for(name).kind != "float"
        self.dtype = str(run.dtype).removeprefix("torch.")
        if among is None:
            rows = idx
        else:  # this stage's rows at the same (pair, pos, depth) as rows idx of ``among``
            want = pack_keys(among.pair[idx], among.pos[idx], among.depth[idx])
            rows = np.nonzero(np.isin(pack_keys(match.pair, match.pos, match.depth), want))[0]
        self.rows = rows
        take = "take" if self.ids else "take_float"
        self.recorded = {k: getattr(getattr(inputs.traces, getattr(run, a)), take)(name, getattr(match.rows, getattr(run, a))[rows])
                         for k, a in (("train", "tr"), ("serve", "sv"))}
        if self.ids:  # the recorders' top-k lists lead with the top-1 id
            self.recorded = {k: np.asarray(v).reshape(len(rows), -1)[:, 0] if len(rows) else np.zeros(0, np.int64)
                             for k, v in self.recorded.items()}
        self.err = {k: np.full(len(rows), np.inf) for k in ("train", "serve")}
        self.reached = np.zeros(len(rows), bool)

    def score(self, batch, outs: dict, d2t, computed_rows) -> None:
        m, r = self.match, self.rows
        b, ok = batch.coords(m.pair[r], m.pos[r], m.depth[r], spec_for(self.name).by_depth)
        sel = np.nonzero(ok)[0]
        if not len(sel):
            return
        self.reached[sel] = True
        t, d = m.pos[r][sel].astype(np.int64), m.depth[r][sel].astype(np.int64)
        for side, out in outs.items():
            xs = computed_rows(out, d2t, self.name, b[sel], t, d)
            ys = self.recorded[side][sel]
            if not self.ids:
                self.err[side][sel] = metrics.relative_error(xs, ys)
                continue
            differ = xs.reshape(len(sel), -1)[:, 0] != ys
            for i in np.nonzero(differ)[0]:  # the other side's id within a near tie of the re-run's top-1
                logits = out.logits[int(d[i])][int(b[sel][i]), int(t[i])].float()
                top, other = float(logits.max()), float(logits[int(ys[i])])
                differ[i] = not is_near_tie(top, other, dtype=self.dtype)
            self.err[side][sel] = differ

    def fails(self, side: str, tol) -> str | None:
        """Why the re-run does not reproduce ``side`` on every row, or None (module doc)."""
        err = self.err[side]
        if self.ids:
            off = int(err.sum())
            return f"top-1 id differs on {off} of {len(err)} rows" if off else None
        miss = ~(err <= tol.rel)  # NaN (a non-finite re-run) is a miss
        if miss.any():
            return f"{int(miss.sum())} of the {len(err)} rows above rel {tol.rel:g}, max {float(np.nanmax(err)):.3g}"
        return None


__all__ = ["ContextProver", "ReplayProof", "prove", "PROVABLE"]
