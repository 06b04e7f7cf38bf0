"""Checks that hold on every diff any test runs in-process."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def early_first_divergence_equals_the_full_one(monkeypatch):
    """Every ``compare_all`` a test runs (through ``diff_traces`` / ``diff_opened``, the app
    included) must say its early first divergence (replay/diff/early.py) exactly once when, and
    only when, the full data has one, and it must be the full data's ``first_divergence``: the
    same tensor, finding kind and aligned (pair, pos, depth). Every scenario pair of the tests
    thus checks the early rule."""
    from specdiff.replay.diff import compare, report

    original = compare.compare_all

    def checked(*args, on_first=None, **kwargs):
        said = []

        def record(early):
            said.append(early)
            if on_first is not None:
                on_first(early)

        comps = original(*args, on_first=record, **kwargs)
        full = compare.first_divergence(comps)
        if full is None:
            assert said == [], f"an early first divergence {said} where the full data has none"
        else:
            where = ({k: full.worst[k] for k in ("pair", "pos", "depth")} if full.kind == "tokens"
                     else full.first_where)
            assert len(said) == 1, f"early first divergence said {len(said)} times"
            got = said[0]
            assert (got.name, got.kind, got.where) == (full.name, full.kind, where), \
                f"early {got} != full {(full.name, full.kind, where)}"
        return comps

    monkeypatch.setattr(report, "compare_all", checked)
