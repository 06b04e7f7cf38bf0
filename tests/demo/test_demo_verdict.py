"""`specdiff demo`'s exit code: 0 when it found what its scenario seeded, 1 when it did not.

Judged on the shipped seed pair (traces/examples/seed: a real CPU SGLang trace of the demo
draft served with the seed user's layer ids, and `record train` of the same sequences).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.demo.scenarios import SCENARIOS
from specdiff.replay.diff.pipeline import diff_traces

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"


@pytest.fixture(scope="module")
def seed_report():
    return diff_traces(str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace"))


def test_demo_worked_when_the_seeded_layer_shift_is_found(seed_report):
    ok, line = SCENARIOS["seed"].check(seed_report)
    assert ok
    assert line == ("demo worked: scenario 'seed' seeded a mistake and specdiff found it at target.aux.0, "
                    "explained as aux_layer_shift")


@pytest.mark.parametrize(("scenario", "expected"), [
    ("correct", "demo FAILED: scenario 'correct' should agree, but the diff found target.aux.0"),
    ("d2t-direct", "demo FAILED: scenario 'd2t-direct' should diverge first at draft.topk_target, found target.aux.0"),
    ("norm-before-fc", "demo FAILED: scenario 'norm-before-fc' should diverge first at draft.fc_in or "
                       "draft.fc_out, found target.aux.0"),
])
def test_demo_fails_when_the_expected_divergence_is_not_found(seed_report, scenario, expected):
    ok, line = SCENARIOS[scenario].check(seed_report)
    assert not ok
    assert line == expected


def test_demo_fails_when_the_stage_is_right_but_the_cause_is_not(seed_report):
    from dataclasses import replace

    sc = replace(SCENARIOS["seed"], expected_cause="d2t_direct_ids")
    ok, line = sc.check(seed_report)
    assert not ok and "explanation is aux_layer_shift, not d2t_direct_ids" in line
