"""How a narrowing's re-runs are judged against serving's rows: each stage at its measured noise.

The narrowing (rerun/narrow.py) re-runs the training draft once per substitution of serving's inputs and
asks, stage by stage, whether a run reproduces serving's rows. Both kinds of stage are judged at the noise
measured on the rows judged, never at the value tolerance alone (a shift inside 5 % is not noise):

- a float stage by its ``noise.Limit``: each failing row's floor is the pair's floor raised to the
  re-run's own error on that row between its precision and the other one;
- an id stage by ``id_ties.TieProof``: a row whose id set differs is reproduced only when the set is the
  re-run's top-k up to the row's logit noise, and that noise is capped at ``FLOOR_RATIO`` times the
  re-run's own logit error at the other precision on serving's recorded top-K ids (before: at the
  values' tolerance, so a draft whose logits are off by a shift inside it widened its own band).

Both measurements come from one re-run of ``UPSTREAM``'s inputs with the draft cast to the other precision
(``noise.other_precision``: in place, put back bit for bit).
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.judge import stage_floor
from specdiff.replay.diff.rerun import id_ties, noise
from specdiff.replay.diff.runner import LOGITS, computed_rows

__all__ = ["run_limits"]


def run_limits(plan, upstream, forward) -> tuple[dict, id_ties.TieProof]:
    """(float stage -> ``noise.Limit``, the tie proof with each row's own logit noise) for ``plan``'s
    failing rows (rerun/narrow.py ``NarrowPlan``). ``upstream``: the re-run's output on ``UPSTREAM``'s
    inputs; ``forward(model, plan, sources)``: the narrowing's forward (the other-precision run uses it on
    ``plan.upstream``). The other-precision run happens only where it is read: some float stage's pair floor
    is measured, or serving recorded top-K logits for an id stage's tie proof."""
    floats = [st for st in plan.stages if not id_ties.is_id_stage(st)]
    ids = [st for st in plan.stages if id_ties.is_id_stage(st)]
    tol = {st: plan.comparisons[st].tolerance.rel if st in plan.comparisons else 0.05 for st in floats}
    floors = plan.traces is not None and any(stage_floor(st, plan.traces) is not None for st in floats)
    other = None
    if floors or (ids and plan.ties.rows):
        with noise.other_precision(plan.model) as model:
            other = forward(model, plan, plan.upstream)
    d2t = plan.d2t[plan.upstream[2]]
    out = {}
    for st in floats:
        rb, rt, _ = plan.recorded[st]
        own = None
        if other is not None and floors:
            depth = np.full(len(rb), plan.depth)
            own = noise.row_noise(computed_rows(upstream, d2t, st, rb, rt, depth),
                                  computed_rows(other, d2t, st, rb, rt, depth))
        out[st] = (noise.limit(plan.traces, st, tol[st], own, len(rb)) if plan.traces is not None
                   else noise.Limit(tol[st], None, f"the tolerance rel <= {tol[st]:g}"))
    ties = plan.ties
    if other is not None and ids and ties.rows:
        keys = list(ties.rows)
        b, t = np.array([k[0] for k in keys], np.int64), np.array([k[1] for k in keys], np.int64)
        depth = np.full(len(keys), plan.depth)
        ties = ties.with_own_noise(keys, computed_rows(upstream, d2t, LOGITS, b, t, depth),
                                   computed_rows(other, d2t, LOGITS, b, t, depth))
    return out, ties
