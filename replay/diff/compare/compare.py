"""Compare every canonical tensor present on both sides, row by row, block by block.

Rows at draft depth k > 0 are compared only where both sides fed the draft the same input tokens
at depths 0..k of that position: serving drafts from its own guesses, training is
teacher-forced, so elsewhere the inputs differ by design and a difference proves nothing.
Tensors are compared in dataflow order, rows in order, in blocks on every core (replay/diff/compare/blocks.py);
memory stays bounded by the blocks in flight (``blocks.in_flight``, ~16 MiB of float32 a side each)
plus small per-row results. The first divergence is said as soon as the rows read prove it
(replay/diff/compare/early.py), before the totals.

A tensor is judged on the rows whose inputs agree: a row whose inputs already differ at an
earlier stage of the same position (beyond that stage's noise) is inherited, not a new
divergence (replay/diff/judge/inherited.py), and failing rows a legitimate difference explains
(e.g. an MoE target's routing near-ties) are named, not counted: the first judge of
replay/diff/judge/__init__.py ``JUDGES`` that applies to the tensor decides which.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from specdiff.replay.diff.align.align import match_rows, pack_keys
from specdiff.replay.diff.compare import blocks
from specdiff.replay.diff.compare.early import FirstDivergenceWatch, divergence_key
from specdiff.replay.diff.compare.fed_path import FED, fed_path_keys
from specdiff.replay.diff.judge import Judging, Scene, groups, inherited, judging_for, routing, shift
from specdiff.replay.diff.judge.prefix_carry import CachedPrefixes
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.measure.tolerance import (
    Tolerance,
    apply_overrides,
    compute_dtype,
    default_tolerance,
)
from specdiff.replay.diff.types import (
    CLOSE,
    DIVERGED,
    MATCH,
    UNREADABLE,
    Alignment,
    Pair,
    RowMatch,
    TensorComparison,
    side_labels,
)
from specdiff.tracer.schema import aux_slot, ordered, probe_index, spec_for


def _token_path_keys(traces: Pair, m: RowMatch) -> np.ndarray:
    """Packed (pair, pos, depth) keys whose input tokens agree at every depth 0..depth, from the
    aligned rows ``m`` of ``tokens`` (sorted by (pair, pos, depth), as ``match_rows`` gives them)."""
    same = traces.x.take("tokens", m.rows.x).reshape(-1) == traces.y.take("tokens", m.rows.y).reshape(-1)
    group = pack_keys(m.pair, m.pos, np.zeros_like(m.depth))
    start = np.r_[True, group[1:] != group[:-1]] if len(group) else np.zeros(0, bool)
    first = np.maximum.accumulate(np.where(start, np.arange(len(group)), 0))
    rank = np.arange(len(group)) - first
    bad = (~same | (m.depth != rank)).astype(np.int64)
    cum = np.cumsum(bad)
    bad_so_far = cum - (cum[first] - bad[first])  # bad rows from the group's start through this row
    keep = bad_so_far == 0
    return pack_keys(m.pair[keep], m.pos[keep], m.depth[keep])


def _filter_depth(m: RowMatch, good: np.ndarray | None) -> RowMatch:
    keep = m.depth == 0
    if good is not None:
        keep |= np.isin(pack_keys(m.pair, m.pos, m.depth), good)
    if keep.all():
        return m
    dropped = int((~keep).sum())
    return RowMatch(m.rows.map(lambda r: r[keep]), m.pair[keep], m.pos[keep], m.depth[keep],
                    Pair(m.only.x + dropped, m.only.y + dropped))


def compare_tensor(traces: Pair, alignment: Alignment, name: str, *, tolerance: Tolerance,
                   good_paths: np.ndarray | None, block_rows: int = 1 << 16, match: RowMatch | None = None,
                   watch=None, on_rows=None, on_partial=None, runner=None,
                   judging: Judging | None = None) -> TensorComparison:
    """Compare tensor ``name`` over its aligned rows (see module doc for depth > 0 rows).

    Blocks of ``block_rows`` rows (at most ~16 MiB of float32 a side) are compared on the block
    pool (replay/diff/compare/blocks.py), a few in flight at once, and consumed in row order: ``watch``
    (early.FirstDivergenceWatch) sees each block's failing rows as they arrive, ``on_rows(n)``
    counts the rows done. ``match``: the aligned rows, when the caller already has them.
    ``on_partial(TensorComparison)``: called once when ``watch`` proves the first divergence while
    this tensor's rows are read, with the rows compared so far (status -1 on rows not read yet).
    ``runner``: where blocks are compared (``blocks.LocalBlocks``, the default, or
    ``blocks.ExecutorBlocks`` for Dask workers); the results are the same either way.

    ``judging`` (replay/diff/judge/__init__.py ``Judging``; None: every row counts, no judge):
    ``counted``: bool [n], the rows whose inputs agree (replay/diff/judge/inherited.py), the only ones
    that judge the tensor (None: all); ``inheritance``: ``Inheritance.inherited``'s (mask, source
    index, names), kept for the report. ``judge(comp, candidates)``: a named legitimate cause
    for the counted failing rows ``candidates`` (bool [n]), e.g. ``routing.routing_flips``, or
    None; it explains all of them or none, before the verdict is final. ``watch_frac``: the fail
    fraction the early watch proves a divergence above (the largest any ``judge`` may explain).
    ``row_groups``: the structural groups of the rows (groups.row_groups; None: not group-judged):
    a float tensor under its fail fraction diverges when its failures concentrate in one of them
    (groups.concentrated), decided before ``watch`` sees the comparison. ``context_rows``: bool [n],
    counted rows after an earlier differing cached row of their sequence (context.attributed_rows):
    they do not set ``limit_use`` (None: every counted row does).
    """
    spec = spec_for(name)
    j = judging or Judging()
    counted, judge, row_groups = j.counted, j.judge, j.row_groups
    m = match if match is not None else tensor_match(traces, alignment, name, good_paths=good_paths)
    n = len(m.pair)
    score = np.zeros(n, np.float32)
    cos = np.ones(n, np.float32)
    exact = np.zeros(n, bool)
    nonfinite = np.zeros(n, bool)
    unread = np.zeros(n, bool)
    max_abs = 0.0
    worst = None
    worst_score = -1.0
    if counted is not None and counted.all():
        counted = None
    if watch is not None:
        watch.start(name, tolerance, m, counted=counted, max_frac=j.watch_frac)
    step = blocks.block_rows(traces.x, name, block_rows)
    for r in _blocks_in_order(traces, name, spec.kind, m, step, runner or blocks.LocalBlocks()):
        a, b = r.a, r.b
        score[a:b], cos[a:b], exact[a:b], nonfinite[a:b], unread[a:b] = r.score, r.cos, r.exact, r.nonfinite, r.unread
        max_abs = max(max_abs, r.max_abs)
        if r.worst is not None and r.worst[0] > worst_score:
            worst_score, i, e_idx, vx, vy = r.worst
            worst = {"row": a + i, "pair": int(m.pair[a + i]), "pos": int(m.pos[a + i]),
                     "depth": int(m.depth[a + i]), "element": e_idx, "x": vx, "y": vy}
        if on_rows is not None:
            on_rows(b - a)
        if watch is not None:
            proven = watch.first is not None
            watch.block(a, b, _fails(spec.kind, tolerance, r.score, r.cos, r.nonfinite) & ~r.unread, r.nonfinite)
            if on_partial is not None and not proven and watch.first is not None:
                on_partial(_partial(name, tolerance, m, b, score, cos, exact, nonfinite, unread, spec.kind,
                                    diverged=watch.first.name == name))
    fail = _fails(spec.kind, tolerance, score, cos, nonfinite)
    fail &= ~unread
    exact &= ~unread
    status = np.where(unread, UNREADABLE, np.where(fail, DIVERGED, np.where(exact, MATCH, CLOSE))).astype(np.int8)
    readable = n - int(unread.sum())
    fail_frac = float(fail.sum()) / readable if readable else 0.0
    own = fail & (counted | nonfinite) if counted is not None else fail
    counted_readable = int((counted & ~unread).sum()) if counted is not None else readable
    stats = {"rows": n, "fail_rows": int(fail.sum()), "fail_frac": fail_frac, "coverage": m.coverage,
             "nonfinite_rows": int(nonfinite.sum()), "exact_rows": int(exact.sum()),
             "unreadable_rows": int(unread.sum())}
    shifts = [blocks.recorded_shift(traces.x, name), blocks.recorded_shift(traces.y, name)]
    if shifts[0] != shifts[1]:  # compared after removing each side's (compare/blocks.py RECORDED_SHIFTS)
        stats["recorded_shift"] = shifts
    if spec.kind == "float":
        finite = ~nonfinite & ~unread
        stats.update(max_abs=max_abs, max_rel=float(score[finite].max()) if finite.any() else float("nan"),
                     mean_rel=float(score[finite].mean()) if finite.any() else float("nan"),
                     min_cos=float(cos[finite].min()) if finite.any() else float("nan"))
    else:
        stats.update(match_rate=float(exact.sum()) / readable if readable else 1.0,
                     topk_overlap=float((1 - score[~unread]).mean()) if readable else 1.0)
    inh, src, names = j.inheritance if j.inheritance is not None else (None, None, [])
    comp = TensorComparison(name, tolerance, m, status, score, cos, nonfinite, stats, worst, False,
                            counted=counted, inherited=inh, inherited_src=src, inherited_names=list(names))
    if judge is not None and own.any():
        comp.explanation = judge(comp, own & ~nonfinite)
        if comp.explanation is not None:
            # a cause that names only some rows (judge/topk_ties.py, the target's greedy token) says which
            some = getattr(comp.explanation, "explains", lambda _c: None)(comp)
            comp.explained = own & ~nonfinite & (some if some is not None else True)
            own = own & ~comp.explained
    own_frac = float(own.sum()) / counted_readable if counted_readable else 0.0
    comp.diverged = bool(readable) and (own_frac > tolerance.max_fail_frac or bool(nonfinite.any()))
    if row_groups and readable and not comp.diverged:
        usable = (counted if counted is not None else np.ones(n, bool)) & ~unread
        comp.concentration = groups.concentrated(comp, row_groups, own & usable, usable)
        comp.diverged = comp.concentration is not None and comp.concentration.fired
    if j.noise_floor is not None and spec.kind == "float":
        shift.judge_shift(comp, unread, j.context_rows, j.noise_floor)
    stats.update(_inheritance_stats(comp, own, counted_readable, own_frac, spec.kind, j.context_rows))
    if watch is not None:
        watch.finished(comp)
    return comp


def _inheritance_stats(comp: TensorComparison, own: np.ndarray, counted: int, own_frac: float, kind: str,
                       context_rows: np.ndarray | None = None) -> dict:
    """The report's numbers on which rows judged the tensor (replay/diff/judge/inherited.py): rows
    counted (inputs agree), their failing rows, rows inherited and explained, and how close the
    tensor came to its limits (``limit_use``: 1.0 = at the limit), read off the passing counted
    rows outside ``context_rows`` (bool [n]; replay/diff/judge/context.py ``attributed_rows``: those
    are reported as ``context_rows`` / ``context_max_rel`` instead)."""
    inh = comp.inherited if comp.inherited is not None else np.zeros(len(own), bool)
    explained = comp.explained if comp.explained is not None else np.zeros(len(own), bool)
    stats = {"counted_rows": counted, "own_fail_rows": int(own.sum()), "own_fail_frac": own_frac,
             "inherited_rows": int(inh.sum()), "explained_rows": int(explained.sum())}
    if inh.any():
        idx, cnt = np.unique(comp.inherited_src[inh], return_counts=True)
        stats["inherited_from"] = {comp.inherited_names[int(i)]: int(c) for i, c in zip(idx, cnt, strict=True)}
    tol = comp.tolerance
    use = {"fail_frac": own_frac / tol.max_fail_frac if tol.max_fail_frac else float(own.any())}
    if kind == "float":
        counted_rows = comp.counted if comp.counted is not None else np.ones(len(own), bool)
        passing = counted_rows & (comp.status <= CLOSE)
        if context_rows is not None:
            moved = passing & context_rows
            stats["context_rows"] = int((counted_rows & context_rows & (comp.status != UNREADABLE)).sum())
            if moved.any():
                stats["context_max_rel"] = float(comp.score[moved].max())
            passing &= ~context_rows
        if passing.any():
            worst_rel = float(comp.score[passing].max())
            use["rel"] = worst_rel / tol.rel if tol.rel else 0.0
            use["cos"] = float((1 - comp.cos[passing].min()) / (1 - tol.cos)) if tol.cos < 1 else 0.0
            stats["max_rel_passing"] = worst_rel
    stats["limit_use"] = {k: round(v, 4) for k, v in use.items()}
    return stats


def _partial(name, tolerance, m, b, score, cos, exact, nonfinite, unread, kind, *, diverged) -> TensorComparison:
    """The comparison of rows [0, b) as it stands (status -1: not compared yet; no stats)."""
    status = np.full(len(m.pair), -1, np.int8)
    fail = _fails(kind, tolerance, score[:b], cos[:b], nonfinite[:b]) & ~unread[:b]
    status[:b] = np.where(unread[:b], UNREADABLE, np.where(fail, DIVERGED, np.where(exact[:b], MATCH, CLOSE)))
    return TensorComparison(name, tolerance, m, status, score, cos, nonfinite, {}, None, diverged)


def tensor_match(traces: Pair, alignment: Alignment, name: str, *, good_paths: np.ndarray | None,
                 match: RowMatch | None = None) -> RowMatch:
    """The aligned rows of ``name`` that are compared (depth > 0 rows only on agreeing token paths);
    ``match``: ``match_rows`` of ``name``, when the caller already has it."""
    m = match if match is not None else match_rows(traces, alignment, name)
    return _filter_depth(m, good_paths) if spec_for(name).by_depth else m


def _fails(kind: str, tolerance: Tolerance, score: np.ndarray, cos: np.ndarray, nonfinite: np.ndarray) -> np.ndarray:
    """bool [n]: rows outside ``tolerance`` (float: rel or cos or non-finite; ids: overlap)."""
    if kind == "float":
        return (score > tolerance.rel) | (cos < tolerance.cos) | nonfinite
    return (1 - score) < tolerance.ids


def _blocks_in_order(traces: Pair, name: str, kind: str, m: RowMatch, step: int, runner):
    """``blocks.BlockResult`` of rows [0, n) in blocks of about ``step`` rows cut at side x's chunks
    (``blocks.block_bounds``), in row order, computed by
    ``runner`` with at most ``runner.in_flight()`` blocks outstanding (bounded memory)."""
    bounds = iter(blocks.block_bounds(traces.x, name, m.rows.x, step))
    ahead = runner.in_flight()
    queue: deque = deque()

    def submit() -> bool:
        a, b = next(bounds, (None, None))
        if a is None:
            return False
        queue.append(runner.submit(traces, name, kind=kind, rows_x=m.rows.x[a:b], rows_y=m.rows.y[a:b], a=a, b=b))
        return True

    while len(queue) < ahead and submit():
        pass
    try:
        while queue:
            r = queue.popleft().result()
            submit()
            yield r
    finally:  # a consumer that stops early (an error) leaves no block running
        for f in queue:
            f.cancel()


def add_logit_stats(traces: Pair, comps: dict[str, TensorComparison]) -> None:
    """Add argmax agreement, top-k overlap and KL (on the stored top-k) to the logits tensors."""
    ids = comps.get("draft.logits_topk.ids")
    vals = comps.get("draft.logits_topk.values")
    lse = comps.get("draft.logsumexp")
    if ids is not None and ids.stats["rows"] > ids.stats["unreadable_rows"]:
        m = _subset(ids.match, ids.status != UNREADABLE)
        ix, iy = traces.x.take(ids.name, m.rows.x), traces.y.take(ids.name, m.rows.y)
        ids.stats["argmax_agree"] = float(metrics.argmax_agreement(ix, iy).mean())
        if vals is not None and lse is not None and len(vals.match.pair) == len(ids.match.pair) == len(lse.match.pair) \
                and np.array_equal(vals.match.rows.x, ids.match.rows.x) \
                and np.array_equal(lse.match.rows.x, ids.match.rows.x):
            ok = ((vals.status != UNREADABLE) & (lse.status != UNREADABLE))[ids.status != UNREADABLE]
            rx, ry = m.rows.x[ok], m.rows.y[ok]
            kl = metrics.topk_kl(traces.x.take_float(vals.name, rx), ix[ok],
                                 traces.x.take_float(lse.name, rx).reshape(-1),
                                 traces.y.take_float(vals.name, ry), iy[ok],
                                 traces.y.take_float(lse.name, ry).reshape(-1))
            if len(kl):  # none when every row of values or logsumexp is unreadable
                ids.stats["kl_mean"], ids.stats["kl_max"] = float(kl.mean()), float(kl.max())
    full = comps.get("draft.logits")
    if full is not None and full.stats["rows"] > full.stats["unreadable_rows"]:
        m = _subset(full.match, full.status != UNREADABLE)
        fx, fy = traces.x.take_float(full.name, m.rows.x), traces.y.take_float(full.name, m.rows.y)
        full.stats["argmax_agree"] = float(metrics.full_logits_argmax_agreement(fx, fy).mean())
        kl = metrics.full_kl(fx, fy)
        full.stats["kl_mean"], full.stats["kl_max"] = float(kl.mean()), float(kl.max())


def _subset(m: RowMatch, keep: np.ndarray) -> RowMatch:
    """The rows of ``m`` where ``keep`` (bool [n]) holds, e.g. not UNREADABLE."""
    if keep.all():
        return m
    return RowMatch(m.rows.map(lambda r: r[keep]), m.pair[keep], m.pos[keep], m.depth[keep], m.only)


# Not compared row by row: constants, side-specific bookkeeping, and training-only labels; the
# target's top-k logits are evidence for its greedy token (judge/topk_ties.py): a random target's
# logits are so flat that its k-th and (k+1)-th logits tie on most rows (seed 2's GPT-OSS pair:
# 57 of 179 rows' top-8 sets differed at rank 8 with every greedy token named or agreeing)
SKIP = {"draft.d2t", "draft.accept", "draft.accept_cum", "target.logits_topk.values", "target.logits_topk.ids"}


def is_compared(name: str) -> bool:
    """Whether tensor ``name`` is compared row by row (probes and verify records are evidence only)."""
    return name not in SKIP and not name.startswith("verify.") and probe_index(name) is None


def comparable_names(traces: Pair) -> list[str]:
    """Canonical tensors present on both sides that are compared, in dataflow order."""
    common = set(traces.x.names) & set(traces.y.names)
    return [n for n in ordered(common) if is_compared(n)]


def compare_all(traces: Pair, alignment: Alignment, *, preset: str = "default",
                overrides: dict | None = None, progress=None,
                structure: list | None = None, on_first=None, on_rows=None,
                on_partial=None, runner=None, prove_context=None) -> dict[str, TensorComparison]:
    """Compare every comparable tensor, in dataflow order; ``progress(name, i, total)`` is called
    before each, ``on_rows(done, total)`` after each block (rows compared so far; ``total`` bounds
    them from above: side A's rows of every compared tensor).

    ``on_first(early.EarlyFirst)`` is called once, as soon as the first divergence is proven by
    the rows read so far (replay/diff/compare/early.py: it equals the full data's ``first_divergence``),
    or at the end when only the full data proves it; never when nothing diverges.

    ``on_partial(comps, early)``: the comparisons so far, after each tensor and when the first
    divergence is proven mid-tensor (that tensor's rows read so far), with the proven first
    divergence (``early.EarlyFirst``) or None, for views that fill in as the diff runs.

    ``prove_context(comp, idx)``: the re-run ``context.context_rows`` asks for when too few rows
    precede every differing cached row (replay/diff/judge/context_proof.py ``ContextProver``); None: none.

    ``structure`` (replay.diff.align.structure.structure_mismatches) lists tensors whose layouts differ: each
    becomes a ``structure`` finding instead of a row comparison (aux slots are not compared slot by
    slot when the slot counts differ: slot j of one side is not slot j of the other).
    """
    structure = list(structure or ())
    good, names, matched = _plan(traces, alignment, structure)
    # what a later draft step was fed is compared also where serving's own pick meant the teacher's token
    paths = {} if good is None else {FED: fed_path_keys(traces, alignment, matched["tokens"], good)}
    family = routing.target_family(traces, side_labels(traces))
    upstream = inherited.Inheritance()
    lengths = np.array([p.length for p in alignment.seq_pairs], np.int64)
    out: dict[str, TensorComparison] = {m.name: structure_comparison(traces, m, preset=preset) for m in structure}
    known = list(out.values())
    if alignment.token_formats:
        known.append(token_format_comparison(traces, alignment, None, preset=preset))
    watch = FirstDivergenceWatch(pending={n: _shallowest_depth(traces.x, n) for n in names}, known=known,
                                 on_first=on_first)
    total, done = sum(traces.x.rows(n) for n in names), 0
    grouping = groups.RowGrouping(traces, alignment)
    prefixes = CachedPrefixes.of(traces, alignment, grouping.cached)

    def rows_done(k: int) -> None:
        nonlocal done
        done += k
        on_rows(min(done, total), total)

    for i, name in enumerate(names):
        if progress:
            progress(name, i, len(names))
        spec = spec_for(name)
        tol = default_tolerance(compute_dtype(traces.x, name), compute_dtype(traces.y, name),
                                kind=spec.kind, preset=preset)
        default_frac = tol.max_fail_frac
        user_frac = apply_overrides(tol, name, overrides or {}).max_fail_frac != default_frac
        tol = apply_overrides(exact_inputs(name, tol), name, overrides or {})
        m = tensor_match(traces, alignment, name, good_paths=paths.get(name, good), match=matched.get(name))
        inh = upstream.inherited(name, m, prefixes.carried_starts(upstream) if name == inherited.TARGET_ARGMAX
                                 else None)
        counted = ~inh[0] & ~inherited.beyond_common_run(name, m, lengths)
        scene = Scene(traces, family, upstream, out, counted, prove_context, prefixes)
        judged = judging_for(name, scene, tol, m, inheritance=inh,
                         row_groups=None if user_frac else grouping.groups(name, m))
        out[name] = compare_tensor(traces, alignment, name, tolerance=tol, good_paths=paths.get(name, good), match=m,
                                   watch=watch,
                                   on_rows=rows_done if on_rows is not None else None, runner=runner,
                                   on_partial=None if on_partial is None
                                   else lambda c: on_partial({**out, c.name: c}, watch.first),
                                   judging=judged)
        if family.moe and aux_slot(name) == 0 and out[name].diverged:
            out[name].stats["routing_not_named"] = routing.SLOT0_WHY
            out[name].stats["routing_family"] = family.words()
        upstream.add(out[name], inherited.source_rows(out[name]),
                     forward=not (user_frac and _loosened(out[name], default_frac)))
        if on_partial is not None:
            on_partial(dict(out), watch.first)
    add_logit_stats(traces, out)
    if alignment.token_formats:
        out["tokens"] = token_format_comparison(traces, alignment, out.get("tokens"), preset=preset)
    watch.done()
    return {n: out[n] for n in ordered(out)}


def _loosened(comp: TensorComparison, default_frac: float) -> bool:
    """Whether ``comp`` passes only because the user raised its fail fraction: its own failing rows
    are above ``default_frac`` (replay/diff/judge/inherited.py: its rows then stand for no forward
    difference)."""
    return not comp.diverged and comp.stats.get("own_fail_frac", 0.0) > default_frac


def exact_inputs(name: str, tol: Tolerance) -> Tolerance:
    """``tokens`` admits no failing row: the draft's input tokens are not numerics. Depth-0 rows
    hold x_{t+1} of the sequence on both sides, deeper rows are compared only where both sides'
    token paths agree (``_token_path_keys``), and rows past the common token run are not counted
    (inherited.beyond_common_run): a differing counted token is a bug (e.g. one wrong token at a
    chunk boundary), however few rows it touches. Other tensors: ``tol`` unchanged."""
    return replace(tol, max_fail_frac=0.0) if name == "tokens" else tol


def _plan(traces: Pair, alignment: Alignment, structure: list) -> tuple[np.ndarray | None, list[str], dict]:
    """(token-path keys for depth > 0 rows, tensors compared row by row in dataflow order, the
    ``match_rows`` already made: name -> RowMatch)."""
    skip = {m.name for m in structure}
    if any(m.kind == "slot_count" for m in structure):
        skip |= {n for n in set(traces.x.names) | set(traces.y.names) if aux_slot(n) is not None}
    names = [n for n in comparable_names(traces) if n not in skip]
    if "tokens" in skip or "tokens" not in traces.x.names or "tokens" not in traces.y.names:
        return None, names, {}
    tokens = match_rows(traces, alignment, "tokens")
    return _token_path_keys(traces, tokens), names, {"tokens": tokens}


def _shallowest_depth(trace, name: str) -> int:
    """The smallest draft depth of ``name``'s rows on this side: no aligned row, hence no
    divergence, can be shallower (early.py rule 3). 0 for depthless tensors."""
    if not spec_for(name).by_depth or not trace.rows(name):
        return 0
    return int(trace.keys(name, columns=("depth",))["depth"].min())


def _no_rows(name: str, tol: Tolerance) -> TensorComparison:
    """A comparison of no rows (what a finding that compares nothing row by row starts from)."""
    empty = np.zeros(0, np.int64)
    stats = {"rows": 0, "fail_rows": 0, "fail_frac": 0.0, "coverage": 0.0, "nonfinite_rows": 0, "exact_rows": 0,
             "unreadable_rows": 0}
    if spec_for(name).kind != "float":
        stats.update(match_rate=1.0, topk_overlap=1.0)
    return TensorComparison(name, tol, RowMatch(Pair(empty, empty), empty, empty, empty, Pair(0, 0)),
                            np.zeros(0, np.int8), np.zeros(0, np.float32), np.zeros(0, np.float32),
                            np.zeros(0, bool), stats)


def structure_comparison(traces: Pair, mismatch, *, preset: str = "default") -> TensorComparison:
    """A ``structure`` finding as a comparison: diverged, no rows compared (the layouts differ)."""
    spec = spec_for(mismatch.name)
    dt = Pair(*(t.info(mismatch.name).dtype if mismatch.name in t.names else "bfloat16"
                for t in (traces.x, traces.y)))
    tol = default_tolerance(dt.x, dt.y, kind=spec.kind, preset=preset)
    return replace(_no_rows(mismatch.name, tol), diverged=True, kind="structure", structure=mismatch)


def token_format_comparison(traces: Pair, alignment: Alignment, base: TensorComparison | None,
                            *, preset: str = "default") -> TensorComparison:
    """``tokens`` as the first divergence of sequences that paired only by content.

    Keeps ``base`` (the row comparison of ``tokens`` on the common runs) for the grid; ``worst``
    points at the first such pair and its first differing token (its position on side A).
    """
    p = alignment.token_formats[0]
    worst = {"row": None, "pair": p.index, "pos": p.format.first_diff, "depth": 0, "element": 0,
             "x": None, "y": None}
    if base is None:
        base = _no_rows("tokens", default_tolerance("int64", "int64", kind="int", preset=preset))
    stats = dict(base.stats, token_format_pairs=len(alignment.token_formats))
    return replace(base, stats=stats, worst=worst, diverged=True, kind="tokens")


def first_divergence(comps: dict[str, TensorComparison]) -> TensorComparison | None:
    """The earliest tensor that diverged: shallowest draft depth first
    (``TensorComparison.divergence_depth``; depthless tensors and layout findings count as depth
    0), then stage order (aux slots in slot order). An embedding-half mismatch at depth 0 is thus
    reported at ``draft.attn_in``, not at depth 1's ``draft.hidden_in`` that inherits it. Within
    one stage a ``structure`` finding comes before value divergences: when the slot counts
    differ, no slot's values mean what they mean on the other side.
    """
    diverged = [c for c in comps.values() if c.diverged]
    if not diverged:
        return None

    def key(c):
        depth = 0 if c.kind in ("structure", "tokens") else c.divergence_depth
        return divergence_key(c.name, kind=c.kind, depth=depth)

    return min(diverged, key=key)


__all__ = ["compare_all", "compare_tensor", "first_divergence", "comparable_names"]
