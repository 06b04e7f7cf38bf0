"""Fixtures of the family tests (test_family_servers.py, test_family_contract.py,
test_family_correct_pairs.py): one real CPU SGLang server per (family, mode) and one correct pair
per served trace for the whole session, so the three files share every start and every
``record train`` (tests/support/family_servers.py says what is served)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def family_servers(tmp_path_factory, server_env, request):
    """``family_servers(family, mode)`` -> the served run (support.family_servers.serve_families):
    session-scoped, so a (family, mode) server starts once however many files read it."""
    from support.family_servers import serve_families

    return serve_families(tmp_path_factory, server_env, request.config)


@pytest.fixture(scope="session")
def family_correct_pair(family_servers):
    """``family_correct_pair(family, mode)`` -> (diff process, JSON report, train trace) of the served
    trace against ``record train --replay`` of it (support.family_servers.correct_pairs)."""
    from support.family_servers import correct_pairs

    return correct_pairs(family_servers)
