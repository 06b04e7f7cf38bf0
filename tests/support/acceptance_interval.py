"""A correct pair's acceptance sits inside its interval: serving's accept decisions against training's chain at
the same verify steps (replay/diff/compare/outcome.py), read from the two traces as ``diff`` pairs them.

``diff`` reports the per-depth gaps only when they are its verdict ("the outcome differs", exit 1, and only
with no divergence); a correct-pair test reads them itself so that it also holds where a divergence is named
(SGLang's own re-ranked tree node bug) and says what it measured.
"""

from __future__ import annotations

from pathlib import Path

from specdiff.replay.diff.align.structure import structure_mismatches
from specdiff.replay.diff.compare.outcome import OutcomeGap, outcome_gap
from specdiff.replay.diff.pipeline import align
from specdiff.replay.diff.types import Pair, side_names
from specdiff.tracer.store import open_trace


def paired_acceptance(train: Path | str, serve: Path | str) -> OutcomeGap | None:
    """The ``OutcomeGap`` of a training and a serving trace, paired as ``diff train serve`` pairs them; None
    where the pair holds no paired verify step (compare/outcome.py ``outcome_gap``)."""
    traces = Pair(open_trace(str(train)), open_trace(str(serve)))
    labels = side_names(traces)
    alignment, _ = align(traces, structure_mismatches(traces, labels))
    return outcome_gap(traces, alignment, labels)


def outside_its_interval(gap: OutcomeGap) -> list[str]:
    """The depths whose gap is not inside its interval, in words ([] for a correct pair): the verdict's own
    test (McNemar, ``OutcomeGap.differing``), or a gap beyond its ``Z``-wide interval around 0 (on a top-k tree
    serving may accept more than training's chain: only a gap below it counts)."""
    out = [f"depth {d.depth}: differs (McNemar p {d.p_value:.1e})" for d in gap.differing()]
    for d in gap.depths:
        if d.gap < -d.half_width or (not gap.tree and d.gap > d.half_width):
            out.append(f"depth {d.depth}: gap {d.gap:+.3f} outside ± {d.half_width:.3f}")
    return out


def interval_words(gap: OutcomeGap) -> str:
    """One line per depth for a test's log: ``depth 1: serving 0.94 training 0.94 gap +0.00 ± 0.03 (1/1)``."""
    s, t = gap.labels
    return "; ".join(f"depth {d.depth}: {s} {d.serving / d.steps:.2f} {t} {d.training / d.steps:.2f} gap {d.gap:+.3f} "
                     f"± {d.half_width:.3f} ({d.only_serving}/{d.only_training} discordant, p {d.p_value:.2g})"
                     for d in gap.depths) + f" over {gap.steps} verify steps"
