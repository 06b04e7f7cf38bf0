"""The one table of recorded facts: for each fact the diff knows, the first stage it acts in
(tracer/schema.py ``STAGE_ORDER``) and the fix when the two sides' values differ; and the one small
table of what is never compared (``NOT_COMPARED``: provenance, recorder bookkeeping, options that
do not change the computation).

A fact is a contract field (tracer/contract.py) or a key inside one of the dict facts read whole from
the live objects, flattened with dots: ``draft_config.rope_parameters.rope_theta``,
``engine_options.speculative_draft_window_size``, ``draft_weights.midlayer.mlp.up_proj.weight``,
``target_weights.model.layers.3``. ``FACTS`` rows match by ``fnmatch`` pattern, first row first;
a differing fact no row matches is still named (explain/fact_diff.py: "unlisted difference: KEY:
training X, serving Y; stage unknown"): nothing is dropped because nobody listed it.

Fix texts: a fact that is one kind of replay/diff/causes.py takes that kind's fix (``fix_of``); the
contract fields' own fixes are here (contract_check.py ``_FIELDS`` says severity, message and the
stages each bears on), the engine's own wording of some in contract_check ``ENGINE_FIXES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from specdiff.replay.diff.causes import fix_of


@dataclass(frozen=True)
class FactRow:
    """One known fact: ``key`` (an ``fnmatch`` pattern over flattened fact keys), the first stage it
    acts in (``STAGE_ORDER``), and what to change when the sides differ."""

    key: str
    stage: str
    fix: str


_SAME_TARGET = "record both sides with the same target model"
_D2T_FIX = "serve the d2t of the draft checkpoint training used (its vocab map, saved as offsets)"
_ROPE = ("make the draft config's rope (rope_parameters / rope_theta / rope_scaling / partial_rotary_factor) what "
         "training used")
_DRAFT_DIMS = "serve the draft with the config it was trained with (its dims are the checkpoint's)"
_UNLOADED = fix_of("unloaded_params")

FACTS: tuple[FactRow, ...] = (
    # ---- contract fields compared one by one (contract_check._FIELDS: severity, message, stages) ----
    FactRow("num_layers", "target.aux", _SAME_TARGET),
    FactRow("hidden_size", "target.aux", _SAME_TARGET),
    FactRow("vocab_size", "tokens", _SAME_TARGET),
    FactRow("draft_vocab_size", "draft.logits", "serve the draft that was trained"),
    FactRow("spec_algorithm", "target.aux", "serve an EAGLE-3 draft with --speculative-algorithm EAGLE3 (EAGLE feeds "
            "one final hidden state and skips fc)"),
    FactRow("aux_hf_indices", "target.aux", "write the training layers into the draft config's aux-id key in the "
            "serving engine's numbering, or record training with the served layers"),
    FactRow("aux_concat_order", "target.aux", "concatenate the aux states in ascending layer order in training "
            "(SGLang and vLLM do), or retrain"),
    FactRow("aux_dropped_ids", "target.aux", "use aux ids the serving engine captures (its numbering for this "
            "target: `specdiff check` prints them)"),
    FactRow("aux_prenorm_indices", "target.aux", "feed the same state in slot L on both sides: train on the last "
            "layer's output before the final norm, or choose aux ids without L"),
    FactRow("d2t_sha256", "draft.topk_target", _D2T_FIX),
    FactRow("hot_token_id_sha256", "draft.topk_target", _D2T_FIX),
    FactRow("t2d_sha256", "draft.topk_target", "the engines map draft ids through d2t only; make d2t and t2d come "
            "from the same vocab map"),
    FactRow("norm_before_fc", "draft.fc_in", "set norm_before_fc in the draft config as in training"),
    FactRow("fc_norm", "draft.fc_in", "set fc_norm in the draft config as in training"),
    FactRow("norm_output", "draft.attn_in", "set norm_output in the draft config as in training (True = feed the "
            "normed hidden)"),
    FactRow("embed_source", "draft.attn_in", "the engine shares the target's embedding with an EAGLE-3 draft: train "
            "with the target's (frozen) embedding"),
    FactRow("embed_sha256", "draft.attn_in", "train and serve with the same target embedding (the engine uses the "
            "target's)"),
    FactRow("lm_head_source", "draft.logits", "put the trained lm_head into the draft checkpoint"),
    FactRow("lm_head_sha256", "draft.logits", "serve the lm_head that was trained"),
    FactRow("rope_theta", "draft.hidden_out", "set rope_theta in the draft config to training's"),
    FactRow("rope_scaling", "draft.hidden_out", "set rope_scaling in the draft config to training's"),
    FactRow("rope_style", "draft.hidden_out", "use the same rotary style (neox rotate-halves vs gptj interleaved) on "
            "both sides"),
    FactRow("partial_rotary_factor", "draft.hidden_out", "set partial_rotary_factor in the draft config to what "
            "training used"),
    FactRow("draft_weights_sha256", "draft.fc_out", "serve the checkpoint that was trained"),
    FactRow("tokenizer_sha256", "tokens", "tokenize training data with the serving tokenizer"),
    FactRow("bos_added", "tokens", "record training with the served token format (`specdiff record train --replay "
            "SERVE_TRACE`), or add/drop BOS in the training data as the server does"),
    FactRow("chat_template_sha256", "tokens", "format training data with the serving chat template"),
    FactRow("dtype", "target.aux", "run both sides in one dtype: record training with the serving --dtype, or serve "
            "in the trained dtype (a bf16-trained draft in float16 can overflow: --dtype bfloat16)"),
    FactRow("spec_steps", "draft.topk", "record training with the serving --speculative-num-steps (--steps)"),
    FactRow("spec_topk", "draft.topk", "record training with the serving --speculative-eagle-topk (--topk)"),
    # ---- other contract fields, compared by fact_diff ----------------------------------------------
    FactRow("logits_topk", "draft.logits", fix_of("logits_topk")),
    FactRow("draft_num_aux", "draft.fc_in", fix_of("aux_layer_count")),
    FactRow("draft_hidden_size", "draft.fc_out", _DRAFT_DIMS),
    FactRow("norm_before_residual", "draft.attn_in", "set norm_before_residual in the draft config as in training"),
    FactRow("spec_draft_tokens", "verify", "record training with the serving --speculative-num-draft-tokens"),
    # ---- the draft's config as built, key by key ----------------------------------------------------
    FactRow("draft_config.num_hidden_layers", "draft.hidden_out", "set num_hidden_layers in the draft config to the "
            "number of decoder layers the checkpoint holds (as trained): the engine builds as many as the config says "
            "(the ones the checkpoint does not hold keep the values they were allocated with)"),
    FactRow("draft_config.rope_*", "draft.hidden_out", _ROPE),
    FactRow("draft_config.partial_rotary_factor", "draft.hidden_out", _ROPE),
    FactRow("draft_config.rope_is_neox_style", "draft.hidden_out", _ROPE),
    FactRow("draft_config.max_position_embeddings", "draft.hidden_out", "set max_position_embeddings in the draft "
            "config to at least the served context (an engine may clamp the draft's rope positions to it)"),
    FactRow("draft_config.sliding_window*", "draft.hidden_out", "give the draft config the attention window training "
            "used (none: attend to every earlier position)"),
    FactRow("draft_config.rms_norm_eps", "draft.attn_in", "set rms_norm_eps in the draft config to training's"),
    FactRow("draft_config.eagle_config.eagle_aux_hidden_state_layer_ids", "target.aux", "write the training layers "
            "into the draft config's aux-id key in the serving engine's numbering"),
    FactRow("draft_config.eagle_aux_hidden_state_layer_ids", "target.aux", "write the training layers into the draft "
            "config's aux-id key in the serving engine's numbering"),
    FactRow("draft_config.*norm_before_fc", "draft.fc_in", "set norm_before_fc in the draft config as in training"),
    FactRow("draft_config.*fc_norm", "draft.fc_in", "set fc_norm in the draft config as in training"),
    FactRow("draft_config.use_aux_norm", "draft.fc_in", "set fc_norm in the draft config as in training"),
    FactRow("draft_config.*norm_output", "draft.attn_in", "set norm_output in the draft config as in training"),
    FactRow("draft_config.*norm_before_residual", "draft.attn_in", "set norm_before_residual in the draft config as "
            "in training"),
    FactRow("draft_config.draft_vocab_size", "draft.logits", fix_of("draft_vocab_size")),
    FactRow("draft_config.tie_word_embeddings", "draft.logits", "set tie_word_embeddings false in the draft config: "
            "true makes the engine score with the target's embedding, not the trained lm_head"),
    FactRow("draft_config.target_hidden_size", "draft.fc_in", _DRAFT_DIMS),
    FactRow("draft_config.num_aux_hidden_states", "draft.fc_in", fix_of("aux_layer_count")),
    FactRow("draft_config.hidden_size", "draft.fc_out", _DRAFT_DIMS),
    FactRow("draft_config.*_size", "draft.hidden_out", _DRAFT_DIMS),
    FactRow("draft_config.num_*", "draft.hidden_out", _DRAFT_DIMS),
    FactRow("draft_config.head_dim", "draft.hidden_out", _DRAFT_DIMS),
    FactRow("draft_config.*_bias", "draft.hidden_out", _DRAFT_DIMS),
    FactRow("draft_config.hidden_act", "draft.hidden_out", "set hidden_act in the draft config to training's"),
    # ---- what SpecForge recorded of the training run, against that recording (one side's own warnings) --
    FactRow("specforge_contract.*", "target.aux", "record training with what SpecForge trained the draft with (its "
            "target, capture layers and dtype), or retrain the draft on what is recorded and served"),
    # ---- the target's config (its hash is target identity: a difference refuses the diff) -------------
    FactRow("target_config.*", "target.aux", _SAME_TARGET),
    FactRow("draft_attention_window", "draft.hidden_out", "serve the draft with the attention window it was trained "
            "with: SGLang 0.5.23 takes it only from --speculative-draft-window-size W (every draft layer; W = the "
            "config's sliding_window - 1) and ignores the draft config's layer_types / sliding_window "
            "(llama_eagle3.py:286-299); a window trained on some layers only, or by speculators' rule (the same "
            "window over the prefix at every TTT step, where SGLang also counts the step's draft tokens: "
            "eagle3/attention_window.py), is not what SGLang computes at depth >= 1: retrain with the served "
            "rule or accept those rows"),
    # ---- the engine's options (engine_options: SGLang ServerArgs field names) -------------------------
    FactRow("engine_options.speculative_draft_window_size", "draft.hidden_out", "serve without "
            "--speculative-draft-window-size: the draft was trained attending to every earlier position, and SGLang's "
            "Llama EAGLE-3 then attends to the most recent N keys only (llama_eagle3.py:287-297)"),
    FactRow("engine_options.speculative_draft_sink_size", "draft.hidden_out", "serve without "
            "--speculative-draft-sink-size / --speculative-draft-window-size (the draft was trained on full attention)"),
    FactRow("engine_options.speculative_draft_kv_cache_dtype", "draft.hidden_out", "serve the draft's KV cache in the "
            "model dtype (--speculative-draft-kv-cache-dtype auto): training attends to unquantized keys and values"),
    FactRow("engine_options.kv_cache_dtype", "target.aux", "serve with --kv-cache-dtype auto: training attends to "
            "unquantized keys and values"),
    FactRow("engine_options.speculative_draft_model_quantization", "draft.fc_out", "serve the draft unquantized, as "
            "trained (no --speculative-draft-model-quantization)"),
    FactRow("engine_options.quantization", "target.aux", "serve the target training recorded, unquantized, or "
            "record training on the quantized target"),
    FactRow("engine_options.json_model_override_args", "target.aux", "serve without --json-model-override-args, or "
            "record training with the same config overrides"),
    FactRow("engine_options.speculative_draft_model_revision", "draft.fc_out", "serve the draft revision training "
            "used"),
    FactRow("engine_options.revision", "target.aux", "serve the target revision training used"),
    FactRow("engine_options.enable_fp32_lm_head", "verify", "serve the target's lm_head in its own dtype, as training "
            "computes it"),
    # ---- weights, on the load path: per checkpoint tensor (draft), per layer (target) ----------------
    FactRow("draft_weights.*embed_tokens*", "draft.attn_in", "serve the draft with the embedding it was trained with"),
    FactRow("draft_weights.*input_layernorm*", "draft.attn_in", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.*hidden_norm*", "draft.attn_in", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.*fc_norm*", "draft.fc_in", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.*input_norm*", "draft.fc_in", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.*fc.*", "draft.fc_out", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.*lm_head*", "draft.logits", "serve the lm_head that was trained"),
    FactRow("draft_weights.norm.*", "draft.logits", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.model.norm.*", "draft.logits", "serve the draft checkpoint that was trained"),
    FactRow("draft_weights.d2t", "draft.topk_target", _D2T_FIX),
    FactRow("draft_weights.t2d", "draft.topk_target", _D2T_FIX),
    FactRow("draft_weights.*", "draft.hidden_out", "serve the draft checkpoint that was trained"),
    FactRow("target_weights.*lm_head*", "verify", "serve the target checkpoint training recorded"),
    FactRow("target_weights.*", "target.aux", "serve the target checkpoint training recorded (the same weights in every "
            "layer, not only the same config and embedding)"),
    # ---- what the model built that the checkpoint did not provide (left as allocated) -----------------
    FactRow("draft_unloaded.*embed_tokens*", "draft.attn_in", _UNLOADED),
    FactRow("draft_unloaded.*fc.*", "draft.fc_out", _UNLOADED),
    FactRow("draft_unloaded.*fc_norm*", "draft.fc_in", _UNLOADED),
    FactRow("draft_unloaded.*input_norm*", "draft.fc_in", _UNLOADED),
    FactRow("draft_unloaded.*lm_head*", "draft.logits", _UNLOADED),
    FactRow("draft_unloaded.*", "draft.hidden_out", _UNLOADED),
    FactRow("target_unloaded.*lm_head*", "verify", _UNLOADED),
    FactRow("target_unloaded.*", "target.aux", _UNLOADED),
    # ---- the norm weight each later draft layer normalises its input with, by each side's rule (after the
    # unloaded rows: a layer the checkpoint left unloaded is the cause, its unloaded norm a consequence) ------
    FactRow("draft_layer_input_norms.*", "draft.hidden_out", "give every later draft layer the input norm training "
            "computed with, under the name the serving engine reads: SGLang 0.5.23 layers.{i}.hidden_norm.weight "
            "(llama_eagle3.py:103-105), vLLM 0.32.0 and speculators layers.{i}.input_layernorm.weight (vLLM "
            "llama_eagle3.py:136-138); an SGLang-format draft written for vLLM needs hidden_norm copied into "
            "input_layernorm"),
    # ---- module structure as built (engine names: compared between traces of one engine) --------------
    FactRow("draft_structure.*fc*", "draft.fc_in", "serve the draft with the config and checkpoint it was trained with"),
    FactRow("draft_structure.*embed_tokens*", "draft.attn_in", "serve the draft with the config and checkpoint it was "
            "trained with"),
    FactRow("draft_structure.*lm_head*", "draft.logits", "serve the draft with the config and checkpoint it was "
            "trained with"),
    FactRow("draft_structure.*", "draft.hidden_out", "serve the draft with the config and checkpoint it was trained "
            "with"),
    FactRow("target_structure.*", "target.aux", _SAME_TARGET),
)

#: pattern -> why it is never compared: provenance, recorder bookkeeping, results, facts compared as
#: another fact, and engine options known not to change the computation (network, logging, memory and
#: scheduling, kernels of the same math, parallel layout)
NOT_COMPARED: dict[str, str] = {
    # provenance and the recorder's own bookkeeping
    "side": "provenance", "engine": "provenance", "engine_version": "provenance", "model_name": "a path",
    "draft_name": "a path", "replay_of": "a path", "draft_format": "checkpoint layout (weights compared by name)",
    "unobservable": "recorder bookkeeping", "unknown_reasons": "recorder bookkeeping", "findings": "pre-flight findings (reported on their own)",
    "notes": "recorder notes", "defaults_used": "said by record train", "sampling": "recorder bookkeeping",
    "sampled_requests": "recorder bookkeeping", "dropped_*": "recorder bookkeeping", "recorder_*": "recorder timing",
    "trainer": "provenance (who computed the training side)",
    "specforge_contract": "SpecForge's records of one training run: checked against that side's own recording, each "
                          "disagreement a warning of that side (explain/contract_check.py)",
    "trainer_*": "the trainer's version, class, own config and variants: what they change is compared as the stages",
    "request_prefill": "per request", "crash": "reported on its own", "unrecorded_stages": "recorder coverage",
    "engine_process_start": "how the engine's process was started (spawn or fork: the same computation)",
    "graph_hidden_stages": "recorder coverage", "depth_coverage": "recorder coverage", "capture_level": "recorder",
    "probe_positions": "recorder", "bos_token_id": "read as bos_added",
    "accept_rate": "a result", "noise_floor": "a measurement of one side (the diff's shift judge reads it)", "accept_cum_rate": "a result", "mean_accept_length": "a result",
    "served_aux_hf_indices": "a copy of serving's", "target_dtype": "compared as dtype",
    # facts compared as another fact
    "aux_native_ids": "each side's own numbering: compared as aux_hf_indices",
    "aux_convention": "each side's own numbering: compared as aux_hf_indices",
    "aux_dropped_ids": "reported per side", "aux_ids_source": "compared as aux_hf_indices",
    "aux_id_rule": "an engine's rule in words", "aux_capture_rule": "an engine's rule in words",
    "d2t_rule": "an engine's rule in words", "engine_runner": "which runner", "draft_class": "an engine's class",
    "embed_fingerprint": "read with embed_sha256", "lm_head_fingerprint": "read with lm_head_sha256",
    "draft_weights_fingerprint": "read with draft_weights_sha256", "engine_options_given": "read with engine_options",
    "target_architecture": "target identity (refused when it differs)",
    "target_config_sha256": "target identity", "target_weights_fingerprint": "target identity",
    "target_num_experts": "target identity", "target_experts_per_token": "target identity",
    # a config's provenance and what an engine writes into the config it loaded (tracer/contract.py
    # CONFIG_UNHASHED_KEYS), at any depth
    "*_config.*_name_or_path": "a path", "*_config.transformers_version": "provenance",
    "*_config._commit_hash": "provenance", "*_config.*attn_implementation*": "kernel choice (same math)",
    "*_config.torch_dtype": "compared as dtype", "*_config.dtype": "compared as dtype",
    "*_config.use_cache": "no effect on a forward", "*_config.output_*": "no effect on the values",
    "*_config.return_dict": "no effect on the values", "*_config.original_num_attention_heads": "SGLang bookkeeping",
    "*_config.original_total_num_kv_heads": "SGLang bookkeeping", "*_config.context_len": "SGLang bookkeeping",
    "*_config.encoder_only": "SGLang bookkeeping", "*_config.language_only": "SGLang bookkeeping",
    "*_config.language_model_only": "SGLang bookkeeping", "*_config.v_head_dim": "SGLang bookkeeping",
    "*_config.swa_head_dim": "SGLang bookkeeping", "*_config.swa_v_head_dim": "SGLang bookkeeping",
    "*_config.id2label*": "classification heads", "*_config.label2id*": "classification heads",
    "*_config.problem_type": "classification heads", "*_config.chunk_size_feed_forward": "no effect on the values",
    "*_config.initializer_range": "initialisation only", "*_config.*_token_id": "tokens (compared as bos_added)",
    "*_config.rope_*.type": "SGLang's alias of rope_type (utils/hf_transformers_patches.py:113)",
    # engine options known not to change the computation
    "engine_options.*port*": "network", "engine_options.host": "network", "engine_options.*url*": "network",
    "engine_options.*log*": "logging", "engine_options.*metric*": "metrics", "engine_options.*trace*": "tracing",
    "engine_options.*bucket*": "metrics", "engine_options.*path*": "a path (weights and configs are compared)",
    "engine_options.served_model_name": "a name", "engine_options.*api_key*": "credentials",
    "engine_options.*ssl*": "network", "engine_options.*grpc*": "network", "engine_options.*http*": "network",
    "engine_options.*timeout*": "timeouts", "engine_options.*watchdog*": "timeouts",
    "engine_options.mem_*": "memory", "engine_options.max_*": "memory and scheduling",
    "engine_options.*chunk*": "scheduling", "engine_options.*schedul*": "scheduling",
    "engine_options.*radix*": "caching (the cached-prefix KV is judged from the rows)",
    "engine_options.*cache_report*": "metrics", "engine_options.*cuda_graph*": "graph capture (same math)",
    "engine_options.*backend*": "kernel choice (same math)", "engine_options.device": "hardware",
    "engine_options.*gpu*": "hardware", "engine_options.*tp_size*": "parallel layout (same math)",
    "engine_options.*dp_size*": "parallel layout", "engine_options.*pp_size*": "parallel layout",
    "engine_options.*ep_size*": "parallel layout", "engine_options.nnodes": "parallel layout",
    "engine_options.node_rank": "parallel layout", "engine_options.skip_*": "start-up",
    "engine_options.*warmup*": "start-up", "engine_options.sleep_on_idle": "idle behaviour",
    "engine_options.random_seed": "sampling seed (greedy runs do not use it)", "engine_options.*tokenizer*": "tokens "
    "(compared as tokenizer_sha256)", "engine_options.dtype": "compared as dtype",
    "engine_options.speculative_algorithm": "compared as spec_algorithm",
    "engine_options.speculative_num_steps": "compared as spec_steps",
    "engine_options.speculative_eagle_topk": "compared as spec_topk",
    "engine_options.speculative_num_draft_tokens": "compared as spec_draft_tokens",
    "engine_options.speculative_token_map": "EAGLE3 ignores it (SGLang eagle_worker_v2.py:325-330)",
    "engine_options.load_format": "how weights are read (their fingerprints are compared)",
    "engine_options.*load*": "how weights are read", "engine_options.disable_overlap_schedule": "scheduling",
    "engine_options.stream_*": "streaming", "engine_options.*worker_num*": "processes",
    "engine_options.chat_template": "compared as chat_template_sha256", "engine_options.trust_remote_code": "loading",
    "engine_options.download_dir": "a path", "engine_options.enable_mixed_chunk": "scheduling",
    "engine_options.context_length": "a limit", "engine_options.page_size": "memory layout",
    "engine_options.*dp_attention*": "parallel layout", "engine_options.*torch_compile*": "compilation (same math)",
    "engine_options.*parser*": "output parsing", "engine_options.*deterministic*": "kernels of the same math",
    "engine_options.*hicache*": "caching", "engine_options.*return_*": "what a request returns",
    "engine_options.*numa*": "hardware", "engine_options.*nccl*": "communication",
    "engine_options.*allreduce*": "communication (same math)", "engine_options.dist_*": "communication",
    # structures are each engine's own names: compared only between traces of one engine (fact_diff)
}


def fact_row(key: str) -> FactRow | None:
    """The first ``FACTS`` row whose pattern matches ``key`` (a flattened fact key), or None."""
    for row in FACTS:
        if row.key == key or fnmatchcase(key, row.key):
            return row
    return None


#: pattern -> {an engine's own name for a value: the name the other side records for the same math}: the
#: two compare equal. SGLang 0.5.23 writes rope_type 'deepseek_yarn' into the DeepSeek config it loaded
#: (srt/models/deepseek_v2.py:2064-2066, "modification to rope_scaling must be done early") for the
#: YaRN with mscale that transformers' DeepseekV3 computes under rope_type 'yarn'
#: (layers/rotary_embedding/factory.py:371 builds DeepseekScalingRotaryEmbedding for it); a correct
#: DeepSeek-V3 pair read it as a target_config difference
VALUE_ALIASES: dict[str, dict] = {
    "target_config.rope_*.rope_type": {"deepseek_yarn": "yarn"},
    "draft_config.rope_*.rope_type": {"deepseek_yarn": "yarn"},
}


def canonical_value(key: str, value):
    """``value`` under the name ``VALUE_ALIASES`` gives it for ``key`` (itself when none does)."""
    for pattern, names in VALUE_ALIASES.items():
        if fnmatchcase(key, pattern) and isinstance(value, str) and value in names:
            return names[value]
    return value


def not_compared(key: str) -> str | None:
    """Why ``key`` is never compared (``NOT_COMPARED``), or None when it is compared."""
    for pattern, why in NOT_COMPARED.items():
        if key == pattern or fnmatchcase(key, pattern):
            return why
    return None


__all__ = ["FACTS", "NOT_COMPARED", "VALUE_ALIASES", "FactRow", "canonical_value", "fact_row", "not_compared"]
