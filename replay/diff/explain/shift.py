"""A divergence called on a systematic shift (replay/diff/judge/shift.py): most rows well above the pair's
measured noise floor though inside the tolerance. It names no mechanism; the recorded facts that differ
(explain/contract.py, explain/differences.py) do, and come first."""

from __future__ import annotations

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.types import Explanation


def explain_shift(first) -> list[Explanation]:
    """``systematic_shift`` with the floor, the median row and the rows above the bound, when ``first``
    diverged because of its shift (and not over its fail fraction); empty otherwise."""
    if first is None or not first.shift_only:  # diverged on its failing rows: the shift adds nothing
        return []
    s = first.shift
    return [Explanation("systematic_shift", f"{first.name} is shifted by more than rounding: {s.words()}",
                        (f"measured noise floor: {s.floor:.3g} ({s.measured})",
                         f"median row rel: {s.shift:.3g} over {s.rows} rows ({s.ratio:.1f}x the floor)",
                         f"tolerance rel {first.tolerance.rel:g}: {first.stats.get('fail_rows', 0)} rows fail it"),
                        fix_of("systematic_shift"))]


__all__ = ["explain_shift"]
