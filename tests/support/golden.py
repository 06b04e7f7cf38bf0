"""The ``assert_golden_seed_diff`` check (registered by tests/conftest.py): ``specdiff diff --format
json`` of the shipped seed pair against tests/golden/seed_diff.json."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN_SEED_DIFF = Path(__file__).resolve().parents[1] / "golden" / "seed_diff.json"


def _same_json(got, want, where: str) -> None:
    if isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), where
        return
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _same_json(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same_json(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.fixture(scope="session")
def assert_golden_seed_diff():
    """A check that bytes are ``specdiff diff --format json`` of the shipped seed pair as
    tests/golden/seed_diff.json holds it: byte-identical on the CPU it was made on; on another CPU
    the BLAS row dots (np.vecdot) sum in another order and move float32 metrics by a few ulp, so
    then the same JSON with floats within rel 1e-5 (keys, order, strings, ints, verdicts exact)."""
    import json

    def check(stdout: bytes) -> None:
        want = GOLDEN_SEED_DIFF.read_bytes()
        if stdout != want:
            _same_json(json.loads(stdout), json.loads(want), "$")

    return check
