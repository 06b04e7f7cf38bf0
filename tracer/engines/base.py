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

``EngineSpec`` is the part of an engine that offline code (``replay/``, ``tui/``) may use: its name
as recorded in the ``engine`` contract fact, its aux-id convention, its tested versions and where
its recorder and CPU launcher live. Offline code asks ``engine_spec(name)`` instead of naming
an engine's modules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    """What offline code may know about one serving engine.

    Attributes:
        name: the ``engine`` contract fact a trace of this engine carries ('sglang').
        title: how people write it ('SGLang').
        plugin_group: the Python entry-point group the engine loads plugins from.
        plugin: ``module:function`` of specdiff's recorder entry point for this engine.
        aux_convention: the id convention of ``specdiff.eagle3.aux_layers`` its config ids use.
        aux_concat: how it orders the captured slots in the fc input ('ascending').
        tested_range: inclusive (low, high) engine versions the recorder was verified on.
        cpu_launcher: module of the CPU recipe's launcher, or None when the engine has none.
        aux_ids_key: the draft-config key a user writes the aux ids into for this engine (the fix
            of an aux-layer divergence names it).
        aux_ids_read: every draft-config key the engine reads the aux ids from, in its precedence
            (the first that holds ids wins); none holding ids -> the engine's default layers.
        aux_id_words: the engine's aux-id numbering in a few words, for explanations.
        serve_args_hint: what ``record serve --engine <name> -- ...`` needs at least (its error says it).
        runners: the engine's model runners whose aux-id key precedence differs (vLLM 0.32: 'v1',
            'v2'), the one specdiff's recorder was verified on first; () when it has one.

    The module ``cpu_launcher`` names has ``record_serve_command(args, *, cpu, env) -> (argv, env)``:
    the command ``specdiff record serve`` runs for this engine, on a CPU or as served.
    """

    name: str
    title: str
    plugin_group: str
    plugin: str
    aux_convention: str
    aux_concat: str
    tested_range: tuple[str, str]
    cpu_launcher: str | None = None
    aux_ids_key: str = ""
    aux_ids_read: tuple[str, ...] = ()
    aux_id_words: str = ""
    serve_args_hint: str = ""
    runners: tuple[str, ...] = ()

    def read_aux_ids(self, draft_config: dict, runner: str | None = None):
        """Which aux ids this engine takes from a draft config.json dict, from which key, and which
        keys holding ids it leaves unread (``specdiff.eagle3.aux_layers.config_aux_ids``, the one rule
        ``specdiff check``, ``record train`` and the diff's explanations share).

        Args:
            draft_config: the draft's config.json.
            runner: one of ``runners`` (None: the first).

        Returns:
            ``specdiff.eagle3.aux_layers.ConfigIds``.

        Raises:
            specdiff.eagle3.aux_layers.ConventionError: an unknown runner, ids that are not a list of ints.
        """
        from specdiff.eagle3.aux_layers import config_aux_ids

        return config_aux_ids(self.name, draft_config, runner=runner)


class UnknownEngineError(ValueError):
    """Raised for an engine name no recorder in ``tracer/engines/`` is registered for."""


_REGISTRY: dict[str, EngineSpec] = {}


def register(spec: EngineSpec) -> EngineSpec:
    """Add an engine (called by ``tracer/engines/__init__.py``); returns ``spec``."""
    _REGISTRY[spec.name] = spec
    return spec


def engine_spec(name: str) -> EngineSpec:
    """The registered engine called ``name`` (the ``engine`` contract fact).

    Raises:
        UnknownEngineError: no recorder is registered under that name.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownEngineError(
            f"unknown serving engine {name!r}; specdiff records: {', '.join(sorted(_REGISTRY))}") from None


def engine_names() -> tuple[str, ...]:
    """Names of the registered serving engines, sorted."""
    return tuple(sorted(_REGISTRY))
