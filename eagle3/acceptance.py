"""EAGLE-3 acceptance: per-depth acceptance and mean accept length, one rule per side.

Owns the two acceptance conventions every part of specdiff uses (``record train``, the training
hooks, the diff's acceptance table, graft):

- **Serving** (SGLang 0.5.23 ``srt/speculative/eagle_utils.py:845``,
  ``accept_lens = num_correct_drafts + 1``): a verify step commits the accepted drafts plus the
  target's bonus token. Mean accept length = mean of ``accept_lens`` (bonus counted); per-depth
  acceptance at depth d (1-based) = fraction of verify steps that accepted at least d drafts.
- **Training / replay** (greedy chain verify, teacher forced): at TTT depth k (0-based) row t
  is accepted when the draft's mapped top-1 (``i + d2t[i]``, SGLang ``hot_token_id``) equals the
  target argmax label at t+1+k (the EAGLE-3 position pairing, tracer/schema.py) AND every shallower
  depth of row t was accepted (``draft.accept_cum``). Per-depth acceptance k = fraction of the
  counted rows at depth k that are cumulatively accepted; estimated mean accept length = 1 + the sum
  over depths, the serving quantity (bonus token included) a chain draft would get.

Arrays may be numpy or torch (only ``==``, ``&`` and sums are used). Imports nothing from specdiff.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["AcceptStats", "AcceptTally", "chain_accept", "from_accept_lengths"]


@dataclass(frozen=True)
class AcceptStats:
    """Acceptance of one side.

    Attributes:
        per_depth: acceptance per draft depth (index k = depth k+1 drafts, i.e. TTT step k).
        mean_accept_length: tokens committed per verify step, bonus token included.
        samples: verify steps (serving) or rows counted at depth 0 (training).
    """

    per_depth: tuple[float, ...]
    mean_accept_length: float
    samples: int


def chain_accept(top1_target, label, prev_cum=None):
    """One TTT depth of greedy chain acceptance: ``(accept, accept_cum)``.

    Args:
        top1_target: [n] int, the draft's top-1 mapped to target ids (``i + d2t[i]``).
        label: [n] int, the target argmax at t+1+k (``-100``/ignored rows compare unequal only if
            the caller masks them: pass only rows the pairing defines).
        prev_cum: [n] bool, ``accept_cum`` of the same rows at depth k-1 (None at depth 0).

    Returns:
        accept [n] bool (this depth alone) and accept_cum [n] bool (every depth <= k).
    """
    acc = top1_target == label
    return acc, (acc if prev_cum is None else prev_cum & acc)


class AcceptTally:
    """Per-depth counts of cumulatively accepted rows, summed over batches (training side).

    A depth with no counted row has acceptance 0.0: nothing was drafted there.
    """

    def __init__(self, steps: int):
        self.hit = np.zeros(steps)
        self.count = np.zeros(steps)

    def add(self, depth: int, accepted, counted=None) -> None:
        """Count rows of ``depth``: ``accepted`` bool [n]; ``counted`` bool [n] selects the rows
        that count (default all)."""
        if counted is not None:
            accepted = accepted[counted]
        self.hit[depth] += float(accepted.sum())
        self.count[depth] += float(len(accepted))

    def per_depth(self) -> tuple[float, ...]:
        return tuple(float(h / c) if c else 0.0 for h, c in zip(self.hit, self.count, strict=True))

    def mean_accept_length(self) -> float:
        """1 + the sum of the per-depth cumulative acceptance (bonus token counted)."""
        return 1.0 + sum(self.per_depth())

    def stats(self) -> AcceptStats:
        return AcceptStats(self.per_depth(), self.mean_accept_length(), int(self.count[0]) if len(self.count) else 0)


def from_accept_lengths(accept_lens, steps: int) -> AcceptStats:
    """Serving acceptance from SGLang ``accept_lens`` (accepted drafts + 1 per verify step).

    Args:
        accept_lens: [n] int, one per verify step (``verify.accept_length`` rows), n >= 1.
        steps: draft depths (``spec_steps``).
    """
    lens = np.asarray(accept_lens).reshape(-1)
    per_depth = tuple(float(((lens - 1) >= d).mean()) for d in range(1, steps + 1))
    return AcceptStats(per_depth, float(lens.mean()), len(lens))
