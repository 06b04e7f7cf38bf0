"""MoE routing near-ties: a named, legitimate difference at ``target.aux.{j}``.

On a mixture-of-experts target every layer's router picks the top-k experts of each token. Two
engines compute the router logits with different bf16 rounding (another kernel, batch shape or
summation order), so a token whose k-th and (k+1)-th expert scores are a near tie goes to
another expert on each side. That layer's output at that token then differs by far more than
bf16 noise (measured on correct pairs served on the CPU recipe: tiny Qwen3-MoE, 4 experts top-2,
``target.aux.1`` rows at max_rel 0.10; GPT-OSS rows up to 0.59), while the layer before it agrees,
and the flip is a per-token event: isolated positions, a few percent of them.

The target's own attention then carries a flipped row to the *later* rows of its sequence, in
every layer between the flip and the slot. Measured (tiny GPT-OSS, traced chain server
against ``record train``): one layer-0 near tie (seq 2 pos 13, HF float32 router logits of the 2nd
and 3rd expert 0.0007 apart) moved that row's ``target.aux.1`` (HF 3) by rel 0.39 and the next 9
rows by rel 0.05-0.06 (a 10-row run), decaying below the 0.05 limit after them; forcing that one
expert choice in a float32 transformers replay reproduces every row of the run (row 13 to rel
0.006). At ``target.aux.2`` (HF 8, after 7 more layers) such a carried perturbation also tips
neighbouring near ties (seq 1 pos 6-7, layers 6-7, margins 0.001): a flip starts a run of rows
whose tail decays. A bug at a position range (a wrong window, rope or chunk) moves its rows by a
similar amount to the end of the run instead.

``routing_flips`` names that pattern when the target is MoE (a contract fact) and every failing
row of an aux slot j >= 1 whose inputs agree fits it:

- the previous slot ``target.aux.{j-1}`` agrees at that row (the layer before the flip);
- each *event* is a flip and what attention carries from it: a run of consecutive failing
  positions of one sequence. A run of more than ``ROUTING_MAX_RUN`` rows must fade out: its last
  row at most ``ROUTING_TAIL_SHARE`` of its largest, and the next row of its sequence agrees or
  differs upstream (the next flip's row); a run right after a row that differs upstream (a flip
  at an earlier slot) decays over many more rows and need only end before its sequence does. A
  real bug at a position range (a wrong window, rope, chunk or layer) fails runs that do not
  decay, or last to the end of the sequence, or most rows;
- a run whose positions all hold one token (a token repeated, as a random target loops on one) is as
  many flips as rows, not a flip and its tail: the router sees nearly the same input at each of them,
  so a near tie at one is a near tie at the next, and each row is an event of its own (no fading, no
  agreeing row after it asked). Measured (tiny GPT-OSS chain pair on an AVX-512 Xeon): ``target.aux.2``
  seq 2 pos 66-68, token 221 repeated to the end of the sequence, at rel 0.154, 0.154, 0.155; float32
  transformers' layer-4 router margins there 0.011, 0.004, 0.012; forcing the runner-up expert at one
  position brings that row alone to rel 0.033 (the rows around it: 0.032-0.035), at all three all three;
- each row still points the same way (cosine > 0, rel error < ``ROUTING_MAX_REL``): other experts
  of the same layer, not another layer or garbage;
- they are few: at most ``ROUTING_MAX_FRAC`` events per row whose inputs agree (the target
  stage's fail fraction on an MoE target; the default bf16 one, 2 %, is below the 2.7-3.9 %
  measured on correct tiny Qwen3-MoE and GPT-OSS pairs), and at most ``ROUTING_MAX_ROWS`` of those rows
  in all: a flip never moves most rows.

Slot 0 is never named: no earlier slot shows that the layer before agreed. Those rows are
judged by the stage's tolerance as before, and, within it, the rows they feed are inherited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.eagle3.families import DENSE_JUDGED, is_moe
from specdiff.replay.diff.types import CLOSE, UNREADABLE, row_lines, serve_side
from specdiff.tracer.contract import known
from specdiff.tracer.schema import aux_name, aux_slot

#: most rows of an aux slot (of those whose inputs agree) that routing near-ties may explain
ROUTING_MAX_FRAC = 0.10
#: longest run of consecutive failing positions of one sequence that need not decay
ROUTING_MAX_RUN = 2
#: longest run of one repeated token counted as that many near ties (module doc; measured: 3 rows);
#: a longer flat run of one token is judged as any run (a bug over a looping tail stays a divergence)
ROUTING_MAX_REPEAT = 2 * ROUTING_MAX_RUN
#: a longer run is a flip and its attention-carried tail: its last row at most this share of its
#: largest (measured: 0.13-0.27 on tiny GPT-OSS; a bug's run of even rows is near 1)
ROUTING_TAIL_SHARE = 0.5
#: most rows (flips and carried tails) of those whose inputs agree that routing may explain
ROUTING_MAX_ROWS = 0.5
#: a flipped row is other experts' output of the same layer: related to the right row
ROUTING_MAX_REL = 1.0

#: why slot 0's failing rows are never named routing near-ties (for the report)
SLOT0_WHY = ("slot 0 has no earlier aux slot to show that the layer before the flip agreed, so its rows are "
             "judged by the stage's tolerance")


@dataclass(frozen=True)
class TargetFamily:
    """What the contracts say about the target's routing.

    Attributes:
        architecture: HF architecture name, or None when neither side recorded it.
        moe: True (routes tokens to experts), False (dense), None (unknown).
        num_experts, experts_per_token: routed experts and top-k, where recorded.
        source: the side label whose contract said it, or ``"unknown"``.
    """

    architecture: str | None
    moe: bool | None
    num_experts: int | None
    experts_per_token: int | None
    source: str

    def words(self) -> str:
        """``Qwen3MoeForCausalLM, 4 experts, top-2 (serving contract)`` or ``target family unknown``."""
        if self.moe is None and self.architecture is None:
            return "target family unknown (no target_architecture / target_num_experts in either contract)"
        parts = [self.architecture or "architecture not recorded"]
        if self.num_experts:
            parts.append(f"{self.num_experts} experts")
        if self.experts_per_token:
            parts.append(f"top-{self.experts_per_token}")
        kind = {True: "MoE", False: "dense", None: "MoE unknown"}[self.moe]
        return f"{', '.join(parts)} ({kind}; {self.source} contract)"


def _int(v) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def target_family(traces, labels) -> TargetFamily:
    """The target family from the contracts (``traces``/``labels``: ``Pair``): the serving side's
    facts first (the live contract reads the loaded model), then the training side's."""
    order = [(traces.y, labels.y), (traces.x, labels.x)]
    if serve_side(traces) == "x":
        order.reverse()
    for trace, label in order:
        c = trace.contract
        arch = known(c, "target_architecture")
        n, k = _int(known(c, "target_num_experts")), _int(known(c, "target_experts_per_token"))
        if arch is None and n is None:
            continue
        if n is not None:
            moe = n > 1 and (k is None or k < n)
        elif "target_num_experts" in c and c["target_num_experts"] is None:
            moe = False  # recorded as null: the recorder read a dense config (tracer/contract.py moe_routing_facts)
        else:
            a = str(arch)
            # the contract names the architecture but not its expert counts: the one target-family
            # table says (eagle3/families.py, which cites SGLang 0.5.23's model files)
            moe = True if is_moe(a) or "Moe" in a else False if a in DENSE_JUDGED else None
        return TargetFamily(str(arch) if arch is not None else None, moe, n, k, label)
    return TargetFamily(None, None, None, None, "unknown")


