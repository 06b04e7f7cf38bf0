"""Compare every canonical tensor present on both sides, row by row, block by block.

Rows at draft depth k > 0 are compared only where both sides fed the draft the same input tokens
at depths 0..k of that position: serving drafts from its own guesses, training is
teacher-forced, so elsewhere the inputs differ by design and a difference proves nothing.
Memory stays bounded by one block of rows (``block_rows``) plus small per-row results.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from specdiff.replay.diff import metrics
from specdiff.replay.diff.align import Alignment, Pair, RowMatch, match_rows, pack_keys
from specdiff.replay.diff.tolerance import Tolerance, apply_overrides, default_tolerance, looser_dtype
from specdiff.tracer.contract import known
from specdiff.tracer.schema import aux_slot, ordered, probe_index, sort_key, spec_for

MATCH, CLOSE, DIVERGED = 0, 1, 2
#: a row in a damaged chunk on either side (tracer.damage): not compared, never counted as a match
UNREADABLE = 4
STATUS_NAMES = {MATCH: "match", CLOSE: "within tolerance", DIVERGED: "diverged", UNREADABLE: "unreadable"}


@dataclass
class TensorComparison:
    """One tensor compared over its aligned rows.

    Attributes:
        name: canonical tensor name.
        tolerance: the tolerance used.
        match: which rows paired (``pair``/``pos``/``depth`` [n]).
        status: int8 [n] per row: MATCH (bit-identical), CLOSE (within tolerance), DIVERGED, or
            UNREADABLE (the row lies in a damaged chunk on either side; excluded from every stat).
        score: float32 [n] per row: relative error (float) or 1 - overlap (ids).
        cos: float32 [n] per-row cosine (float tensors; 1 for ids).
        nonfinite: bool [n] rows holding NaN/Inf on either side.
        stats: summary numbers (max_abs, max_rel, mean_rel, min_cos, match_rate, argmax_agree,
            topk_overlap, kl_mean, nonfinite_rows, rows, fail_rows, coverage, unreadable_rows);
            fractions are over the readable rows.
        worst: the worst row: its index, pair, pos, depth, element index and both values.
        diverged: fail fraction above tolerance, or any non-finite row; always True for a
            ``structure`` finding.
        kind: ``values`` (rows compared), ``structure`` (the layouts differ: no row compared,
            ``structure`` holds the replay.structure.StructureMismatch) or ``tokens`` (the token
            sequences pair only by content: ``alignment.token_formats`` say how they differ).
        structure: the StructureMismatch of a ``structure`` finding, else None.
    """

    name: str
    tolerance: Tolerance
    match: RowMatch
    status: np.ndarray
    score: np.ndarray
    cos: np.ndarray
    nonfinite: np.ndarray
    stats: dict = field(default_factory=dict)
    worst: dict | None = None
    diverged: bool = False
    kind: str = "values"
    structure: object = None

    @property
    def first_where(self) -> dict | None:
        """Where the divergence first shows: ``{"pair", "pos", "depth"}`` (aligned keys), or None
        (a ``structure`` finding has no row). A ``tokens`` finding points at the first pair whose
        token formats differ, at the first differing token."""
        if self.kind == "structure":
            return None
        if self.kind == "tokens" and self.worst is not None:
            return {k: self.worst[k] for k in ("pair", "pos", "depth")}
        i = self.first_failing_row
        if i is None:
            return None
        return {"pair": int(self.match.pair[i]), "pos": int(self.match.pos[i]), "depth": int(self.match.depth[i])}

    @property
    def divergence_depth(self) -> int | None:
        """The shallowest draft depth whose rows diverge by the tensor's rule (fail fraction above
        ``max_fail_frac`` or a non-finite row); 0 for tensors without depths; None if not diverged.

        Depth k of the draft runs after every stage of depth k-1 (its hidden_in is depth k-1's
        hidden_out), so this orders the first divergence (``first_divergence``).
        """
        if not self.diverged:
            return None
        depth = self.match.depth
        fail = self.status == DIVERGED
        for d in np.unique(depth):
            sel = depth == d
            if self.nonfinite[sel].any() or fail[sel].mean() > self.tolerance.max_fail_frac:
                return int(d)
        return int(depth[fail].min()) if fail.any() else 0

    @property
    def first_failing_row(self) -> int | None:
        """Index (into the aligned rows) of the failing row at the earliest position, then pair,
        among the rows at ``divergence_depth`` when that depth has failing rows."""
        bad = np.nonzero(self.status == DIVERGED)[0]
        if not len(bad):
            return None
        d = self.divergence_depth
        at_depth = bad[self.match.depth[bad] == d] if d is not None else bad
        bad = at_depth if len(at_depth) else bad
        order = np.lexsort((self.match.depth[bad], self.match.pair[bad], self.match.pos[bad]))
        return int(bad[order[0]])


def _token_path_keys(traces: Pair, alignment: Alignment) -> np.ndarray | None:
    """Packed (pair, pos, depth) keys whose input tokens agree at every depth 0..depth.

    None when either side did not record ``tokens``.
    """
    if "tokens" not in traces.x.names or "tokens" not in traces.y.names:
        return None
    m = match_rows(traces, alignment, "tokens")  # sorted by (pair, pos, depth)
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


def _compare_block(kind: str, name: str, x: np.ndarray, y: np.ndarray):
    """Per-row (score, cos, exact, nonfinite, max |x - y|) for one block.

    Float rows: one difference array and row dot products (no per-metric copies); NaN/Inf rows
    take the slow path (values zeroed for the metrics, |NaN - y| counted as inf).
    """
    n = len(x)
    if kind == "float":
        fx, fy = _flat(x), _flat(y)
        nx = np.sqrt(np.einsum("ij,ij->i", fx, fx))
        ny = np.sqrt(np.einsum("ij,ij->i", fy, fy))
        # A NaN/Inf element makes its row norm non-finite; only then scan elements (a finite row
        # whose squares overflow is a false candidate that the scan clears).
        bad = not (np.isfinite(nx).all() and np.isfinite(ny).all())
        nonfinite = metrics.nonfinite_rows(x, y) if bad else np.zeros(n, bool)
        bad = bool(nonfinite.any())
        if bad:
            fx, fy = _flat(np.nan_to_num(x)), _flat(np.nan_to_num(y))
            nx = np.sqrt(np.einsum("ij,ij->i", fx, fx))
            ny = np.sqrt(np.einsum("ij,ij->i", fy, fy))
        d = fx - fy
        rel = np.sqrt(np.einsum("ij,ij->i", d, d)) / np.maximum(np.maximum(nx, ny), metrics._EPS)
        both_zero = (nx < metrics._EPS) & (ny < metrics._EPS)
        cos = np.where(both_zero, 1.0, np.einsum("ij,ij->i", fx, fy) / np.maximum(nx * ny, metrics._EPS))
        if bad:
            ad = np.abs(np.nan_to_num(x, nan=np.inf) - np.nan_to_num(y, nan=-np.inf)).reshape(n, -1)
            rowmax = ad.max(1) if ad.shape[1] else np.zeros(n)
            exact = (x.reshape(n, -1) == y.reshape(n, -1)).all(1) & ~nonfinite
        else:
            rowmax = np.maximum(d.max(1), -d.min(1)) if d.shape[1] else np.zeros(n)
            exact = ~d.any(1)  # finite floats: x == y exactly when x - y == 0
        return rel.astype(np.float32), cos.astype(np.float32), exact, nonfinite, rowmax
    overlap = metrics.id_overlap(x, y)
    exact = (x.reshape(n, -1) == y.reshape(n, -1)).all(1)
    return 1 - overlap, np.ones(n, np.float32), exact, np.zeros(n, bool), None


def _flat(a: np.ndarray) -> np.ndarray:
    a = a.reshape(a.shape[0], -1)
    return a if a.dtype == np.float32 else a.astype(np.float32)


def _rows(trace, name: str, rows: np.ndarray, *, as_float: bool) -> np.ndarray:
    """``take`` / ``take_float`` of ``rows``; a contiguous ascending run is read as one slice
    (no per-row index selection), which is what aligned rows of one recorder mostly are."""
    run = len(rows) > 0 and int(rows[-1]) - int(rows[0]) + 1 == len(rows) and bool((np.diff(rows) == 1).all())
    if run and as_float:
        return trace.read(name, int(rows[0]), int(rows[-1]) + 1, as_float32=True)
    if run and trace.info(name).dtype != "bfloat16":  # read() upcasts bf16; take() keeps raw bits
        return trace.read(name, int(rows[0]), int(rows[-1]) + 1)
    return trace.take_float(name, rows) if as_float else trace.take(name, rows)


def _block_rows(trace, name: str, cap: int, budget: int = 16 << 20) -> int:
    """Rows per block: at most ``cap``, and about ``budget`` bytes of float32 per side (blocks under
    glibc's 32 MiB mmap threshold reuse freed memory instead of faulting in fresh pages)."""
    width = int(np.prod(trace.info(name).shape)) if trace.info(name).shape else 1
    return max(16, min(cap, budget // max(4 * width, 1)))


def compare_tensor(traces: Pair, alignment: Alignment, name: str, *, tolerance: Tolerance,
                   good_paths: np.ndarray | None, block_rows: int = 4096) -> TensorComparison:
    """Compare tensor ``name`` over its aligned rows (see module doc for depth > 0 rows)."""
    spec = spec_for(name)
    m = match_rows(traces, alignment, name)
    if spec.by_depth:
        m = _filter_depth(m, good_paths)
    n = len(m.pair)
    score = np.zeros(n, np.float32)
    cos = np.ones(n, np.float32)
    exact = np.zeros(n, bool)
    nonfinite = np.zeros(n, bool)
    unread = np.zeros(n, bool)
    max_abs = 0.0
    worst = None
    worst_score = -1.0
    step = _block_rows(traces.x, name, block_rows)
    as_float = spec.kind == "float"
    for a in range(0, n, step):
        b = min(a + step, n)
        x = _rows(traces.x, name, m.rows.x[a:b], as_float=as_float)
        y = _rows(traces.y, name, m.rows.y[a:b], as_float=as_float)
        s, c, e, nf, rowmax = _compare_block(spec.kind, name, x, y)
        # After the read: a read is what finds a chunk damaged.
        u = traces.x.unreadable(name, m.rows.x[a:b]) | traces.y.unreadable(name, m.rows.y[a:b])
        nf &= ~u
        score[a:b], cos[a:b], exact[a:b], nonfinite[a:b], unread[a:b] = s, c, e, nf, u
        if spec.kind == "float" and b > a and not u.all():
            max_abs = max(max_abs, float(rowmax[~u].max()))
        key = np.where(u, -np.inf, np.where(nf, np.inf, s))
        if b > a and not u.all() and float(key.max()) > worst_score:
            i = int(key.argmax())
            worst_score = float(key[i])
            fx, fy = x.reshape(b - a, -1)[i], y.reshape(b - a, -1)[i]
            if spec.kind == "float":
                bad = ~np.isfinite(fx) | ~np.isfinite(fy)
                diff = np.where(bad, np.inf, np.abs(np.nan_to_num(fx.astype(np.float64)) - np.nan_to_num(fy.astype(np.float64))))
            else:
                diff = (fx != fy).astype(np.float64)
            e_idx = int(np.argmax(diff)) if diff.size else 0
            worst = {"row": a + i, "pair": int(m.pair[a + i]), "pos": int(m.pos[a + i]),
                     "depth": int(m.depth[a + i]), "element": e_idx,
                     "x": float(fx[e_idx]) if fx.size else None, "y": float(fy[e_idx]) if fy.size else None}
    if spec.kind == "float":
        fail = (score > tolerance.rel) | (cos < tolerance.cos) | nonfinite
    else:
        fail = (1 - score) < tolerance.ids
    fail &= ~unread
    exact &= ~unread
    status = np.where(unread, UNREADABLE, np.where(fail, DIVERGED, np.where(exact, MATCH, CLOSE))).astype(np.int8)
    readable = n - int(unread.sum())
    fail_frac = float(fail.sum()) / readable if readable else 0.0
    stats = {"rows": n, "fail_rows": int(fail.sum()), "fail_frac": fail_frac, "coverage": m.coverage,
             "nonfinite_rows": int(nonfinite.sum()), "exact_rows": int(exact.sum()),
             "unreadable_rows": int(unread.sum())}
    if spec.kind == "float":
        finite = ~nonfinite & ~unread
        stats.update(max_abs=max_abs, max_rel=float(score[finite].max()) if finite.any() else float("nan"),
                     mean_rel=float(score[finite].mean()) if finite.any() else float("nan"),
                     min_cos=float(cos[finite].min()) if finite.any() else float("nan"))
    else:
        stats.update(match_rate=float(exact.sum()) / readable if readable else 1.0,
                     topk_overlap=float((1 - score[~unread]).mean()) if readable else 1.0)
    diverged = bool(readable) and (fail_frac > tolerance.max_fail_frac or bool(nonfinite.any()))
    return TensorComparison(name, tolerance, m, status, score, cos, nonfinite, stats, worst, diverged)


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


# Not compared row by row: constants, side-specific bookkeeping, and training-only labels.
SKIP = {"draft.d2t", "draft.accept", "draft.accept_cum"}


def is_compared(name: str) -> bool:
    """Whether tensor ``name`` is compared row by row (probes and verify records are evidence only)."""
    return name not in SKIP and not name.startswith("verify.") and probe_index(name) is None


def comparable_names(traces: Pair) -> list[str]:
    """Canonical tensors present on both sides that are compared, in dataflow order."""
    common = set(traces.x.names) & set(traces.y.names)
    return [n for n in ordered(common) if is_compared(n)]


def compare_all(traces: Pair, alignment: Alignment, *, preset: str = "default",
                overrides: dict | None = None, progress=None,
                structure: list | None = None) -> dict[str, TensorComparison]:
    """Compare every comparable tensor; ``progress(name, i, total)`` is called before each.

    ``structure`` (replay.structure.structure_mismatches) lists tensors whose layouts differ: each
    becomes a ``structure`` finding instead of a row comparison (aux slots are not compared slot by
    slot when the slot counts differ: slot j of one side is not slot j of the other).
    """
    structure = list(structure or ())
    skip = {m.name for m in structure}
    if any(m.kind == "slot_count" for m in structure):
        skip |= {n for n in set(traces.x.names) | set(traces.y.names) if aux_slot(n) is not None}
    good = _token_path_keys(traces, alignment) if "tokens" not in skip else None
    names = [n for n in comparable_names(traces) if n not in skip]
    out: dict[str, TensorComparison] = {m.name: structure_comparison(traces, m, preset=preset) for m in structure}
    for i, name in enumerate(names):
        if progress:
            progress(name, i, len(names))
        spec = spec_for(name)
        tol = default_tolerance(_compute_dtype(traces.x, name), _compute_dtype(traces.y, name),
                                kind=spec.kind, preset=preset)
        tol = apply_overrides(tol, name, overrides or {})
        out[name] = compare_tensor(traces, alignment, name, tolerance=tol, good_paths=good)
    add_logit_stats(traces, out)
    if alignment.token_formats:
        out["tokens"] = token_format_comparison(traces, alignment, out.get("tokens"), preset=preset)
    return {n: out[n] for n in ordered(out)}


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


def _compute_dtype(trace, name: str) -> str:
    """The looser of the stored dtype and the side's compute dtype (contract ``dtype``).

    A float32 logsumexp computed from bf16 logits carries bf16 error, so it gets bf16 tolerance.
    """
    compute = str(known(trace.contract, "dtype", "bfloat16")).replace("torch.", "")
    return looser_dtype(trace.info(name).dtype, compute)


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
        stage, sub, n = sort_key(c.name)
        depth = 0 if c.kind in ("structure", "tokens") else c.divergence_depth
        return (depth, stage, c.kind != "structure", sub, n)

    return min(diverged, key=key)


__all__ = ["TensorComparison", "compare_all", "compare_tensor", "first_divergence", "comparable_names",
           "MATCH", "CLOSE", "DIVERGED", "UNREADABLE", "STATUS_NAMES", "aux_slot"]
