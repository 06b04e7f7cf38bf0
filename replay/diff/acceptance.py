"""Acceptance on both sides: per-depth acceptance and mean accept length.

Serving: from ``verify.accept_length`` rows (SGLang accept_lens = accepted drafts + 1, so the mean
accept length counts the bonus token). ``meta_info.spec_accept_length`` is completion tokens /
verify steps, which also counts the token the prefill produced, so it reads slightly higher. Per-depth
acceptance d = fraction of verify steps that accepted at least d drafts.

Training: from ``draft.accept_cum`` (mapped draft argmax == target argmax at every depth <= k):
per-depth acceptance = mean over positions; estimated mean accept length = 1 + sum over depths,
what a chain draft with greedy verify would get. Only generated positions count (the draft
only drafts after the prompt), i.e. t >= prompt_len - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.align import Alignment, Pair
from specdiff.tracer.contract import known


@dataclass(frozen=True)
class Acceptance:
    """Per-depth acceptance [steps] and mean accept length for one side (None = not recorded)."""

    per_depth: tuple[float, ...] | None
    mean_accept_length: float | None
    per_sequence: dict[int, float]  # aligned pair index -> mean accept length
    samples: int


def _readable_seq(trace, name: str, seq: np.ndarray) -> np.ndarray:
    """``seq`` with -1 (no sequence) on rows in a damaged chunk, so no selection counts them."""
    bad = trace.unreadable(name, np.arange(len(seq)))
    return np.where(bad, -1, seq) if bad.any() else seq


def serving_acceptance(trace, seq_of_pair: dict[int, int]) -> Acceptance:
    """Acceptance from verify records of the aligned sequences (``seq_of_pair``: pair -> seq id)."""
    if "verify.accept_length" not in trace.names:
        return Acceptance(None, None, {}, 0)
    keys = trace.keys("verify.accept_length")
    lens = trace.read("verify.accept_length").reshape(-1)
    keys["seq"] = _readable_seq(trace, "verify.accept_length", keys["seq"])
    steps = int(known(trace.contract, "spec_steps", max(int(lens.max(initial=1)) - 1, 1)))
    per_seq, all_lens = {}, []
    for pair, seq in seq_of_pair.items():
        sel = lens[keys["seq"] == seq]
        if len(sel):
            per_seq[pair] = float(sel.mean())
            all_lens.append(sel)
    if not all_lens:
        return Acceptance(None, None, {}, 0)
    cat = np.concatenate(all_lens)
    per_depth = tuple(float(((cat - 1) >= d).mean()) for d in range(1, steps + 1))
    return Acceptance(per_depth, float(cat.mean()), per_seq, len(cat))


def training_acceptance(trace, alignment: Alignment, *, side: str) -> Acceptance:
    """Acceptance estimate from ``draft.accept_cum`` rows at generated positions."""
    if "draft.accept_cum" not in trace.names:
        return Acceptance(None, None, {}, 0)
    keys = trace.keys("draft.accept_cum")
    acc = trace.read("draft.accept_cum").reshape(-1).astype(bool)
    keys["seq"] = _readable_seq(trace, "draft.accept_cum", keys["seq"])
    steps = int(keys["depth"].max()) + 1 if len(acc) else 0
    per_seq: dict[int, float] = {}
    rows = np.zeros(len(acc), bool)
    for p in alignment.seq_pairs:
        seq = getattr(p.seq, side)
        start = getattr(p.start, side)  # content-paired sequences: the common part only
        sel = (keys["seq"] == seq) & (keys["pos"] >= start + p.prompt_len - 1) & (keys["pos"] < start + p.length - 1)
        rows |= sel
        if sel.any():
            per_seq[p.index] = 1.0 + sum(float(acc[sel & (keys["depth"] == d)].mean())
                                         for d in range(steps) if (sel & (keys["depth"] == d)).any())
    if not rows.any():
        return Acceptance(None, None, {}, 0)
    per_depth = tuple(float(acc[rows & (keys["depth"] == d)].mean()) for d in range(steps))
    return Acceptance(per_depth, 1.0 + sum(per_depth), per_seq, int((rows & (keys["depth"] == 0)).sum()))


def acceptance(traces: Pair, alignment: Alignment) -> Pair[Acceptance]:
    """Acceptance of each side, from whatever that side recorded (verify or per-depth labels)."""
    def one(trace, side):
        seq_of_pair = {p.index: getattr(p.seq, side) for p in alignment.seq_pairs}
        served = serving_acceptance(trace, seq_of_pair)
        return served if served.mean_accept_length is not None else training_acceptance(trace, alignment, side=side)
    return Pair(one(traces.x, "x"), one(traces.y, "y"))