def eligible(name: str, family: TargetFamily) -> bool:
    """Whether failing rows of tensor ``name`` may be routing near-ties (an aux slot j >= 1 of an
    MoE target)."""
    j = aux_slot(name)
    return bool(family.moe) and j is not None and j >= 1


def bound(tolerance) -> float:
    """The fail fraction routing near-ties may explain at an eligible slot (never below the
    stage's own)."""
    return max(ROUTING_MAX_FRAC, tolerance.max_fail_frac)


@dataclass(frozen=True)
class RoutingFlips:
    """Rows of one aux slot explained as MoE routing near-ties (JSON-safe).

    Attributes:
        tensor: ``target.aux.{j}``; previous: ``target.aux.{j-1}`` (agrees at every row).
        rows: ``[{"seq", "pos", "rel", "cos"}]`` of every explained row (aligned keys).
        fraction: events (runs of consecutive positions: a flip and its carried tail) / rows whose
            inputs agree; bound: ``ROUTING_MAX_FRAC`` used.
        max_rel: the largest relative error among them; longest_run: their longest run of
            consecutive positions in one sequence; events: the number of runs, a run that repeats one
            token counted row by row (module doc); repeated: the rows of such runs.
        family: ``TargetFamily.words()``.
    """

    tensor: str
    previous: str
    rows: list
    fraction: float
    bound: float
    max_rel: float
    longest_run: int
    family: str
    events: int = 0
    repeated: int = 0

    @property
    def cause(self) -> str:
        return "moe_routing_near_tie"

    @property
    def message(self) -> str:
        where = (f"at isolated positions (longest run {self.longest_run})" if self.longest_run <= ROUTING_MAX_RUN
                 else f"in {self.events} events: a flip (at this slot or an earlier one) and the rows after it that the "
                      f"target's attention carries it to (longest run {self.longest_run})")
        if self.repeated:
            where += f"; {self.repeated} of them repeat one token, each its own near tie"
        return (f"MoE routing near-tie: {len(self.rows)} {self.tensor} row(s) ({self.fraction:.1%} events per row "
                f"whose inputs agree, at most {self.bound:.0%} allowed) differ where {self.previous} agrees, {where}, "
                f"max_rel {self.max_rel:.3g}: bf16 near-ties in the router send these tokens to other experts on "
                f"the two sides [{self.family}]")

    def evidence(self, limit: int = 8) -> list[str]:
        return row_lines(self.rows, lambda r: f"seq {r['seq']} pos {r['pos']}: rel {r['rel']:.3g}, cos {r['cos']:.4f}",
                         limit)


