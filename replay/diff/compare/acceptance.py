"""Acceptance on both sides of a diff: per-depth acceptance and mean accept length.

Which rows count is decided here; the two rules themselves are ``specdiff.eagle3.acceptance``.

Serving: from ``verify.accept_length`` rows (SGLang accept_lens = accepted drafts + 1, so the mean
accept length counts the bonus token). ``meta_info.spec_accept_length`` is completion tokens /
verify steps, which also counts the token the prefill produced, so it reads slightly higher.

Training: from ``draft.accept_cum`` rows (chain acceptance). Only generated positions count (the
draft only drafts after the prompt), i.e. t >= prompt_len - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.eagle3.acceptance import AcceptTally, from_accept_lengths
from specdiff.replay.diff.align.align import rows_by_value
from specdiff.replay.diff.types import Alignment, Pair
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


_NONE = np.zeros(0, np.int64)  # the rows of a sequence a side did not record


def serving_acceptance(trace, seq_of_pair: dict[int, int]) -> Acceptance:
    """Acceptance from verify records of the aligned sequences (``seq_of_pair``: pair -> seq id)."""
    if "verify.accept_length" not in trace.names:
        return Acceptance(None, None, {}, 0)
    keys = trace.keys("verify.accept_length")
    lens = trace.read("verify.accept_length").reshape(-1)
    keys["seq"] = _readable_seq(trace, "verify.accept_length", keys["seq"])
    steps = int(known(trace.contract, "spec_steps", max(int(lens.max(initial=1)) - 1, 1)))
    per_seq, all_lens = {}, []
    of_seq = rows_by_value(keys["seq"])
    for pair, seq in seq_of_pair.items():
        sel = lens[of_seq.get(seq, _NONE)]
        if len(sel):
            per_seq[pair] = from_accept_lengths(sel, steps).mean_accept_length
            all_lens.append(sel)
    if not all_lens:
        return Acceptance(None, None, {}, 0)
    st = from_accept_lengths(np.concatenate(all_lens), steps)
    return Acceptance(st.per_depth, st.mean_accept_length, per_seq, st.samples)


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

    def tally(idx: np.ndarray) -> AcceptTally:
        t = AcceptTally(steps)
        depth = keys["depth"][idx]
        for d in range(steps):
            t.add(d, acc[idx], depth == d)
        return t

    of_seq = rows_by_value(keys["seq"])
    for p in alignment.seq_pairs:
        idx = of_seq.get(getattr(p.seq, side), _NONE)
        start = getattr(p.start, side)  # content-paired sequences: the common part only
        pos = keys["pos"][idx]
        idx = idx[(pos >= start + p.prompt_len - 1) & (pos < start + p.length - 1)]
        rows[idx] = True
        if len(idx):
            per_seq[p.index] = tally(idx).mean_accept_length()
    if not rows.any():
        return Acceptance(None, None, {}, 0)
    st = tally(np.flatnonzero(rows)).stats()
    return Acceptance(st.per_depth, st.mean_accept_length, per_seq, st.samples)


def acceptance(traces: Pair, alignment: Alignment) -> Pair[Acceptance]:
    """Acceptance of each side, from whatever that side recorded (verify or per-depth labels)."""
    def one(trace, side):
        seq_of_pair = {p.index: getattr(p.seq, side) for p in alignment.seq_pairs}
        served = serving_acceptance(trace, seq_of_pair)
        return served if served.mean_accept_length is not None else training_acceptance(trace, alignment, side=side)
    return Pair(one(traces.x, "x"), one(traces.y, "y"))
