"""Inherited rows: a row whose inputs already differ upstream is not a new divergence.

A bf16 near-tie upstream (an MoE router sending one token to other experts, a greedy argmax
flip) makes a few rows of one stage differ beyond its tolerance; every stage that consumes those
rows then differs at the same (seq, pos) too. Counting those rows again at each later stage
turned a difference the upstream stage let through as noise into a "first divergence"
downstream (measured: a correct tiny Qwen3-MoE pair diverged at ``draft.hidden_out``, 21 / 787 rows,
every one of them at a position whose ``target.aux.1`` row had flipped). So the first
divergence is decided on the rows whose inputs agree; the rows whose inputs differ are
*inherited* and reported, with the tensor they were inherited from.

What feeds what is a graph, ``INPUTS``: each recorded tensor's direct inputs at the same position
(the dataflow of tracer/schema.py; the EAGLE-3 pairing of tracer/rows.py; SGLang llama_eagle3.py), and
a row is inherited only from a tensor that reaches it along that graph (``feeds``, its transitive
closure), never from a tensor it merely follows in stage order (measured on the shipped seed pair
with ``target.aux.0`` loosened, ``draft.positions`` was "inherited" from the aux slot, though rope
positions are computed from no hidden state):

- a row at (pair, pos) of a depthless tensor (``target.*``, ``draft.fc_in``, ``draft.fc_out``)
  feeds that position at every draft depth: the draft row (t, k) consumes the target's h_t;
- a row at (pair, pos, depth k) of a by-depth tensor feeds depth k and deeper of that position:
  depth k + 1 consumes the draft's own depth-k hidden (``draft.hidden_in`` at k + 1 is
  ``draft.hidden_out`` at k, tracer/rows.py ``ttt_rows``). Tensors are compared in stage order,
  so a depth-k ``draft.hidden_out`` row reaches the depth-(k + 1) rows through
  ``draft.hidden_in`` at k + 1 (the same values, compared earlier), not directly;
- parallel views of one output (``draft.logits_topk.values`` / ``.ids`` / ``draft.logsumexp``)
  do not feed each other; ``draft.positions`` has no recorded input (t + k); ``verify.*`` and
  probes are not compared row by row (compare.is_compared).

The target's captures (``target.aux.{j}``, ``target.argmax``) are views of one
forward the trace does not hold: slot j + 1 does not read slot j's recorded value, it reads the
residual stream of the layers in between. A forward difference at (pair, pos) (an MoE router
near-tie) shows in every capture from its layer on, but a *capture* difference (another
layer recorded into a slot) shows in that slot only: the seed pair's slots 1 and 2 differ on their
own. A capture therefore inherits from an earlier capture (``forward_feeds``) only rows that stand
for a forward difference: rows a named cause explains, or sparse failing rows the earlier capture
treats as noise under its own default tolerance. Rows let through only because the user loosened
that capture's fail fraction (``--tol target.aux.0=max_fail_frac:1``) are not: they say "I accept
this slot's difference", not "the forward differs here".

Decided for a loosened tolerance (``Inheritance.add(forward=False)``): its failing rows still feed
the stages that *compute* from that tensor (``target.aux_cat`` and the draft: their inputs differ
there, so they cannot be judged on those rows and are listed as inherited from it), but never the
target's other captures, which are judged on their own rows.

A failing upstream row is a *source* only while its own tensor treats it as noise: a row at a
depth where that tensor does not diverge (``TensorComparison.divergence_depth``), or a row its
tensor did not count (itself inherited, explained, or past the common token run). Once a stage
diverges it (or an earlier one) is the first divergence, and the stages after it keep their own
verdicts, so the report still shows how far a real bug spreads.

The target's greedy token at position t (``target.argmax``) is computed by attention over every
earlier position of the sequence, at every layer: a forward difference at an earlier position
reaches it too. Its rows after a sequence's first *explained* forward difference (a named MoE
router flip at an aux slot) are inherited from that slot (``_after_explained_flip``), when the rows
before every such flip are at least ``TARGET_CONTEXT_MIN_CLEAN`` of the tensor's rows (they show
the target agrees over agreeing context). Measured (a correct DeepSeek-V3 pair, ``make test-seeds``,
seed 1, prompt set b): a flip at ``target.aux.1`` seq 3 pos 17 left ``target.aux.2`` at 3-5x its
noise for 20 rows and flipped 5 greedy tokens after it (pos 20-39) among 13 failing rows (7.2 %
against the 5 % an id tensor may fail); 5 of the 13 lie in sequences with no flip: near ties of a
random target's flat logits, counted as before.

A row whose inputs agree but whose output differs is never inherited: it counts in full
(a wrong token at a chunk boundary is a divergence at ``tokens``; a wrong layer fails most rows
of ``target.aux``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from specdiff.replay.diff.types import DIVERGED
from specdiff.tracer.schema import UnknownTensorError, aux_slot, spec_for

#: the target capture after every aux slot that inherits through the target's attention (module doc)
TARGET_ARGMAX = "target.argmax"
#: the rows before every explained flip must be at least this share of ``target.argmax``'s rows
#: (replay/diff/judge/context.py CONTEXT_MIN_CLEAN, the draft's own rule)
TARGET_CONTEXT_MIN_CLEAN = 0.25

#: Each recorded tensor's direct inputs at the same position (module doc), by schema name
#: (tracer/schema.py SPECS; ``target.aux.{j}`` stands for every slot). The target's captures read
#: ``tokens`` (the sequence the forward runs on); their forward links are ``forward_feeds``.
INPUTS: dict[str, tuple[str, ...]] = {
    "tokens": (),
    "target.aux.{j}": ("tokens",),
    "target.aux_cat": ("target.aux.{j}",),  # the slots concatenated (SGLang logits_output.hidden_states)
    "target.argmax": ("tokens",),
    "draft.fc_in": ("target.aux_cat",),  # after the optional norm_before_fc / fc_norm
    "draft.fc_out": ("draft.fc_in",),
    "draft.hidden_in": ("draft.fc_out",),  # depth 0; deeper: the previous depth's hidden_out (module doc)
    "draft.positions": (),  # t + k: no recorded tensor computes it
    "draft.attn_in": ("tokens", "draft.hidden_in"),  # concat(norm(embed x), norm(h)), llama_eagle3.py:97-102
    "draft.hidden_out": ("draft.attn_in", "draft.positions"),  # attention (rope) + MLP
    "draft.logits": ("draft.hidden_out",),
    "draft.logits_topk.values": ("draft.hidden_out",),
    "draft.logits_topk.ids": ("draft.hidden_out",),
    "draft.logsumexp": ("draft.hidden_out",),
    # picked from the logits; logsumexp is no input, but a differing row of it shows the logits differ
    "draft.topk": ("draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp"),
    "draft.topk_target": ("draft.topk",),
}

#: the target's captures of its one forward (module doc); ``target.aux_cat`` is no capture of its
#: own but the slots concatenated (``INPUTS``): its rows reach nothing the slots' rows do not
_CAPTURES = ("target.aux.{j}", "target.argmax")


@functools.cache
def _reaches(target: str) -> frozenset[str]:
    """Every schema name with a path to schema name ``target`` in ``INPUTS``."""
    out: set[str] = set()
    for src in INPUTS.get(target, ()):
        out |= {src} | _reaches(src)
    return frozenset(out)


def _schema_name(name: str) -> str | None:
    try:
        return spec_for(name).name
    except UnknownTensorError:
        return None


def feeds(source: str, target: str) -> bool:
    """Whether rows of tensor ``source`` are inputs (directly or through other stages) of rows of
    tensor ``target`` at the same position, by the dataflow graph ``INPUTS`` (module doc); both
    canonical names. False for a tensor and itself, parallel views of one output, the target's
    captures among themselves (``forward_feeds``), ``verify.*`` and probes."""
    if source == target:
        return False
    ss, st = _schema_name(source), _schema_name(target)
    return ss is not None and st is not None and ss in _reaches(st)


def forward_feeds(source: str, target: str) -> bool:
    """Whether capture ``source`` of the target's forward precedes capture ``target`` in it (an
    earlier aux slot before a later one, every aux slot before ``target.argmax``):
    only rows that stand for a forward difference pass this way (module doc)."""
    ss, st = _schema_name(source), _schema_name(target)
    if ss not in _CAPTURES or st not in _CAPTURES or ss == "target.argmax":
        return False
    if st == "target.argmax":
        return True
    js, jt = aux_slot(source), aux_slot(target)
    return js is not None and jt is not None and js < jt


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
    forward: bool = True  # its rows may stand for a forward difference (module doc; captures only)

    def reaches(self, target: str) -> bool:
        """Whether these rows are inputs of rows of ``target`` (``feeds``, or ``forward_feeds``
        where they stand for a forward difference)."""
        return feeds(self.name, target) or (self.forward and forward_feeds(self.name, target))


@dataclass
class Inheritance:
    """The source rows of the tensors compared so far (compare_all adds them in dataflow order).

    ``inherited(name, match)`` then says which rows of the next tensor are inherited and from
    which tensor (the earliest in dataflow order that feeds the row).
    """

    sources: list[_Source] = field(default_factory=list)

    def add(self, comp, rows: np.ndarray, *, forward: bool = True) -> None:
        """Rows ``rows`` (bool [n] over ``comp.match``) of comparison ``comp`` are sources;
        ``forward``: False where they are sources only because the user loosened ``comp``'s fail
        fraction (module doc): then they never reach the target's other captures."""
        if not rows.any():
            return
        m = comp.match
        depth = m.depth[rows] if spec_for(comp.name).by_depth else np.zeros(int(rows.sum()), np.int64)
        keys = _pos_key(m.pair[rows], m.pos[rows])
        named = (comp.explained[rows] if comp.explained is not None else np.zeros(len(keys), bool))
        order = np.lexsort((depth, keys))
        keys, depth, named = keys[order], depth[order], named[order]
        first = np.r_[True, keys[1:] != keys[:-1]]  # the shallowest depth of each key
        self.sources.append(_Source(comp.name, keys[first], depth[first].astype(np.int64), named[first], forward))

    def explained_at(self, pair: int, pos: int, into: str) -> bool:
        """Whether a source row at (``pair``, ``pos``) of a tensor feeding ``into`` is one a named
        legitimate cause explains (e.g. an MoE routing near tie), not only one within its
        tensor's fail fraction."""
        key = int(_pos_key(np.array([pair]), np.array([pos]))[0])
        for s in self.sources:
            if s.explained is None or not (s.name == into or s.reaches(into)):
                continue
            at = int(np.searchsorted(s.keys, key))
            if at < len(s.keys) and s.keys[at] == key and s.explained[at]:
                return True
        return False

    def inherited(self, name: str, match, carried: dict | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(bool [n] inherited rows of ``match`` (RowMatch of tensor ``name``), int [n] index into
        the returned names of the tensor each was inherited from, -1 where not inherited, names).
        ``carried``: pair -> (first extended position, aux slot) of the pairs whose radix-cached
        prefix carries another sequence's explained flip (prefix_carry.CachedPrefixes.carried_starts),
        read for ``target.argmax``."""
        n = len(match.pair)
        src = np.full(n, -1, np.int64)
        names: list[str] = []
        if not n:
            return np.zeros(0, bool), src, names
        keys = _pos_key(match.pair, match.pos)
        depth = match.depth if spec_for(name).by_depth else np.zeros(n, np.int64)
        for s in self.sources:
            if not s.reaches(name):
                continue
            at = np.minimum(np.searchsorted(s.keys, keys), len(s.keys) - 1)
            hit = (s.keys[at] == keys) & (s.depth[at] <= depth) & (src < 0)
            if hit.any():
                src[hit] = len(names)
                names.append(s.name)
        if name == TARGET_ARGMAX:
            for s, after in self._after_explained_flip(match, carried or {}):
                hit = after & (src < 0)
                if hit.any():
                    src[hit] = names.index(s) if s in names else len(names)
                    if s not in names:
                        names.append(s)
        return src >= 0, src, names

    def explained_flips(self) -> list[tuple[int, int, str]]:
        """``(pair, pos, aux slot)`` of every source row of a target aux slot a named cause explains
        (an MoE router flip): the forward differences the target's attention carries to later rows."""
        out: list[tuple[int, int, str]] = []
        for s in self.sources:
            if aux_slot(s.name) is None or s.explained is None or not s.explained.any():
                continue
            out += [(k >> 32, k & 0xFFFFFFFF, s.name) for k in s.keys[s.explained].tolist()]
        return out

    def _after_explained_flip(self, match, carried: dict) -> list[tuple[str, np.ndarray]]:
        """``(aux slot, bool [n])``: the rows of ``match`` (``target.argmax``) after the first explained
        row of their sequence at that slot, or from the first extended position of a sequence whose
        cached prefix carries one (``carried``; module doc); empty when the rows before every such row
        are fewer than ``TARGET_CONTEXT_MIN_CLEAN`` of them."""
        first: dict[int, tuple[int, str]] = {p: (at - 1, slot) for p, (at, slot) in carried.items()}
        for pair, pos, slot in self.explained_flips():
            if pos < first.get(pair, (pos + 1, ""))[0]:
                first[pair] = (pos, slot)
        if not first:
            return []
        start = np.array([first.get(int(p), (np.iinfo(np.int64).max, ""))[0] for p in match.pair], np.int64)
        after = match.pos.astype(np.int64) > start
        if int((~after).sum()) < TARGET_CONTEXT_MIN_CLEAN * len(after):
            return []
        slot = np.array([first.get(int(p), (0, ""))[1] for p in match.pair], object)
        return [(n, after & (slot == n)) for n in sorted({v[1] for v in first.values()})]


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


__all__ = ["INPUTS", "Inheritance", "feeds", "forward_feeds", "source_rows", "beyond_common_run", "summary"]
