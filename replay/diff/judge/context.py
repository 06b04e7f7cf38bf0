"""Draft attention context: a named, legitimate difference after an earlier cached row differed.

The EAGLE-3 draft attends over its KV cache: the row at (seq, t) of ``draft.hidden_out`` and every
stage after it reads the keys and values of every earlier position t' < t of the same sequence,
computed from that position's depth-0 ``draft.attn_in`` (SGLang 0.5.23: the draft KV cache the
draft extend writes after each verify, srt/speculative/eagle_worker_v2.py:1110
``_draft_extend_for_decode``; training: the causal TTT mask). ``replay/diff/judge/inherited.py`` inherits a row from a differing input *at the same position*;
an earlier position's differing K/V reaches every later row of the sequence instead, diluted by
the weight the attention puts on it.

Measured (tiny DeepSeek-V3 target, random draft, traced chain server, 3 prompts x 48
tokens): one MoE routing flip at ``target.aux.1`` (seq 0, pos 30; explained) moved that position's
``draft.attn_in`` by rel 0.38 (inherited), and 12 later depth-0 ``draft.hidden_out`` rows of the
same sequence (pos 32-51) by rel 0.05-0.10, against 0.008-0.018 before pos 30: 6.6 % of the
counted rows, a false "first divergence: draft.hidden_out".

``context_rows`` names that pattern, for a draft tensor after the attention, when every counted
failing row fits it:

- it lies after a *context source* of its own sequence: a depth-0 row of a stage the draft's K/V
  are computed from (``draft.attn_in`` or anything that feeds it) that differs while its own
  tensor treats it as noise (``inherited.source_rows``: explained, inherited, or within the
  stage's fail fraction);
- the rows before every source (the attention over agreeing context) are at least
  ``CONTEXT_MIN_CLEAN`` of the counted rows and all agree: a bug in the draft attention itself
  (rope, mask, scale) fails those too and is then counted in full, as before;
- each float row still points the same way (cosine > 0, rel < ``CONTEXT_MAX_REL``).

A failing row with no earlier source in its sequence is never named, and a stage that diverged is
never a source: a real bug upstream stays the first divergence.

When the sources come so early that the rows before them are too few (measured on GPT-OSS: router
near ties at positions 1-7 of every prompt left 8 of 128 rows), a re-run of the draft stands in for
them (replay/diff/judge/context_proof.py, asked through ``context_rows(prove=...)``): the training draft
re-run on each side's inputs reproduces that side on every row after a source. Those rows are then
``carried`` (compare.py): later stages inherit them, passing or not.

The same earlier row moves the *passing* rows after it too, and those set how close the tensor
came to its limit (``limit_use``, the report's margin). Measured (the same DeepSeek-V3
chain pair): the closest ``draft.hidden_out`` row, rel 0.0491 against the 0.05 limit (use 0.98),
was seq 0 pos 50, twenty positions after that sequence's flip at pos 30; every row above rel 0.026
lay after a flip, the rows before every flip reached 0.026 at most (use 0.52). A margin read off
those rows says "one prompt set away from a false divergence" about numerics the rule already
explains when they cross the limit. ``attributed_rows`` names them, under the same conditions as
``context_rows`` (the rows before every source are at least ``CONTEXT_MIN_CLEAN`` of the counted
rows), so the margin is the draft's own noise, measured on the rows whose context agrees; the
attributed rows and their largest rel are reported beside it (compare.py ``_inheritance_stats``).
Nothing a verdict reads changes: a failing row is still judged by ``context_rows`` (or counted).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from specdiff.replay.diff.judge.inherited import feeds
from specdiff.replay.diff.types import UNREADABLE, row_lines
from specdiff.tracer.schema import spec_for

#: the stage whose depth-0 rows the draft's KV cache is computed from
CONTEXT_STAGE = "draft.attn_in"
#: what the cached K/V of a position are computed from: its depth-0 attention input, and its rope
#: position (applied to K)
_KV_INPUTS = (CONTEXT_STAGE, "draft.positions")
#: the rows before every context source must be at least this share of the counted rows
CONTEXT_MIN_CLEAN = 0.25
#: a row moved by another position's K/V is still related to the other side's
CONTEXT_MAX_REL = 1.0


def consumes_context(name: str) -> bool:
    """Whether rows of tensor ``name`` are computed from the draft attention's output (a draft
    stage after ``draft.attn_in``)."""
    return name.startswith("draft.") and spec_for(name).stage_index > spec_for(CONTEXT_STAGE).stage_index


def first_sources(upstream) -> dict[int, int]:
    """pair -> first position of a context source (module doc) in ``upstream``
    (``inherited.Inheritance``, the source rows of the tensors compared so far)."""
    first: dict[int, int] = {}
    for s in upstream.sources:
        if s.name not in _KV_INPUTS and not feeds(s.name, CONTEXT_STAGE):
            continue
        keys = s.keys[s.depth == 0]
        for pair, pos in zip((keys >> 32).tolist(), (keys & 0xFFFFFFFF).tolist(), strict=True):
            if pos < first.get(pair, pos + 1):
                first[pair] = pos
    return first


@dataclass(frozen=True)
class ContextRows:
    """Rows of one draft tensor explained by an earlier differing cached row (JSON-safe).

    Attributes:
        tensor: the draft tensor; rows: ``[{"seq", "pos", "depth", "rel", "cos"}]`` explained.
        sources: ``[{"seq", "pos"}]``: the first context source of each sequence they lie in.
        fraction: explained rows / counted rows; clean_rows: counted rows before every source.
        max_rel: the largest relative error among them (0 for id tensors).
        proof: None when the ``clean_rows`` show the attention agrees; else the re-run that shows
            it (replay/diff/judge/context_proof.py ``ReplayProof`` as a dict, with its ``message``).
    """

    tensor: str
    rows: list
    sources: list
    fraction: float
    clean_rows: int
    max_rel: float
    proof: dict | None = None

    @property
    def cause(self) -> str:
        return "draft_attention_context"

    @property
    def message(self) -> str:
        at = ", ".join(f"seq {s['seq']} pos {s['pos']}" for s in self.sources[:3])
        more = f" and {len(self.sources) - 3} more" if len(self.sources) > 3 else ""
        why = (f"the {self.clean_rows} rows before it agree" if self.proof is None
               else f"only {self.clean_rows} rows precede it, but {self.proof['message']}")
        return (f"draft attention context: {len(self.rows)} {self.tensor} row(s) ({self.fraction:.1%} of the rows whose "
                f"inputs agree) differ only after an earlier position of their sequence differed upstream ({at}{more}); "
                f"the draft attends to that position's cached keys and values, and {why} (max_rel {self.max_rel:.3g})")

    def evidence(self, limit: int = 8) -> list[str]:
        return row_lines(self.rows, lambda r: f"seq {r['seq']} pos {r['pos']} depth {r['depth']}: rel {r['rel']:.3g}",
                         limit)


def after_sources(match, first: dict[int, int]) -> np.ndarray:
    """bool [n]: rows of ``match`` (RowMatch) at a position after the first context source of
    their sequence (``first``: :func:`first_sources`)."""
    inf = np.iinfo(np.int64).max
    starts = np.array([first.get(int(p), inf) for p in match.pair], np.int64)
    return match.pos.astype(np.int64) > starts


def attributed_rows(name: str, match, first: dict[int, int], counted: np.ndarray | None) -> np.ndarray | None:
    """bool [n]: the counted rows of tensor ``name`` (a draft tensor after the attention) that lie
    after an earlier differing cached row of their sequence: whatever they differ by, passing or
    not, the earlier row's keys and values are part of it (module doc). They do not set the
    tensor's margin. None when ``name`` does not consume the context, no sequence has a source,
    or the rows before every source are fewer than ``CONTEXT_MIN_CLEAN`` of the counted rows (then
    nothing shows that the attention over agreeing context is as close as the margin would say).

    ``counted``: bool [n], the rows whose inputs agree (None: all).
    """
    if not consumes_context(name) or not first or not len(match.pair):
        return None
    counted = np.ones(len(match.pair), bool) if counted is None else counted
    after = after_sources(match, first) & counted
    if not after.any() or int((counted & ~after).sum()) < CONTEXT_MIN_CLEAN * int(counted.sum()):
        return None
    return after


def context_rows(comp, first: dict[int, int], candidates: np.ndarray, counted: np.ndarray,
                 prove=None, explained_first=None) -> ContextRows | str | None:
    """The context explanation of ``candidates`` (bool [n]: the failing rows of ``comp``, a draft
    tensor after the attention, whose same-position inputs agree); when any of them does not fit
    (module doc) nothing is explained and the answer is why, in words; None when the tensor does
    not consume the context, no sequence has a source, or nothing fails.

    ``first``: :func:`first_sources`; ``counted``: bool [n], the rows whose inputs agree.
    ``prove(comp, idx)``: when too few rows precede every source, the re-run that shows the draft
    computes the same from the same inputs on every counted row after a source, passing or not
    (replay/diff/judge/context_proof.py ``ContextProver``: a ``ReplayProof`` or why not, in words);
    None: no re-run, the rows are not named. With a proof, compare.py marks those rows
    ``carried``: later stages inherit them. ``explained_first(pair) -> bool``: whether the first
    source of sequence ``pair`` is a row a named cause explains; the re-run is asked only when
    every sequence's is (a source merely within its stage's fail fraction may be a real bug at a
    few early positions, which serving's draft consumed too, so a re-run would reproduce it).
    """
    if not consumes_context(comp.name) or not first or not candidates.any():
        return None
    m = comp.match
    after = after_sources(m, first)
    idx = np.nonzero(candidates)[0]
    if not after[idx].all():
        k = int((~after[idx]).sum())
        return f"{k} failing rows lie before any differing cached row of their sequence: the attention itself differs"
    readable = counted & (comp.status != UNREADABLE)
    clean = int((readable & ~after).sum())
    total = int(readable.sum())
    float_kind = spec_for(comp.name).kind == "float"
    if comp.nonfinite[idx].any():
        return "non-finite rows"
    if float_kind and ((comp.score[idx] >= CONTEXT_MAX_REL).any() or (comp.cos[idx] <= 0).any()):
        return f"some rows are unrelated to the other side's (rel >= {CONTEXT_MAX_REL:g} or cosine <= 0)"
    proof = None
    if clean < CONTEXT_MIN_CLEAN * total:
        few = (f"only {clean} of {total} rows lie before every differing cached row, too few to show that the "
               "attention itself agrees")
        # every row after a source, passing ones too: the proof then covers what later stages inherit
        moved = np.nonzero(readable & after)[0]
        unexplained = sorted(p for p in {int(m.pair[i]) for i in moved}
                             if explained_first is None or not explained_first(p))
        if prove is None:
            proof = "no draft re-run was asked for (diff --no-narrow)"
        elif unexplained:
            proof = (f"no re-run either: the first differing cached row of sequence(s) {unexplained[:4]} is not one a "
                     "named cause explains (only within its stage's fail fraction)")
        else:
            proof = prove(comp, moved)
        if isinstance(proof, str):
            return f"{few}; {proof}"
        proof = {"message": proof.message(), **asdict(proof)}
    rows = [{"seq": int(m.pair[i]), "pos": int(m.pos[i]), "depth": int(m.depth[i]),
             "rel": float(comp.score[i]) if float_kind else 0.0, "cos": float(comp.cos[i])} for i in idx]
    seqs = sorted({r["seq"] for r in rows})
    return ContextRows(comp.name, rows, [{"seq": s, "pos": int(first[s])} for s in seqs],
                       len(idx) / total if total else 1.0, clean,
                       float(comp.score[idx].max()) if float_kind else 0.0, proof)


class ContextJudge:
    """``context_rows`` as a judge (judge/__init__.py ``JUDGES``): a draft tensor after the attention,
    once an earlier cached row of a sequence differed; why the rows were not named, when not, goes
    to the tensor's ``stats["context_not_named"]``. With a re-run's proof, the rows after a source
    are ``carried`` (later stages inherit them)."""

    def applies(self, name: str, scene) -> bool:
        return consumes_context(name) and bool(scene.first_sources)

    def watch_frac(self, tolerance) -> float:
        return 1.0

    def bind(self, name: str, scene):
        first, counted, prove, upstream = scene.first_sources, scene.counted, scene.prove_context, scene.upstream

        def explained_first(pair):
            return upstream.explained_at(pair, first[pair], CONTEXT_STAGE)

        def judge(comp, candidates):
            got = context_rows(comp, first, candidates, counted, prove, explained_first)
            if isinstance(got, str):
                comp.stats["context_not_named"] = got
                return None
            if got is not None and got.proof is not None:  # the re-run covered every readable row after a source
                comp.carried = after_sources(comp.match, first) & counted & (comp.status != UNREADABLE)
            return got
        return judge


__all__ = ["ContextRows", "ContextJudge", "consumes_context", "first_sources", "after_sources", "attributed_rows", "context_rows",
           "CONTEXT_STAGE", "CONTEXT_MIN_CLEAN", "CONTEXT_MAX_REL"]
