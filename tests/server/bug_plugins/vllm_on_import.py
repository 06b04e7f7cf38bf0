"""Patch a vLLM module the moment it is imported, in whichever vLLM process imports it (test plugins only).

vLLM loads general plugins in every process it starts (plugins/__init__.py ``load_general_plugins``, called
from v1/engine/core.py:129 and v1/worker/worker_base.py:276), often before the module a bug lives in is
imported; an import hook patches it right after its own code ran, so only the process that uses it is
touched. specdiff's recorder does the same for several modules at once (tracer/engines/vllm/plugin.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable


class _Finder(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` is imported, once."""

    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def arm(name: str, patch: Callable) -> None:
    """``patch(module)`` of module ``name`` now if it is imported, else right after its import."""
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, patch))


#: the variable that picks one bug per server (as SGLang's test plugin reads it)
ENV = "SPECDIFF_TEST_BUG"


def arm_chosen_kind(kinds: dict) -> None:
    """A test vLLM plugin's ``load``: ``arm`` the (module, patch) of ``kinds`` that ``$SPECDIFF_TEST_BUG``
    names; nothing where it is unset. Raises ValueError naming every kind for a kind ``kinds`` lacks."""
    kind = os.environ.get(ENV)
    if not kind:
        return
    if kind not in kinds:
        raise ValueError(f"{ENV}={kind!r}: one of {', '.join(kinds)}")
    arm(*kinds[kind])