def _runs(pair: np.ndarray, pos: np.ndarray) -> list[np.ndarray]:
    """Runs of consecutive positions within one pair: index arrays into rows sorted by (pair, pos)."""
    if not len(pair):
        return []
    step = (np.diff(pair) == 0) & (np.diff(pos) == 1)
    return np.split(np.arange(len(pair)), np.nonzero(~step)[0] + 1)


def _one_token_runs(runs: list[np.ndarray], pair: np.ndarray, pos: np.ndarray,
                    tokens: dict[int, np.ndarray]) -> tuple[list[np.ndarray], int]:
    """``runs`` (index arrays into rows sorted by (pair, pos)) with every run longer than
    ``ROUTING_MAX_RUN``, and at most ``ROUTING_MAX_REPEAT`` long, whose positions all hold one token split
    into its rows, one event each (module
    doc), and how many rows were split. ``tokens``: aligned pair -> serving's tokens by aligned position;
    a run of a pair without them, or past them, stays whole."""
    out, repeated = [], 0
    for r in runs:
        seq = tokens.get(int(pair[r[0]]))
        p = pos[r]
        if ROUTING_MAX_RUN < len(r) <= ROUTING_MAX_REPEAT and seq is not None and p.min() >= 0 \
                and p.max() < len(seq) and (seq[p] == seq[p[0]]).all():
            out += [r[i:i + 1] for i in range(len(r))]
            repeated += len(r)
        else:
            out.append(r)
    return out, repeated


