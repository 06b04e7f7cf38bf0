"""Every serving row compared or accounted for: per compared tensor and draft depth, what became of each
row the serving side recorded.

A tensor "agrees within tolerance" over the rows that were compared, and those can be far fewer than
serving recorded: serving's draft at depth k >= 1 follows its own picks where training's TTT feeds the true
tokens, so only the positions whose drafts were all accepted pair with a training row on the same input
(compare.py ``_token_path_keys``); a sequence may have no partner, run past the other side's, or sit in a
damaged chunk. A bug in what the draft is fed at depth >= 1 lives in exactly the rows left out, so they
are counted here, each with the reason the data give, and never as agreement.

Each of serving's rows of a tensor is either **compared** (it paired with a training row and was read on
both sides) and then one of

- ``agree``: within tolerance, its inputs agreeing (it counts toward the verdict);
- ``fail``: outside the row tolerance, its inputs agreeing (``TensorComparison.own_fail``; the tensor
  may still pass under its fail fraction);
- ``inherited``: its inputs already differ upstream (replay/diff/judge/inherited.py), or its failing row's
  difference re-execution reproduced from serving's inputs (rerun/reexec.py, per tensor);
- ``explained``: a failing row a named legitimate cause explains (replay/diff/judge/),

or **left out**, for one reason of ``REASONS``, read off the alignment and the row keys: its sequence has
no partner; its position lies outside the token run both sides hold; it repeats another row's (seq, pos,
depth) (a tree sibling: ``align.match_rows`` keeps the first); the other side recorded no row there; it is
off the other side's token path (depth >= 1); no ``tokens`` on both sides to check that path; a damaged
chunk; the two layouts differ; a ``tokens`` row past the common run (compared, never judged).

The counts come from numpy over the key columns (read once more per tensor, both sides), no loop over rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the same (pair, aligned pos, depth) keys match_rows pairs on: the reasons must be read off the very
# keys the comparison used, not a second derivation that could drift from it
from specdiff.replay.diff.align.align import _keyed
from specdiff.replay.diff.types import UNREADABLE, Alignment, Pair, TensorComparison
from specdiff.tracer.schema import spec_for

#: what a compared row is, in the order the counts are shown
COMPARED = ("agree", "fail", "inherited", "explained")

#: left-out reason -> (its short label, its words) in the report (``{other}``: the other side's label)
REASONS = {
    "unmatched": ("unmatched", "its sequence has no partner on {other}"),
    "before_run": ("before the run", "before the token run both sides hold (another token format's head)"),
    "past_run": ("past the run", "past the token run both sides hold ({other}'s sequence ends there or goes on "
                                 "otherwise)"),
    "repeated": ("repeated", "repeats a row's (seq, pos, depth): a tree sibling, only the first is compared"),
    "no_partner": ("no {other} row", "{other} recorded no row at its (seq, pos, depth)"),
    "off_path": ("off {other}'s path", "the draft was fed another token than {other} feeds, at this depth or an earlier "
                             "one of its position"),
    "unchecked_path": ("path unchecked", "depth >= 1, and no tokens on both sides to check the draft's path"),
    "unreadable": ("unreadable", "in a damaged chunk on either side"),
    "structure": ("layouts differ", "the two sides' layouts differ: no row of the tensor is compared"),
    "not_judged": ("not judged", "a tokens row whose input lies past the common token run: compared, never "
                                 "judged"),
    "not_compared": ("not compared", "paired, yet not compared"),
}

#: row code -> category (COMPARED, then REASONS), the index the per-row codes hold
_CODES = COMPARED + tuple(REASONS)
_CODE = {c: i for i, c in enumerate(_CODES)}


@dataclass(frozen=True)
class DepthRows:
    """One side's rows of one tensor at one draft depth, accounted for.

    Attributes:
        depth: the draft depth (0 for tensors without depths).
        rows: the rows that side recorded at this depth.
        agree, fail, inherited, explained: the compared rows, by what became of them (module doc).
        left_out: reason (``REASONS``) -> rows, most rows first; only reasons with rows.
    """

    depth: int
    rows: int
    agree: int
    fail: int
    inherited: int
    explained: int
    left_out: dict[str, int]

    @property
    def compared(self) -> int:
        return self.agree + self.fail + self.inherited + self.explained

    @property
    def left(self) -> int:
        return sum(self.left_out.values())


@dataclass(frozen=True)
class RowAccounting:
    """One side's rows of every compared tensor, accounted for (``account``).

    Attributes:
        label: the side accounted for ('serving'); other: the side its rows pair with ('training').
        tensors: tensor name -> its ``DepthRows``, shallowest depth first (depths with rows only),
            in the comparisons' (dataflow) order.
    """

    label: str
    other: str
    tensors: dict[str, tuple[DepthRows, ...]]

    @property
    def rows(self) -> int:
        return sum(d.rows for ds in self.tensors.values() for d in ds)

    @property
    def compared(self) -> int:
        return sum(d.compared for ds in self.tensors.values() for d in ds)

    @property
    def left(self) -> int:
        return self.rows - self.compared

    def left_out(self) -> list[tuple[str, DepthRows]]:
        """(tensor, depth) of every tensor and depth with rows left out, in dataflow then depth order."""
        return [(n, d) for n, ds in self.tensors.items() for d in ds if d.left]

    def reasons(self) -> list[str]:
        """The left-out reasons that occur, in ``REASONS`` order."""
        seen = {r for _, d in self.left_out() for r in d.left_out}
        return [r for r in REASONS if r in seen]

    def label_of(self, reason: str) -> str:
        """A reason's short label (``REASONS``) with the other side's label."""
        return REASONS[reason][0].format(other=self.other)

    def words(self, reason: str) -> str:
        """A reason's words (``REASONS``) with the other side's label."""
        return REASONS[reason][1].format(other=self.other)

    def places(self) -> list[tuple[list[str], DepthRows]]:
        """Where rows were left out: (tensors, their rows at one depth) for every depth of a tensor with rows
        left out, the tensors whose rows there are left out alike (the same rows, reasons and counts: a draft
        row off the other side's path is so at every stage of its depth) sharing one entry; least compared
        share first, then dataflow and depth order. Empty when every row was compared."""
        groups: dict[tuple, tuple[list[str], DepthRows]] = {}
        for name, d in self.left_out():
            key = (d.depth, d.rows, tuple(sorted(d.left_out.items())))
            groups.setdefault(key, ([], d))[0].append(name)
        return sorted(groups.values(), key=lambda g: g[1].compared / g[1].rows)

    def place_words(self, names: list[str], d: DepthRows, *, shown: int = 3) -> str:
        """A place of ``places`` in words: its first ``shown`` tensors (and how many more), at which depth
        (for tensors recorded per draft depth), e.g. "draft.hidden_out at depth 2"."""
        more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
        at = "" if self.depth_named(names, d) is None else f" at depth {d.depth}"
        return f"{', '.join(names[:shown])}{more}{at}"

    @staticmethod
    def depth_named(names: list[str], d: DepthRows) -> int | None:
        """A place's draft depth as it is named, or None where none of its tensors is recorded per depth
        (their rows are all at depth 0: naming it would suggest a draft step)."""
        return d.depth if any(spec_for(n).by_depth for n in names) else None

    def reason_words(self, d: DepthRows) -> str:
        """Why ``d``'s rows were left out: its one reason's label, or each reason's label with its rows
        ("off training's path 14, unmatched 2")."""
        if len(d.left_out) == 1:
            return self.label_of(next(iter(d.left_out)))
        return ", ".join(f"{self.label_of(r)} {n}" for r, n in d.left_out.items())

    def left_words(self, names: list[str], d: DepthRows) -> str:
        """What was left out at a place of ``places``, e.g. "draft.hidden_out at depth 2: 31 of 93 rows left
        out, off training's path" (several reasons: each with its rows, most first)."""
        why = f"{', ' if len(d.left_out) == 1 else ': '}{self.reason_words(d)}"
        return f"{self.place_words(names, d)}: {d.left} of {d.rows} rows left out{why}"

    def to_json(self) -> dict:
        """``{"label", "rows", "compared", "left_out", "tensors": {name: [{"depth", "rows", "agree", "fail",
        "inherited", "explained", "left_out": {reason: rows}}]}}`` (ints and strings only)."""
        return {"label": self.label, "rows": self.rows, "compared": self.compared, "left_out": self.left,
                "tensors": {n: [{"depth": d.depth, "rows": d.rows, **{c: getattr(d, c) for c in COMPARED},
                                 "left_out": d.left_out} for d in ds] for n, ds in self.tensors.items()}}


def account(traces: Pair, alignment: Alignment, comparisons: dict[str, TensorComparison], *, side: str,
            labels: Pair) -> RowAccounting:
    """Side ``side``'s (``"x"`` or ``"y"``, usually serving: types.serve_side) rows of every tensor in
    ``comparisons``, accounted for per draft depth (module doc). Reads each tensor's key columns on both
    sides; tensors that side did not record have no rows. ``labels``: the sides' names."""
    other = "x" if side == "y" else "y"
    # a tokens comparison with no row (one side recorded no tokens: compare_all still lists it) checked no path
    checked = ("tokens" in comparisons and comparisons["tokens"].kind != "structure"
               and comparisons["tokens"].stats.get("rows", 0) > 0)
    maps = Pair({p.seq.x: (p.index, p.length, p.start.x) for p in alignment.seq_pairs},
                {p.seq.y: (p.index, p.length, p.start.y) for p in alignment.seq_pairs})
    tensors = {}
    for name, comp in comparisons.items():
        if name not in getattr(traces, side).names:
            continue
        depth, code = row_codes(traces, maps, comp, side=side, path_checked=checked)
        tensors[name] = _by_depth(depth, code)
    return RowAccounting(getattr(labels, side), getattr(labels, other), tensors)


def row_codes(traces: Pair, maps: Pair, comp: TensorComparison, *, side: str,
              path_checked: bool) -> tuple[np.ndarray, np.ndarray]:
    """(depth int64 [n], code int64 [n]: an index of ``_CODES``) of each of side ``side``'s n rows of
    ``comp.name``. ``maps``: per side, seq id -> (pair index, common length, start), as
    ``align.match_rows`` builds them; ``path_checked``: both sides hold comparable ``tokens`` (depth >= 1
    rows are then compared only on agreeing token paths, else never)."""
    other = "x" if side == "y" else "y"
    trace, m = getattr(traces, side), getattr(maps, side)
    keys = trace.keys(comp.name, columns=("seq", "pos", "depth"))
    seq, pos = keys["seq"].astype(np.int64), keys["pos"].astype(np.int64)
    # a key read from a damaged chunk is -1 (tracer/store/reader.py): such a row is unreadable, at depth 0
    damaged = (seq < 0) | (pos < 0) | (keys["depth"] < 0)
    if comp.kind == "structure":
        depth = np.where(damaged, 0, keys["depth"]).astype(np.int64)
        return depth, np.where(damaged, _CODE["unreadable"], _CODE["structure"]).astype(np.int64)
    packed, valid = _keyed(trace, comp.name, m)
    depth = np.where(damaged, 0, packed & 0xFF)  # every row's own depth, paired or not (align.pack_keys: its low byte)
    code = np.full(len(seq), _CODE["not_compared"], np.int64)
    ids = np.array(sorted(m), np.int64)
    start = np.array([m[i][2] for i in ids.tolist()], np.int64)
    at = np.minimum(np.searchsorted(ids, seq), max(len(ids) - 1, 0))
    paired = ids[at] == seq if len(ids) else np.zeros(len(seq), bool)
    code[~paired] = _CODE["unmatched"]
    outside = paired & ~valid
    if len(ids):
        code[outside & (pos < start[at])] = _CODE["before_run"]
        code[outside & (pos >= start[at])] = _CODE["past_run"]
    # the first row of each key pairs (match_rows: np.unique's first index), the others repeat it
    iv = np.nonzero(valid)[0]
    _, first = np.unique(packed[iv], return_index=True)
    code[iv] = _CODE["repeated"]
    firsts = iv[first]
    theirs, their_valid = _keyed(getattr(traces, other), comp.name, getattr(maps, other))
    has = np.isin(packed[firsts], theirs[their_valid])
    code[firsts[~has]] = _CODE["no_partner"]
    # paired rows the comparison dropped: depth >= 1 rows off the token path (compare.py _filter_depth)
    deep = firsts[has & (depth[firsts] > 0)] if spec_for(comp.name).by_depth else firsts[:0]
    code[deep] = _CODE["off_path" if path_checked else "unchecked_path"]
    code[damaged] = _CODE["unreadable"]
    code[getattr(comp.match.rows, side)] = _compared_codes(comp)
    return depth, code


def _compared_codes(comp: TensorComparison) -> np.ndarray:
    """code [n] of each compared row of ``comp``: unreadable, then fail / inherited / explained /
    not judged / agree (module doc)."""
    n = len(comp.status)
    fail = comp.own_fail
    reproduced = bool(comp.stats.get("reproduced_by_reexecution"))
    inherited = comp.inherited if comp.inherited is not None else np.zeros(n, bool)
    explained = comp.explained if comp.explained is not None else np.zeros(n, bool)
    counted = comp.counted if comp.counted is not None else np.ones(n, bool)
    code = np.full(n, _CODE["agree"], np.int64)
    code[~counted] = _CODE["not_judged"]  # neither inherited nor failing (both set below): past the run
    code[explained] = _CODE["explained"]
    code[inherited] = _CODE["inherited"]
    code[fail] = _CODE["inherited" if reproduced else "fail"]  # re-execution reproduced them: inherited
    code[comp.status == UNREADABLE] = _CODE["unreadable"]
    return code


def _by_depth(depth: np.ndarray, code: np.ndarray) -> tuple[DepthRows, ...]:
    """The rows' codes counted per depth: one ``DepthRows`` per depth that holds rows."""
    if not len(depth):
        return ()
    k = len(_CODES)
    counts = np.bincount(depth * k + code, minlength=(int(depth.max()) + 1) * k).reshape(-1, k)
    out = []
    for d in np.nonzero(counts.sum(1))[0].tolist():
        c = dict(zip(_CODES, counts[d].tolist(), strict=True))
        left = {r: c[r] for r in sorted(REASONS, key=lambda r: -c[r]) if c[r]}
        out.append(DepthRows(d, int(counts[d].sum()), *(c[x] for x in COMPARED), left))
    return tuple(out)


def share(n: int, total: int) -> str:
    """``n`` of ``total`` as a whole percent that never reads as all or nothing when it is neither:
    "<1%" / ">99%" there ("100%" of rows compared with rows left out would count them as compared)."""
    if not total:
        return "0%"
    if 0 < n < total and round(100 * n / total) in (0, 100):
        return "<1%" if n < total / 2 else ">99%"
    return f"{n / total:.0%}"


__all__ = ["COMPARED", "REASONS", "DepthRows", "RowAccounting", "account", "row_codes", "share"]
