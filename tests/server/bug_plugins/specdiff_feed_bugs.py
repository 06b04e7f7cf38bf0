"""Serving bugs of one concern for the test plugin ``specdiff_bug_plugins`` (its module doc says how it is
loaded): what the draft is fed at depth >= 1 and what the verify accepts.

``HOOKS`` maps each ``SPECDIFF_TEST_BUG`` kind to the function that registers its hook; a hook says
``specdiff_bug_plugins._said(kind)`` the first time it acts (the tests check the bug really ran).
"""

from __future__ import annotations

from collections.abc import Callable

HOOKS: dict[str, Callable[[], None]] = {}
