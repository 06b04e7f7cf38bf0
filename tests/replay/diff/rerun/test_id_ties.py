"""Serving's draft ids against a re-run's whole logit row (replay/diff/rerun/id_ties.py).

Seed 2's tiny DeepSeek-V3 pair: the draft re-run on serving's inputs reproduced 16 of 17 failing
``draft.logits_topk.ids`` rows; the 17th kept another id at rank 8 within the row's logit noise,
and the stage was "proven" the first divergence. A set is reproduced when it is the top-k of
logits within the row's measured noise of the re-run's; a wrong lm_head moves ids far beyond it.
"""

from __future__ import annotations

import numpy as np

from specdiff.replay.diff.rerun.id_ties import measured_noise, rows_reproduced, set_reproduced, to_draft_ids

V, K = 32, 8


def _row(seed: int = 0):
    """A re-run's logit row [V] (distinct, about 1.0-2.0) and serving's top-K ids and logits."""
    rng = np.random.default_rng(seed)
    logits = (1.0 + rng.permutation(V) / V).astype(np.float32)
    top = np.argsort(-logits)[:K]
    return logits, top, logits[top].copy()


def test_a_swap_at_rank_k_within_the_measured_noise_is_reproduced():
    logits, top, vals = _row()
    kth, nxt = top[K - 1], np.argsort(-logits)[K]
    served = top.copy()
    served[K - 1] = nxt  # serving keeps the (K+1)-th id of the re-run ...
    vals = logits[served].copy()
    gap = float(logits[kth] - logits[nxt])
    vals[K - 1] += gap  # ... its logit there one gap higher: serving's noise is that gap
    assert measured_noise(logits, served, vals, rel=0.05) >= gap - 1e-6
    assert set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32")


def test_a_swap_beyond_the_measured_noise_is_not():
    logits, top, vals = _row()
    served = top.copy()
    served[K - 1] = np.argsort(-logits)[-1]  # the re-run's lowest logit, 0.7 below the boundary
    vals = logits[served].copy()  # every shared logit exact: no noise to hide it
    assert not set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32")


def test_the_band_is_capped_at_the_values_tolerance():
    """A wrong lm_head cannot widen its own band: logits twice as large are no noise (uncapped,
    the band would be a whole logit and swallow the lowest id)."""
    logits, top, vals = _row()
    far = np.argsort(-logits)[-1]
    served = top.copy()
    served[K - 1] = far
    noisy = logits[served] * 2.0
    assert measured_noise(logits, served, noisy, rel=0.05) <= 0.05 * float(np.abs(noisy).min()) + 1e-6
    assert measured_noise(logits, served, noisy, rel=10.0) > float(logits[top[K - 1]] - logits[far])
    assert not set_reproduced(logits, served, served, noisy, rel=0.05, dtype="float32")


def test_an_id_outside_serving_recorded_top_k_is_not_reproduced():
    logits, top, vals = _row()
    served = top[:2].copy()
    served[1] = np.argsort(-logits)[-1]
    assert not set_reproduced(logits, served, top, vals, rel=0.05, dtype="float32")
    assert rows_reproduced(logits[None], top[None, :2], top[None], vals[None], rel=0.05,
                           dtype="float32").tolist() == [True]


def test_target_ids_map_back_through_the_vocab_map():
    hot = np.array([3, 7, 11, 12], np.int64)  # draft id -> target id
    assert to_draft_ids(np.array([[11, 3], [12, 5]]), hot).tolist() == [[2, 0], [3, -1]]


def test_a_shift_inside_the_tolerance_is_no_band_where_the_reruns_own_noise_is_measured():
    """Serving's logits 3 % above the re-run's (a served draft that computes something else, inside the
    5 % bf16 tolerance): capped at the tolerance only, the shift is the band and an id it moved past
    the boundary reads as a tie; capped at ``FLOOR_RATIO`` times the re-run's own logit error at the
    other precision (half a bf16 step for logits in [1, 2) here), it is not reproduced."""
    from specdiff.replay.diff.judge.shift import FLOOR_RATIO

    logits, top, _ = _row()
    served = top.copy()
    nxt = np.argsort(-logits)[K]
    served[K - 1] = nxt  # the id just below the boundary, one rank-gap (1/V) under the re-run's K-th
    vals = logits[served] * 1.03
    own = 2.0 ** -8  # half a bf16 step (2^-7) for logits in [1, 2): the re-run's own bf16-vs-float32 error
    assert measured_noise(logits, served, vals, rel=0.05) > float(logits[top[K - 1]] - logits[nxt]) / 2
    assert set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32")  # the old band
    assert measured_noise(logits, served, vals, rel=0.05, own=own) == FLOOR_RATIO * own
    assert not set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32", own=own)


def test_a_correct_rows_noise_stays_inside_its_own_band():
    """The serving side's noise within the own-noise cap is the band as before: a correct row whose
    rank-K id swapped by that noise is still reproduced."""
    logits, top, _ = _row()
    served = top.copy()
    served[K - 1] = np.argsort(-logits)[K]
    gap = float(logits[top[K - 1]] - logits[served[K - 1]])
    vals = logits[served].copy()
    vals[K - 1] += gap  # serving's noise: one rank gap on one id
    assert set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32", own=gap)


def test_the_proof_measures_each_rows_own_noise_on_servings_ids_only():
    from specdiff.replay.diff.rerun.id_ties import TieProof

    logits, top, vals = _row()
    other = logits.copy()
    other[top[0]] += 0.01  # noise on one of serving's recorded ids
    other[np.argsort(-logits)[-1]] += 5.0  # far off on an id serving did not record: not its noise
    proof = TieProof({(0, 3): (top, vals)}, rel=0.05, dtype="float32").with_own_noise([(0, 3)], logits[None],
                                                                                    other[None])
    assert list(proof.own) == [(0, 3)] and abs(proof.own[(0, 3)] - 0.01) < 1e-6


def test_an_ill_conditioned_rows_own_noise_above_the_tolerance_is_its_band():
    """The Qwen3-MoE correct pair (seed 2, prompts 8-15): a rank-8 id 0.81 above serving's weakest, the
    row's own logit error at the other precision 0.305, the tolerance cap 0.29. Measured, the own noise
    bounds the band alone (3 x 0.305): the row is reproduced; capped at the tolerance it was not, and
    the correct pair exited 1."""
    logits, top, _ = _row()
    served = top.copy()
    far = np.argsort(-logits)[K + 6]  # seven ranks below the boundary: 7/32 = 0.22 under the K-th
    served[K - 1] = far
    vals = logits[served].copy()
    vals[K - 1] += 0.15  # serving's kernel noise on an ill-conditioned row
    tol = 0.05 * float(np.abs(vals).min())  # 0.088: a band of 2 x 0.088 < 0.22
    assert 2 * tol < 7 / V < 2 * 0.15
    assert not set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32")
    assert set_reproduced(logits, served, served, vals, rel=0.05, dtype="float32", own=0.05)  # 3 x 0.05
