"""Inherited rows: a row whose inputs already differ upstream is not a new divergence.

A bf16 near-tie upstream (an MoE router sending one token to other experts, a greedy argmax
flip) makes a few rows of one stage differ beyond its tolerance; every stage that consumes those
rows then differs at the same (seq, pos) too. Counting those rows again at each later stage
turned a difference the upstream stage let through as noise into a "first divergence"
downstream (issue 20: a correct Qwen3-MoE pair diverged at ``draft.hidden_out``, 21 / 787 rows,
every one of them at a position whose ``target.aux.1`` row had flipped). So the first
divergence is decided on the rows whose inputs agree; the rows whose inputs differ are
*inherited* and reported, with the tensor they were inherited from.

What feeds what (DESIGN.md "The trace model", stage order ``tokens -> target.aux.{j} ->
target.aux_cat -> draft.fc_in -> ... -> verify``; the EAGLE-3 pairing of tracer/rows.py):

- a row at (pair, pos) of a depthless tensor (``target.*``, ``draft.fc_in``, ``draft.fc_out``)
  feeds that position at every draft depth: the draft row (t, k) consumes the target's h_t;
- a row at (pair, pos, depth k) of a by-depth tensor feeds depth k and deeper of that position:
  depth k + 1 consumes the draft's own depth-k hidden (``draft.hidden_in`` at k + 1 is
  ``draft.hidden_out`` at k, tracer/rows.py ``ttt_rows``). Tensors are compared in stage order,
  so a depth-k ``draft.hidden_out`` row reaches the depth-(k + 1) rows through
  ``draft.hidden_in`` at k + 1 (the same values, compared earlier), not directly;
- ``target.aux.{j}`` is fed by ``tokens`` and the lower slots (a later layer of the same
  position), ``target.aux_cat`` and ``target.argmax`` by the target rows only; a draft tensor by
  ``tokens``, the target's aux rows and the draft stages before it (``draft.fc_out`` feeds
  ``draft.hidden_in``, its depth-0 rows are the same values). Parallel views of one output
  (``draft.logits_topk.values`` / ``.ids`` / ``draft.logsumexp``) do not feed each other.
  ``verify.*`` and probes are not compared row by row (compare.is_compared).

A failing upstream row is a *source* only while its own tensor treats it as noise: a row at a
depth where that tensor does not diverge (``TensorComparison.divergence_depth``), or a row its
tensor did not count (itself inherited, explained, or past the common token run). Once a stage
diverges it (or an earlier one) is the first divergence, and the stages after it keep their own
verdicts, so the report still shows how far a real bug spreads.

A row whose inputs agree but whose output differs is never inherited: it counts in full
(a wrong token at a chunk boundary is a divergence at ``tokens``; a wrong layer fails most rows
of ``target.aux``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdiff.replay.diff.types import DIVERGED
from specdiff.tracer.schema import aux_slot, spec_for

#: Sibling views of one output: none of them is an input of another.
_SIBLINGS = {"draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp"}


def feeds(source: str, target: str) -> bool:
    """Whether rows of tensor ``source`` are inputs of rows of tensor ``target`` at the same
    position (module doc); both canonical names."""
    if source == target or (source in _SIBLINGS and target in _SIBLINGS):
        return False
    if source.startswith("verify.") or target.startswith("verify.") or target == "tokens":
        return False
    ss, st = spec_for(source), spec_for(target)
    if source == "tokens":
        return True
    if target.startswith("target."):
        if not source.startswith("target.") or source == "target.argmax":
            return False
        js, jt = aux_slot(source), aux_slot(target)
        if jt is not None:  # a later layer of the same position
            return js is not None and js < jt
        return ss.stage_index < st.stage_index
    # a draft tensor: the target's aux rows and the draft stages before it
    if source == "target.argmax":
        return False
    if ss.stage_index < st.stage_index:
        return True
    return source == "draft.fc_out" and target == "draft.hidden_in"


def _pos_key(pair: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return (np.asarray(pair, np.int64) << 32) | np.asarray(pos, np.int64)


@dataclass
class _Source:
    """The source rows of one tensor: sorted unique (pair, pos) keys and, per key, the shallowest
    depth from which the rows it feeds differ."""

    name: str
    keys: np.ndarray
    depth: np.ndarray
    explained: np.ndarray | None = None  # bool per key: a named cause explains that row


@dataclass
class Inheritance:
    """The source rows of the tensors compared so far (compare_all adds them in dataflow order).

    ``inherited(name, match)`` then says which rows of the next tensor are inherited and from
    which tensor (the earliest in dataflow order that feeds the row).
    """

    sources: list[_Source] = field(default_factory=list)

    def add(self, comp, rows: np.ndarray) -> None:
        """Rows ``rows`` (bool [n] over ``comp.match``) of comparison ``comp`` are sources."""
        if not rows.any():
            return
        m = comp.match
        depth = m.depth[rows] if spec_for(comp.name).by_depth else np.zeros(int(rows.sum()), np.int64)
        keys = _pos_key(m.pair[rows], m.pos[rows])
        named = (comp.explained[rows] if comp.explained is not None else np.zeros(len(keys), bool))
        order = np.lexsort((depth, keys))
        keys, depth, named = keys[order], depth[order], named[order]
        first = np.r_[True, keys[1:] != keys[:-1]]  # the shallowest depth of each key
        self.sources.append(_Source(comp.name, keys[first], depth[first].astype(np.int64), named[first]))

    def explained_at(self, pair: int, pos: int, into: str) -> bool:
        """Whether a source row at (``pair``, ``pos``) of a tensor feeding ``into`` is one a named
        legitimate cause explains (e.g. an MoE routing near tie), not only one within its
        tensor's fail fraction."""
        key = int(_pos_key(np.array([pair]), np.array([pos]))[0])
        for s in self.sources:
            if s.explained is None or not (s.name == into or feeds(s.name, into)):
                continue
            at = int(np.searchsorted(s.keys, key))
            if at < len(s.keys) and s.keys[at] == key and s.explained[at]:
                return True
        return False

    def inherited(self, name: str, match) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(bool [n] inherited rows of ``match`` (RowMatch of tensor ``name``), int [n] index into
        the returned names of the tensor each was inherited from, -1 where not inherited, names)."""
        n = len(match.pair)
        src = np.full(n, -1, np.int64)
        names: list[str] = []
        if not n:
            return np.zeros(0, bool), src, names
        keys = _pos_key(match.pair, match.pos)
        depth = match.depth if spec_for(name).by_depth else np.zeros(n, np.int64)
        for s in self.sources:
            if not feeds(s.name, name):
                continue
            at = np.minimum(np.searchsorted(s.keys, keys), len(s.keys) - 1)
            hit = (s.keys[at] == keys) & (s.depth[at] <= depth) & (src < 0)
            if hit.any():
                src[hit] = len(names)
                names.append(s.name)
        return src >= 0, src, names


def source_rows(comp) -> np.ndarray:
    """bool [n]: the failing rows of ``comp`` that its own verdict treats as noise (module doc):
    not counted by it, or at a depth shallower than the depth it diverges at; and, of a tensor
    that did not diverge, its ``carried`` rows (``types.TensorComparison``): a re-run showed the
    draft computes them from each side's differing earlier cached rows, so a later stage's row
    there does not have agreeing inputs even where this one passed its tolerance."""
    fail = comp.status == DIVERGED
    counted = comp.counted if comp.counted is not None else np.ones(len(fail), bool)
    explained = comp.explained if comp.explained is not None else np.zeros(len(fail), bool)
    noise = ~counted | explained
    if not comp.diverged or comp.kind != "values":
        if comp.kind != "values":
            return np.zeros(len(fail), bool)
        # rows a re-run showed are moved by earlier cached rows: passing ones move later stages too
        return fail | comp.carried if comp.carried is not None else fail
    d = comp.divergence_depth or 0
    return fail & (noise | (comp.match.depth < d))


def beyond_common_run(name: str, match, lengths: np.ndarray) -> np.ndarray:
    """bool [n]: ``tokens`` rows whose input token x_{t+1+k} lies past the pair's common token
    run (``lengths``: int [pairs], SeqPair.length), so the sides may hold different tokens there
    by design (sequences that share a prefix, then continue differently). False for other tensors.
    """
    if name != "tokens" or not len(match.pair):
        return np.zeros(len(match.pair), bool)
    return match.pos + 1 + match.depth >= lengths[match.pair]


def summary(comp) -> dict:
    """``{"rows": inherited row count, "from": {tensor: rows}}`` of one comparison."""
    inh = comp.inherited if comp.inherited is not None else np.zeros(len(comp.status), bool)
    out: dict = {}
    if comp.inherited_src is not None and inh.any():
        idx, cnt = np.unique(comp.inherited_src[inh], return_counts=True)
        out = {comp.inherited_names[int(i)]: int(c) for i, c in zip(idx, cnt, strict=True)}
    return {"rows": int(inh.sum()), "from": out}


__all__ = ["Inheritance", "feeds", "source_rows", "beyond_common_run", "summary"]
