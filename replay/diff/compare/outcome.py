"""Acceptance as evidence: serving's accept decisions against training's at the same verify steps.

Each serving verify step (``verify.accept_length`` at pos L: the step's root, the last committed token) is
paired with the training side's chain acceptance of the same draft: ``draft.accept_cum`` rows at pos L - 1
(the draft fed the target's hidden state at L - 1 and the root token drafts L + 1 onward; EAGLE-3's
(h_t, x_{t+1}) input pairing), one per depth. The recorders write the root's position on both engines
(SGLang 0.5.23: ``seq_lens`` before the step, tracer/engines/sglang/attribution.py ``verify.accept_length``;
vLLM 0.32.0: the verify query's first position, tracer/engines/vllm/hooks.py). Measured on the demo's
correct pairs (the fixed seed pair, chain, 3 steps): 53 of 54 SGLang steps and 29 of 30 vLLM steps accept
exactly as many drafts as training's chain at L - 1; at L - 2, L or L + 1 at most 76 %.

Per depth d (at least d drafts accepted) the paired steps give a 2x2 table; the gap is judged with the
exact two-sided McNemar test on the steps where the sides disagree (``P_LIMIT``), and shown with a
``Z``-wide interval of the paired difference. Greedy verification is assumed (the recorders keep no
sampling temperature): a sampled server's accept decisions are random. A top-k tree keeps paths a chain
does not draft, so on a tree only serving accepting less than training's chain counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.types import Alignment, Pair
from specdiff.tracer.contract import known

#: two-sided exact McNemar p-value below which a depth's gap is a verdict: a correct pair's sides disagree
#: on a few steps in either direction (near-tied argmaxes), a bug's on many in one
P_LIMIT = 1e-3
#: the interval shown beside each gap (99.9 %, two-sided normal quantile)
Z = 3.29
#: verify pos - this = training's accept_cum pos of the same draft (module doc)
ROOT_TO_TRAIN_POS = 1


@dataclass(frozen=True)
class DepthGap:
    """One depth's paired acceptance.

    Attributes:
        depth: 1-based: the steps that accepted at least ``depth`` drafts.
        steps: paired verify steps.
        serving, training: of them, how many each side accepted at this depth.
        only_serving, only_training: the discordant steps (serving yes / training no, and the reverse).
        p_value: exact two-sided McNemar p of the discordant counts.
    """

    depth: int
    steps: int
    serving: int
    training: int
    only_serving: int
    only_training: int
    p_value: float

    @property
    def gap(self) -> float:
        """Serving's acceptance minus training's, a fraction of ``steps``."""
        return (self.serving - self.training) / self.steps

    @property
    def half_width(self) -> float:
        """Half-width of the ``Z`` interval of ``gap`` (the paired difference's standard error)."""
        b, c, n = self.only_serving, self.only_training, self.steps
        return Z * math.sqrt(max(b + c - (b - c) ** 2 / n, 0.0)) / n


@dataclass(frozen=True)
class OutcomeGap:
    """Serving's acceptance against training's over the same verify steps (module doc).

    Attributes:
        labels: (serving, training) as the report names them.
        steps: verify steps paired with training rows at every depth.
        tree: serving drafted a top-k tree (only serving accepting less counts), or None when unknown.
        depths: one ``DepthGap`` per draft depth.
    """

    labels: tuple[str, str]
    steps: int
    tree: bool | None
    depths: tuple[DepthGap, ...]

    def differing(self) -> list[DepthGap]:
        """The depths whose gap is a verdict: McNemar p below ``P_LIMIT`` (on a tree: serving lower only)."""
        return [d for d in self.depths if d.p_value < P_LIMIT and (not self.tree or d.gap < 0)]

    def words(self) -> str:
        """One clause per differing depth, e.g. ``depth 3: serving 0.30, training 0.83 over the same 140
        verify steps (gap -0.53 +- 0.09)``."""
        s, t = self.labels
        return "; ".join(f"depth {d.depth}: {s} {d.serving / d.steps:.2f}, {t} {d.training / d.steps:.2f} over the "
                         f"same {d.steps} verify steps (gap {d.gap:+.2f} ± {d.half_width:.2f})"
                         for d in self.differing())


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value of ``b`` and ``c`` discordant pairs (binomial, p = 1/2); 1.0 for none."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def outcome_gap(traces: Pair, alignment: Alignment, labels: Pair) -> OutcomeGap | None:
    """The paired acceptance of a serving and a training trace; None when the pair is not one (both
    sides must hold their rows: serving ``verify.accept_length``, training ``draft.accept_cum``) or no
    verify step pairs with a training row at every depth."""
    sides = {t.side: (t, k) for t, k in ((traces.x, "x"), (traces.y, "y"))}
    if set(sides) != {"train", "serve"}:
        return None
    (train, tk), (serve, sk) = sides["train"], sides["serve"]
    if "verify.accept_length" not in serve.names or "draft.accept_cum" not in train.names:
        return None
    ak = train.keys("draft.accept_cum")
    acc = train.read("draft.accept_cum").reshape(-1).astype(bool)
    if not len(acc):
        return None
    steps = int(ak["depth"].max()) + 1
    # (training seq, pos) -> accepted drafts (leading accepted depths), for positions holding every depth;
    # vectorised: a training trace holds positions x depths rows (millions at production length)
    key = ak["seq"].astype(np.int64) << 32 | ak["pos"].astype(np.int64)
    uniq, row = np.unique(key, return_inverse=True)
    table = np.full((len(uniq), steps), -1, np.int8)
    table[row, ak["depth"].astype(np.int64)] = acc
    whole = (table >= 0).all(1)
    uniq, accepted = uniq[whole], np.cumprod(table[whole], axis=1).sum(1)
    vk = serve.keys("verify.accept_length")
    lens = serve.read("verify.accept_length").reshape(-1).astype(np.int64)
    of_serve = {getattr(p.seq, sk): p for p in alignment.seq_pairs}
    want = np.full(len(lens), -1, np.int64)  # the training key of each serving step, -1: its sequence is unpaired
    for q, sp in of_serve.items():
        sel = vk["seq"] == q
        tpos = vk["pos"][sel].astype(np.int64) - getattr(sp.start, sk) + getattr(sp.start, tk) - ROOT_TO_TRAIN_POS
        want[sel] = np.int64(getattr(sp.seq, tk)) << 32 | tpos
    if not len(uniq):
        return None
    at = np.minimum(np.searchsorted(uniq, want), len(uniq) - 1)
    hit = (want >= 0) & (uniq[at] == want)
    if not hit.any():
        return None
    got = np.stack([lens[hit] - 1, accepted[at[hit]]], axis=1)
    served = known(serve.contract, "spec_steps")  # a depth serving never drafts is no gap
    depths = []
    for d in range(1, min(steps, int(served)) + 1 if served is not None else steps + 1):
        s, t = got[:, 0] >= d, got[:, 1] >= d
        b, c = int((s & ~t).sum()), int((~s & t).sum())
        depths.append(DepthGap(d, len(got), int(s.sum()), int(t.sum()), b, c, mcnemar_p(b, c)))
    topk = known(serve.contract, "spec_topk")
    tree = None if topk is None else int(topk) > 1
    name = (labels.x, labels.y) if sk == "x" else (labels.y, labels.x)
    return OutcomeGap(name, len(got), tree, tuple(depths))