def _undecayed(runs: list[np.ndarray], rel: np.ndarray, after_agrees: np.ndarray,
               after_upstream: np.ndarray) -> tuple[np.ndarray, str] | None:
    """The first run longer than ``ROUTING_MAX_RUN`` that does not fade out, and how: its last row
    above ``ROUTING_TAIL_SHARE`` of its largest (``rel`` per sorted row), or no agreeing row after
    it in its sequence (``after_agrees`` per sorted row); None when every run fades out.

    A run that starts right after a row differing upstream (``after_upstream`` per sorted row: a flip
    at an earlier slot, which this slot inherits) need not fall to that share: it is the earlier
    flip carried by the target's attention through every layer between the two slots, and decays
    over many more rows. Measured (a correct DeepSeek-V3 pair, ``make test-seeds``): a layer flip at
    ``target.aux.1`` seq 3 pos 17 (rel 0.82) left the next rows at 0.035 there and at 0.062, 0.056,
    ..., 0.055 (6 rows over 0.05), then 0.045-0.036 over 16 more at ``target.aux.2``. It must still
    end before its sequence does. (A short run of one repeated token reaches here split into single
    rows, ``_one_token_runs``: each its own near tie, with no tail to fade.)"""
    for r in runs:
        if len(r) <= ROUTING_MAX_RUN:
            continue
        if rel[r[-1]] > ROUTING_TAIL_SHARE * rel[r].max() and not after_upstream[r[0]]:
            return r, (f"its last row is at rel {float(rel[r[-1]]):.3g} of a largest {float(rel[r].max()):.3g}, more "
                       f"than {ROUTING_TAIL_SHARE:g} of it")
        if not after_agrees[r[-1]]:
            return r, "no agreeing row of its sequence follows it"
    return None


