"""The engine boundary: what any serving-engine recorder delivers, and what the rest of specdiff
may know about an engine.

A recorder lives in ``tracer/engines/<engine>/`` and is loaded inside the engine's own processes
(SGLang: entry-point group ``sglang.srt.plugins``; vLLM: ``vllm.general_plugins``). Whatever the
engine, it delivers one trace store per recording rank with:

- **contract facts** (``tracer.contract.CONTRACT_FIELDS``) read from the engine's live objects at
  start-up; a fact it cannot read is ``"unknown"`` (never filled in from a config file or a
  default) and the engine name it could not find is listed under ``unobservable``;
- **rows per schema stage** (``tracer.schema``), keyed (seq, pos, depth, iter) with the canonical
  EAGLE-3 pairing of ``tracer.rows``;
- ``unrecorded_stages``: tensor -> why this recorder could not observe it (a CUDA graph, a module
  the engine's draft lacks), ``graph_hidden_stages`` for stages a graph hid;
- **crash evidence**: the exception that stopped the engine (``tracer.crash.crash_record``) in
  the contract's ``crash`` fact, written before the process died;
- **per-rank layout**: one store per DP replica under ``dp<r>/`` (``tracer.store.ranks``).

``specdiff.eagle3.engines.EngineSpec`` is the part of an engine that offline code (``replay/``,
``tui/``) may use: its name as recorded in the ``engine`` contract fact, its aux-id convention, its
tested versions and where its recorder lives; its CPU launcher is ``cpu_launcher(name)`` here.
Offline code asks for them by name instead of naming an engine's modules.
"""

from __future__ import annotations

import importlib

from specdiff.eagle3.engines import UnknownEngineError, engine_spec

#: engine name -> module of its CPU recipe's launcher (engines without one are not listed). The
#: module has ``record_serve_command(args, *, cpu, env) -> (argv, env)``: the command
#: ``specdiff record serve`` runs for this engine, on a CPU or as served.
CPU_LAUNCHERS = {
    "sglang": "specdiff.tracer.engines.sglang.cpu.launch",
    "vllm": "specdiff.tracer.engines.vllm.cpu",
}


def cpu_launcher(name: str):
    """The CPU launcher module of engine ``name`` (``CPU_LAUNCHERS``), imported.

    Raises:
        UnknownEngineError: no recorder is registered under that name, or it has no CPU launcher.
    """
    spec = engine_spec(name)
    if spec.name not in CPU_LAUNCHERS:
        raise UnknownEngineError(f"{spec.title} has no CPU launcher")
    return importlib.import_module(CPU_LAUNCHERS[spec.name])


__all__ = ["CPU_LAUNCHERS", "cpu_launcher"]
