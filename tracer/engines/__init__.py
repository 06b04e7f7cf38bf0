"""Serving-engine recorders, one subpackage each, behind the boundary of ``base``.

``sglang/``: the SGLang plugin, hooks, live-contract reader and its CPU recipe (``sglang/cpu``).
Importing this package only registers each engine's ``EngineSpec``; it imports no engine.
"""

from specdiff.tracer.engines.base import EngineSpec, engine_names, engine_spec, register

SGLANG = register(EngineSpec(
    name="sglang", title="SGLang", plugin_group="sglang.srt.plugins",
    plugin="specdiff.tracer.engines.sglang.plugin:load",
    aux_convention="sglang", aux_concat="ascending",
    tested_range=("0.5.19", "0.5.23"),  # = sglang.adapter.TESTED_RANGE (tests/test_architecture.py)
    cpu_launcher="specdiff.tracer.engines.sglang.cpu.launch",
))

__all__ = ["SGLANG", "EngineSpec", "engine_names", "engine_spec", "register"]