def _next_agrees(comp, idx: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """bool per row ``idx``: the row at the next position of its pair was compared and passed, or
    differs for an upstream reason (not ``counted``: inherited, e.g. the next flip's row)."""
    m = comp.match
    ok = (comp.status <= CLOSE) | (~counted & (comp.status != UNREADABLE))
    keys = (m.pair[ok].astype(np.int64) << 32) | m.pos[ok].astype(np.int64)
    nxt = (m.pair[idx].astype(np.int64) << 32) | (m.pos[idx].astype(np.int64) + 1)
    return np.isin(nxt, keys)


def _after_upstream(comp, idx: np.ndarray, counted: np.ndarray, carried: dict[int, int]) -> np.ndarray:
    """bool per row ``idx``: the row at the previous position of its pair differs for an upstream
    reason (compared, failed, not ``counted``: its inputs differ), or the row is the first extended
    position of a pair whose radix-cached prefix carries an explained flip (``carried``: pair -> that
    position; judge/prefix_carry.py)."""
    m = comp.match
    up = ~counted & (comp.status > CLOSE) & (comp.status != UNREADABLE)
    keys = (m.pair[up].astype(np.int64) << 32) | m.pos[up].astype(np.int64)
    prev = (m.pair[idx].astype(np.int64) << 32) | (m.pos[idx].astype(np.int64) - 1)
    first = np.array([carried.get(int(p), -1) for p in m.pair[idx]], np.int64)
    return np.isin(prev, keys) | (m.pos[idx].astype(np.int64) == first)


def routing_flips(comp, previous, family: TargetFamily, candidates: np.ndarray,
                  counted: np.ndarray, carried: dict[int, int] | None = None,
                  tokens: dict[int, np.ndarray] | None = None) -> RoutingFlips | str | None:
    """The routing near-ties that explain ``candidates`` (bool [n]: the failing rows of
    ``comp``, a ``target.aux.{j}`` comparison, whose inputs agree); when any of them does not fit
    (module doc) nothing is explained and the answer is why, in words (for the report); None when
    the tensor is not eligible or nothing fails.

    ``previous``: the comparison of ``target.aux.{j-1}`` (None: not compared, nothing is
    explained); ``counted``: bool [n], the rows whose inputs agree (the fraction's denominator);
    ``carried``: pair -> its first extended position, for pairs whose radix-cached prefix carries an
    explained flip of another sequence (judge/prefix_carry.py); ``tokens``: aligned pair -> serving's
    tokens by aligned position (judge/prefix_carry.py ``CachedPrefixes.tokens``), to tell a run that
    repeats one token.
    """
    if not eligible(comp.name, family) or previous is None or not candidates.any():
        return None
    m = comp.match
    idx = np.nonzero(candidates)[0]
    idx = idx[np.lexsort((m.pos[idx], m.pair[idx]))]  # by (pair, pos): runs are consecutive rows
    readable = int((counted & (comp.status != UNREADABLE)).sum())
    whole = _runs(m.pair[idx], m.pos[idx])
    runs, repeated = _one_token_runs(whole, m.pair[idx], m.pos[idx], tokens or {})
    frac = len(runs) / readable if readable else 1.0
    if comp.nonfinite[idx].any():
        return "non-finite rows"
    if frac > bound(comp.tolerance):
        return (f"{len(idx)} rows in {len(runs)} runs ({frac:.1%} of the rows whose inputs agree) fail, more than "
                f"the {bound(comp.tolerance):.0%} routing near-ties may explain")
    if len(idx) > ROUTING_MAX_ROWS * readable:
        return (f"{len(idx)} of {readable} rows whose inputs agree fail: more than {ROUTING_MAX_ROWS:.0%}, a routing "
                "flip never moves most rows")
    if (comp.score[idx] >= ROUTING_MAX_REL).any() or (comp.cos[idx] <= 0).any():
        return f"some rows are unrelated to the other side's (rel >= {ROUTING_MAX_REL:g} or cosine <= 0)"
    # the previous slot must have agreed at every one of these rows
    pm = previous.match
    pkeys = (pm.pair.astype(np.int64) << 32) | pm.pos.astype(np.int64)
    keys = (m.pair[idx].astype(np.int64) << 32) | m.pos[idx].astype(np.int64)
    order = np.argsort(pkeys)
    at = np.searchsorted(pkeys[order], keys)
    found = at < len(pkeys)
    at = np.minimum(at, max(len(pkeys) - 1, 0))
    if not len(pkeys) or not (found & (pkeys[order][at] == keys)).all():
        return f"{previous.name} has no row at some of them"
    if (previous.status[order][at] > 1).any():  # DIVERGED or UNREADABLE there
        return f"{previous.name} already differs (or is unreadable) at some of them"
    run = max(len(r) for r in whole)
    flat = _undecayed(runs, comp.score[idx], _next_agrees(comp, idx, counted), _after_upstream(comp, idx, counted, carried or {}))
    if flat is not None:
        r, how = flat
        i, j = idx[r[0]], idx[r[-1]]
        return (f"they form a run of {len(r)} consecutive positions (seq {int(m.pair[i])} pos {int(m.pos[i])}-"
                f"{int(m.pos[j])}) that does not fade out: {how} (a near-tie flips a token, and what the "
                "target's attention carries from it to the next rows fades)")
    rows = [{"seq": int(m.pair[i]), "pos": int(m.pos[i]), "rel": float(comp.score[i]), "cos": float(comp.cos[i])}
            for i in idx]
    j = aux_slot(comp.name)
    return RoutingFlips(comp.name, aux_name(j - 1), rows, frac, bound(comp.tolerance),
                        float(comp.score[idx].max()), run, family.words(), len(runs), repeated)


class RoutingJudge:
    """``routing_flips`` as a judge (judge/__init__.py ``JUDGES``): at an aux slot j >= 1 of an MoE
    target, with the previous slot's comparison; why the rows were not named, when not, goes to the
    tensor's ``stats["routing_not_named"]``."""

    def applies(self, name: str, scene) -> bool:
        return eligible(name, scene.family)

    def watch_frac(self, tolerance) -> float:
        return bound(tolerance)

    def bind(self, name: str, scene):
        previous = scene.comparisons.get(aux_name(aux_slot(name) - 1))
        family, counted = scene.family, scene.counted
        prefixes = scene.prefixes
        carried = ({p: at for p, (at, _) in prefixes.carried_starts(scene.upstream).items()} if prefixes is not None
                   else {})
        tokens = prefixes.tokens if prefixes is not None else {}

        def judge(comp, candidates):
            got = routing_flips(comp, previous, family, candidates, counted, carried, tokens)
            if isinstance(got, str):
                comp.stats["routing_not_named"] = got
                comp.stats["routing_family"] = family.words()  # the report names the family without reading contracts
                return None
            return got
        return judge


__all__ = ["RoutingJudge", "TargetFamily", "RoutingFlips", "target_family", "routing_flips", "eligible", "bound",
           "SLOT0_WHY", "ROUTING_MAX_FRAC", "ROUTING_MAX_RUN", "ROUTING_MAX_REL",
           "ROUTING_TAIL_SHARE", "ROUTING_MAX_ROWS"]
