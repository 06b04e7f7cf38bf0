"""Failures judged where they concentrate: a structural group of rows that fails far beyond the noise.

A tensor diverges over all its rows when more than ``max_fail_frac`` of its counted rows fail
(compare.py). Real serving bugs hit a structural subset instead: one draft depth, the requests
whose prefix hit the radix cache, the rows after a round boundary, positions past some index,
one request. Measured (SGLang 0.5.23, topk 2 / 3 steps / 6 draft tokens): the
multi-step draft attention reads another branch's depth-1 KV for re-ranked depth-2 nodes, and
exactly those rows fail (4 of ~130 depth-2 rows at rel 0.11-0.19, 0.4 % of all rows, every other
depth-2 row under 0.02) — under the 2 % allowance, while dropping the allowance flags noise rows
elsewhere. So each tensor's counted rows are also grouped by what the trace already holds
(``row_groups``) and a group is judged on its own.

The rule (``GROUP_RULE``, one place: ``concentrated``), for a float tensor that does not diverge
over all rows and whose fail fraction the user did not set (an explicit ``max_fail_frac`` is the
user's allowance for the whole stage). With N counted readable rows of which K fail (own
failing rows: counted, not explained), a group G of n rows with k failing rows **fires** when

1. ``k >= GROUP_MIN_ROWS`` (3): a pair of rows is not a pattern;
2. ``k / n > max_fail_frac``: inside the group the tensor diverges by its own rule;
3. the concentration is not chance: the hypergeometric tail ``P[X >= k]`` (n rows drawn from N
   of which K fail) times the number of groups tested (those meeting 1 and 2: Bonferroni)
   is at most ``GROUP_ALPHA``;
4. the group's failing rows are far beyond the noise floor: their smallest relative error is at
   least ``GROUP_FAR`` x the 99th percentile of the relative errors of the group's own passing
   counted rows (of the whole tensor's when the group has fewer than ``FLOOR_MIN_ROWS``): a
   structure that is merely noisier (deeper draft rows compound bf16 rounding) has its noise just
   under the tolerance and a few rows just over it; a wrong KV row sits several times above it.

Of the groups that fire, the one with the smallest tail probability is named (ties: the smaller
group, the more specific). Id tensors are not group-judged: their failing rows are discrete
near-tie flips whose concentration at deeper depths is expected (``routing.py``, ``tokens`` is
exact already).

Early first divergence (early.py): group judgement only turns a tensor that does *not* diverge
over all rows into a diverged one, and it is decided in ``compare_tensor`` before the watch sees
the full comparison (``FirstDivergenceWatch.finished``); the watch proves a running tensor only
when it diverges over all rows, where group judgement does not run. Its divergence depth is the
shallowest depth of the group's failing rows, never shallower than the tensor's shallowest
depth, so no bound the watch uses changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.types import Alignment, Pair, RowMatch, serve_side
from specdiff.tracer.contract import REQUEST_PREFILL
from specdiff.tracer.schema import spec_for

GROUP_MIN_ROWS = 3
GROUP_ALPHA = 0.01
GROUP_FAR = 2.0
FLOOR_MIN_ROWS = 20
GROUP_RULE = (f"a group of rows fires when >= {GROUP_MIN_ROWS} of its counted rows fail, its fail fraction is above "
              f"the tensor's max_fail_frac, the hypergeometric tail of that many failures in a group that size "
              f"(x groups tested) is <= {GROUP_ALPHA:g}, and its failing rows sit >= {GROUP_FAR:g}x above the "
              "99th percentile of the relative error of the group's passing rows")
#: position thresholds tried for "positions past some index" groups
POSITION_STEPS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Group:
    """One structural group of a tensor's aligned rows.

    Attributes:
        kind: ``depth``, ``seq``, ``decode`` (rows after the prefill, serving iter >= 0),
            ``positions`` (pos >= a threshold), ``cache_hit`` (requests whose prefix hit the
            radix cache, from the first uncached position).
        label: plain words, e.g. ``"depth 2"``, ``"rows of cache-hit requests"``.
        mask: bool [n] over the comparison's aligned rows.
        detail: JSON-safe facts the explanation cites (e.g. cached prefix length per seq).
    """

    kind: str
    label: str
    mask: np.ndarray
    detail: dict | None = None


@dataclass(frozen=True)
class Concentration:
    """A group in which a tensor's failures concentrate (module doc), JSON-safe but ``mask``.

    Attributes:
        tensor, group (``Group.label``), kind (``Group.kind``), rows (n counted rows in the group),
        fail_rows (k), fail_frac (k / n), rest_fail_rows / rest_rows (the rest of the counted
        rows), p (hypergeometric tail x groups tested), noise_floor (99th percentile of the
        passing rows' rel error), min_fail_rel / max_fail_rel (the group's failing rows), fired
        (the rule holds), detail (``Group.detail``), evidence_rows (``[{"seq","pos","depth","rel"}]``),
        mask (bool [n]: the group's failing rows).
    """

    tensor: str
    group: str
    kind: str
    rows: int
    fail_rows: int
    fail_frac: float
    rest_fail_rows: int
    rest_rows: int
    p: float
    noise_floor: float
    min_fail_rel: float
    max_fail_rel: float
    fired: bool
    detail: dict | None
    evidence_rows: list
    mask: np.ndarray

    @property
    def cause(self) -> str:
        """The explanation's name in reports (explain/history.py ``explain_group``)."""
        return "concentrated_rows"

    @property
    def message(self) -> str:
        """One line: where the failures concentrate, against the rest of the tensor."""
        rest = self.rest_fail_rows / self.rest_rows if self.rest_rows else 0.0
        return (f"{self.tensor} fails only on {self.group}: {self.fail_rows} of its {self.rows} rows "
                f"({self.fail_frac:.1%}) at rel {self.min_fail_rel:.3g}-{self.max_fail_rel:.3g}, against "
                f"{self.rest_fail_rows} of the other {self.rest_rows} rows ({rest:.2%}); noise floor "
                f"{self.noise_floor:.3g}, chance {self.p:.2g}")

    def margin(self) -> dict:
        """The numbers a control's report shows (how far from firing): JSON-safe."""
        return {"group": self.group, "fail_rows": self.fail_rows, "rows": self.rows, "p": self.p,
                "far": (self.min_fail_rel / self.noise_floor) if self.noise_floor else None, "fired": self.fired}


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeom_tail(k: int, N: int, K: int, n: int) -> float:
    """P[X >= k] for X ~ Hypergeometric(N rows, K failing, n drawn): the chance that a group of
    ``n`` rows holds ``k`` or more of the ``K`` failing rows when failures fall anywhere."""
    hi = min(K, n)
    if k > hi:
        return 0.0
    lo = max(k, n - (N - K), 0)
    denom = _log_comb(N, n)
    terms = [_log_comb(K, i) + _log_comb(N - K, n - i) - denom for i in range(lo, hi + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def recorded_prefill(trace) -> dict[int, dict]:
    """seq -> the serving recorder's per-request prefill facts (contract ``request_prefill``, written by
    tracer/engines/sglang/prefill.py: ``{"cached_prefix": int | "unknown", "chunks": [[start, length],
    ...]}``), matched through each sequence's rid; empty when the trace does not hold them (another
    recorder, an older trace, a server killed before it closed the trace)."""
    facts = (trace.contract or {}).get(REQUEST_PREFILL)
    if not isinstance(facts, dict) or not facts:
        return {}
    out = {}
    for seq in getattr(trace, "sequences", None) or ():
        f = facts.get(str(seq.rid))
        if isinstance(f, dict):
            out[seq.id] = f
    return out


def chunk_ends(traces, alignment, serve_attr: str) -> dict[int, list[int]]:
    """pair -> aligned positions of the last row of each non-final prefill chunk of the serving request
    (recorded per request, ``recorded_prefill``): the rows whose draft input token is the first token
    of the next chunk. Empty when nothing was recorded or no request was prefilled in chunks."""
    rec = recorded_prefill(getattr(traces, serve_attr))
    out: dict[int, list[int]] = {}
    for pair in alignment.seq_pairs:
        f = rec.get(getattr(pair.seq, serve_attr))
        chunks = (f or {}).get("chunks") or []
        start = getattr(pair.start, serve_attr)
        ends = [p + e - 1 - start for p, e in chunks[:-1] if p + e - 1 >= start]
        if ends:
            out[pair.index] = ends
    return out


def cached_prefixes(traces, alignment, serve_attr: str) -> dict[int, int]:
    """pair -> cached prefix length of the serving request, for requests whose prefix hit the radix
    cache. Recorded per request by the SGLang recorder (``recorded_prefill``: ``Req.cached_tokens`` at
    the first prefill); for a sequence without that fact (unknown, or an older trace) inferred from the
    rows: serving records target rows only for the positions it extends (attribution.py: prefill with
    prefix p writes t = p..p+e-1), so a sequence whose first ``target.aux_cat`` row (or, without target
    rows, depth-0 ``tokens`` row) lies past its aligned start had its first p positions cached (a
    chunked prefill's later chunks have a prefix too, but its first chunk starts at 0)."""
    trace = getattr(traces, serve_attr)
    rec = recorded_prefill(trace)
    name = next((n for n in ("target.aux_cat", "tokens") if n in trace.names and trace.rows(n)), None)
    first: dict[int, int] = {}
    if name is not None:
        k = trace.keys(name, columns=("seq", "pos", "depth"))
        d0 = k["depth"] == 0
        seqs, pos = k["seq"][d0].astype(np.int64), k["pos"][d0].astype(np.int64)
        order = np.lexsort((pos, seqs))
        s, p = seqs[order], pos[order]
        head = np.r_[True, s[1:] != s[:-1]] if len(s) else np.zeros(0, bool)
        first = dict(zip(s[head].tolist(), p[head].tolist(), strict=True))
    out = {}
    for pair in alignment.seq_pairs:
        sid, start = getattr(pair.seq, serve_attr), getattr(pair.start, serve_attr)
        cached = (rec.get(sid) or {}).get("cached_prefix")
        p0 = cached if isinstance(cached, int) and not isinstance(cached, bool) else first.get(sid)
        if p0 is not None and p0 > start:
            out[pair.index] = int(p0 - start)
    return out


def row_groups(match, *, iters: np.ndarray | None, prompt_lens: dict[int, int],
               cached: dict[int, int]) -> list[Group]:
    """The structural groups of a tensor's aligned rows (``match``: RowMatch, n rows).

    ``iters``: int [n], serving's decode iteration of each row (-1 prefill), or None;
    ``prompt_lens``: pair -> prompt length; ``cached``: ``cached_prefixes``. A group is listed
    only when it splits the rows (neither empty nor all of them)."""
    n = len(match.pair)
    out: list[Group] = []

    def add(kind, label, mask, detail=None):
        k = int(mask.sum())
        if 0 < k < n:
            out.append(Group(kind, label, mask, detail))

    for d in np.unique(match.depth):
        add("depth", f"depth {int(d)}", match.depth == d)
    for p in np.unique(match.pair):
        add("seq", f"seq {int(p)}", match.pair == p)
    if iters is not None:
        add("decode", "rows after the first round boundary (decode iterations)", iters >= 0)
    else:
        plen = np.array([prompt_lens.get(int(p), 0) for p in match.pair], np.int64)
        add("decode", "generated positions (after the prompt)", match.pos >= plen)
    top = int(match.pos.max()) if n else 0
    for step in POSITION_STEPS:
        if step < top:
            add("positions", f"positions >= {step}", match.pos >= step)
    if cached:
        start = np.array([cached.get(int(p), -1) for p in match.pair], np.int64)
        detail = {"cached_prefix": {str(k): v for k, v in sorted(cached.items())}}
        add("cache_hit", "requests whose prefix hit the radix cache (from the first uncached position)",
            (start >= 0) & (match.pos >= start), detail)
    return out


def concentrated(comp, groups: list[Group], own: np.ndarray, counted: np.ndarray) -> Concentration | None:
    """The most concentrated group of ``comp``'s failing rows (module doc), fired or not; None when
    no group holds ``GROUP_MIN_ROWS`` failing rows, or ``comp`` is not a float tensor.

    ``own``: bool [n], the counted failing rows (``TensorComparison.own_fail``); ``counted``: bool
    [n], the counted readable rows.
    """
    if spec_for(comp.name).kind != "float" or not own.any():
        return None
    N, K = int(counted.sum()), int((own & counted).sum())
    passing = counted & ~own & ~comp.nonfinite
    tested = []
    for g in groups:
        sel = g.mask & counted
        n, k = int(sel.sum()), int((own & sel).sum())
        if k < GROUP_MIN_ROWS or not n or k / n <= comp.tolerance.max_fail_frac:
            continue
        tested.append((g, n, k, hypergeom_tail(k, N, K, n)))
    if not tested:
        return None
    g, n, k, p = min(tested, key=lambda t: (t[3], t[1]))
    p = min(1.0, p * len(tested))
    bad = own & g.mask & counted
    rel = comp.score[bad]
    ref = passing & g.mask if int((passing & g.mask).sum()) >= FLOOR_MIN_ROWS else passing
    floor = float(np.percentile(comp.score[ref], 99)) if ref.any() else 0.0
    far = float(rel.min()) >= GROUP_FAR * floor
    m = comp.match
    idx = np.nonzero(bad)[0]
    order = idx[np.lexsort((m.depth[idx], m.pair[idx], m.pos[idx]))]
    ev = [{"seq": int(m.pair[i]), "pos": int(m.pos[i]), "depth": int(m.depth[i]), "rel": float(comp.score[i])}
          for i in order[:16]]
    return Concentration(comp.name, g.label, g.kind, n, k, k / n, K - k, N - n, p, floor, float(rel.min()),
                         float(rel.max()), bool(p <= GROUP_ALPHA and far), g.detail, ev, bad)


class RowGrouping:
    """The structural row groups of each tensor (``row_groups``), from serving's row keys:
    its decode iteration per row (``iter``; -1 = prefill) and the requests whose prefix hit the
    radix cache (``cached_prefixes``), read once per diff (the serving side: ``types.serve_side``)."""

    def __init__(self, traces: Pair, alignment: Alignment):
        self.traces = traces
        self.sv = serve_side(traces)
        self.prompt = {p.index: p.prompt_len for p in alignment.seq_pairs}
        self.cached = cached_prefixes(traces, alignment, self.sv)

    def groups(self, name: str, m: RowMatch) -> list | None:
        if spec_for(name).kind != "float" or not len(m.pair):
            return None
        trace = getattr(self.traces, self.sv)
        it = np.asarray(trace.keys(name, columns=("iter",))["iter"], np.int64)[getattr(m.rows, self.sv)]
        iters = it if (it >= 0).any() else None
        return row_groups(m, iters=iters, prompt_lens=self.prompt, cached=self.cached)


__all__ = ["Group", "Concentration", "RowGrouping", "row_groups", "concentrated", "cached_prefixes", "chunk_ends", "recorded_prefill",
           "hypergeom_tail",
           "GROUP_RULE", "GROUP_MIN_ROWS", "GROUP_ALPHA", "GROUP_FAR"]
