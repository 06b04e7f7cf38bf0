"""The one table of recorded facts: for each fact the diff knows, one ``FactRow``: the first stage it
acts in (tracer/schema.py ``STAGE_ORDER``), the fix when the two sides' values differ, and, for the
contract fields the check words itself (contract/check.py), its severity, message, the stages it shows
at, the stages it can make the first to diverge and its fix in each engine's own terms; what is never
compared is contract/not_compared.py's. A fact's type and meaning stay in tracer/contract_fields.py
``CONTRACT_FIELDS`` (the recorders' layer, below the diff). Adding a fact is one row here (and its test,
tests/replay/diff/contract/test_facts.py).

A fact is a contract field (tracer/contract.py) or a key inside one of the dict facts read whole from
the live objects, flattened with dots: ``draft_config.rope_parameters.rope_theta``,
``engine_options.speculative_draft_window_size``, ``draft_weights.midlayer.mlp.up_proj.weight``,
``target_weights.model.layers.3``. ``FACTS`` rows match by ``fnmatch`` pattern, first row first;
a differing fact no row matches is still named (contract/fact_diff.py: "unlisted difference: KEY:
training X, serving Y; stage unknown"): nothing is dropped because nobody listed it.

Fix texts: a fact that is one kind of replay/diff/causes.py takes that kind's fix (``fix_of``); the
contract fields' own fixes are here, engine-neutral, with the engine's own wording in ``engine_fixes``
where the fix names the engine's key, numbering or code (SGLang 0.5.23's, vLLM 0.32.0's: the V1 runner's
aux-id key precedence is eagle3/aux_layers.py's; the aux numbering is per model file, eagle3/families.py
``FamilyRule``, so the aux explanation's own fix has the ids).

A contract difference can make a stage the FIRST to diverge only where it acts *inside* that stage
(``causes``; ``STAGE_CAUSES`` by stage): narrower than ``shows`` (every stage a difference shows at,
downstream included): the first divergence is the earliest stage whose rows differ, so every stage
before it agrees. E.g. the rope facts act in the draft's attention, between ``draft.attn_in`` (its
input, equal when ``draft.hidden_out`` is the first divergence) and ``draft.hidden_out``; a rope
difference with ``draft.logits`` first (its ``draft.hidden_out`` equal) explains nothing.
``draft_weights_sha256`` causes no stage: a whole-checkpoint hash says "another draft", not which part;
the narrowing (replay/diff/rerun/narrow.py) re-runs the training draft on serving's inputs and says
whether the draft itself is why. Nor the compute ``dtype``: it changes every stage a little and the
tolerances take the looser dtype; it is a cause only where values go non-finite
(replay/diff/explain/nonfinite.py). Weight hashes that differ only by a cast are ``info`` mismatches
(contract/check.py ``WEIGHT_HASHES``) and never a cause: only ``warn``/``error`` mismatches are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.types import ContractMismatch
from specdiff.tracer.schema import STAGE_ORDER


@dataclass(frozen=True)
class FactRow:
    """One known fact.

    Attributes:
        key: an ``fnmatch`` pattern over flattened fact keys.
        stage: the first stage it acts in (``STAGE_ORDER``).
        fix: what to change when the sides differ (engine-neutral).
        severity: for a field the contract check words itself: "error" (the two sides cannot agree),
            "warn" (likely a cause) or "info" (worth knowing); "" for the facts contract/fact_diff.py words.
        message: that field's message, a ``str.format`` template: ``{x}`` / ``{y}`` the values,
            ``{xs}`` / ``{ys}`` the values shortened, ``{lx}`` / ``{ly}`` the side labels.
        shows: the stages a difference bears on ("*": every stage), downstream included.
        causes: the stages a difference can make the first to diverge (it acts inside them).
        engine_fixes: engine name (eagle3/engines.py) -> the fix in that engine's own terms.
    """

    key: str
    stage: str
    fix: str
    severity: str = ""
    message: str = ""
    shows: tuple[str, ...] = ()
    causes: tuple[str, ...] = ()
    engine_fixes: dict[str, str] = field(default_factory=dict)


_SAME_TARGET = "record both sides with the same target model"
#: a config difference of one target (its weights agree: check.one_target_by_weights)
_ONE_TARGET_CONFIG = ("serve the target with the config training ran it with (an engine option such as "
                      "--json-model-override-args or --hf-overrides changes it: see target_config_overrides), or "
                      "record training with the same config")
_D2T_FIX = "serve the d2t of the draft checkpoint training used (its vocab map, saved as offsets)"
_ROPE = ("make the draft config's rope (rope_parameters / rope_theta / rope_scaling / partial_rotary_factor) what "
         "training used")
_DRAFT_DIMS = "serve the draft with the config it was trained with (its dims are the checkpoint's)"
_UNLOADED = fix_of("unloaded_params")

#: the stages a worded field shows at (``FactRow.shows``)
_ALL = ("*",)
_AUX = ("target.aux", "target.aux_cat", "draft.fc_in", "draft.fc_out")
_DRAFT_IN = ("draft.fc_out", "draft.attn_in", "draft.hidden_out", "draft.logits", "draft.topk")
_TOK = ("tokens",)
_ROPE_SHOWS = ("draft.hidden_out", "draft.logits")
_EMBED = ("draft.attn_in", "draft.hidden_out", "draft.logits")
#: the stages an aux fact can make the first to diverge
_AUX_CAUSES = ("target.aux", "target.aux_cat", "draft.fc_in")

FACTS: tuple[FactRow, ...] = (
    # ---- contract fields: worded one by one by contract/check.py (severity, message) ----------------
    FactRow("num_layers", "target.aux", _SAME_TARGET,
            severity="error", message="target layer counts differ ({x} vs {y}): traces of different target "
            "models",
            shows=_ALL),
    FactRow("hidden_size", "target.aux", _SAME_TARGET,
            severity="error", message="target hidden sizes differ ({x} vs {y}): traces of different target "
            "models",
            shows=_ALL),
    FactRow("vocab_size", "tokens", _SAME_TARGET,
            severity="error", message="target vocab sizes differ ({x} vs {y}): traces of different target "
            "models",
            shows=_ALL),
    FactRow("draft_vocab_size", "draft.logits", "serve the draft that was trained",
            severity="error", message="draft vocab sizes differ ({x} vs {y}): different drafts",
            shows=("draft.logits", "draft.topk", "draft.topk_target"), causes=("draft.logits", "draft.topk")),
    FactRow("spec_algorithm", "target.aux", "serve an EAGLE-3 draft with --speculative-algorithm EAGLE3 "
            "(EAGLE feeds one final hidden state and skips fc)",
            severity="error", message="speculative algorithm: {lx} {x}, {ly} {y}",
            shows=_AUX + _DRAFT_IN, causes=_AUX_CAUSES),
    FactRow("aux_hf_indices", "target.aux", "write the training layers into the draft config's aux-id key in "
            "the serving engine's numbering, or record training with the served layers",
            severity="warn", message="{ly} captured HF hidden_states{y}; {lx} used {x}",
            shows=_AUX, causes=_AUX_CAUSES,
            engine_fixes={
                "sglang": "write the training layers into the draft's "
                    "eagle_config.eagle_aux_hidden_state_layer_ids in SGLang's numbering for this target "
                    "(plus-one families, e.g. Llama, Qwen3: id = HF index - 1; DeepSeek-V3: the HF index), "
                    "or record training with the served layers",
                "vllm": "write the training layers into the draft config's top-level "
                    "eagle_aux_hidden_state_layer_ids (vLLM id = HF index; the V1 runner reads it before "
                    "eagle_config's), or record training with the served layers",
            }),
    FactRow("aux_concat_order", "target.aux", "concatenate the aux states in ascending layer order in "
            "training (SGLang and vLLM do), or retrain",
            severity="warn", message="{ly} concatenated the aux slots as HF {y}; {lx} as HF {x}",
            shows=_AUX, causes=_AUX_CAUSES),
    FactRow("aux_dropped_ids", "target.aux", "use aux ids the serving engine captures (its numbering for "
            "this target: `specdiff check` prints them)",
            shows=_AUX, causes=_AUX_CAUSES),
    FactRow("aux_prenorm_indices", "target.aux", "feed the same state in slot L on both sides: train on the "
            "last layer's output before the final norm, or choose aux ids without L",
            severity="warn", message="aux slots holding the last layer's output before the final norm: {ly} "
            "{y}, {lx} {x} (HF hidden_states[L] is after the norm)",
            shows=_AUX, causes=_AUX_CAUSES,
            engine_fixes={
                "sglang": "feed the same state in slot L on both sides: SGLang's GPT-OSS captures the last "
                    "layer's output before the final norm for id L (srt/models/gpt_oss.py:726-738); train on "
                    "that (record train reads the draft's SGLang ids by the target's rule), or choose aux "
                    "ids without L",
                "vllm": "feed the same state in slot L on both sides: vLLM id L captures the last layer's "
                    "output before the final norm (llama.py:438-441, hidden_states + residual); train on "
                    "that, or choose aux ids without L",
            }),
    FactRow("d2t_sha256", "draft.topk_target", _D2T_FIX,
            severity="warn", message="the d2t vocab maps differ ({lx} {xs}, {ly} {ys})",
            shows=("draft.topk_target", "verify"), causes=("draft.topk_target", "verify")),
    FactRow("hot_token_id_sha256", "draft.topk_target", _D2T_FIX,
            severity="warn", message="the draft->target id maps (hot_token_id) differ ({lx} {xs}, {ly} {ys})",
            shows=("draft.topk_target", "verify"), causes=("draft.topk_target", "verify")),
    FactRow("t2d_sha256", "draft.topk_target", "the engines map draft ids through d2t only; make d2t and t2d "
            "come from the same vocab map",
            severity="info", message="the t2d masks differ ({lx} {xs}, {ly} {ys})",
            shows=("draft.topk_target",), causes=("draft.topk_target",),
            engine_fixes={
                "sglang": "SGLang ignores t2d; make d2t and t2d come from the same vocab map",
                "vllm": "vLLM skips t2d at load (llama_eagle3.py:426); make d2t and t2d come from the same "
                    "vocab map",
            }),
    FactRow("norm_before_fc", "draft.fc_in", "set norm_before_fc in the draft config as in training",
            severity="warn", message="norm before fc: {lx} {x}, {ly} {y}",
            shows=("draft.fc_in", "draft.fc_out"), causes=("draft.fc_in", "draft.fc_out"),
            engine_fixes={
                "sglang": "set eagle_config.norm_before_fc in the draft config as in training",
                "vllm": "set norm_before_fc in the draft config as in training (vLLM reads eagle_config's, "
                    "else the top-level key: llama_eagle3.py:184-188)",
            }),
    FactRow("fc_norm", "draft.fc_in", "set fc_norm in the draft config as in training",
            severity="warn", message="per-slot fc norm: {lx} {x}, {ly} {y}",
            shows=("draft.fc_in", "draft.fc_out"), causes=("draft.fc_in", "draft.fc_out")),
    FactRow("norm_output", "draft.attn_in", "set norm_output in the draft config as in training (True = feed "
            "the normed hidden)",
            severity="warn", message="hidden fed to the next depth normed: {lx} {x}, {ly} {y}",
            shows=("draft.fc_out", "draft.attn_in", "draft.hidden_out", "draft.logits"),
            causes=("draft.attn_in",),
            engine_fixes={
                "sglang": "set norm_output in the draft config as in training (SGLang: True = feed the "
                    "normed hidden)",
                "vllm": "set norm_output in the draft config as in training (vLLM: True = the draft returns "
                    "the normed hidden only, llama_eagle3.py:286)",
            }),
    FactRow("embed_source", "draft.attn_in", "the engine shares the target's embedding with an EAGLE-3 "
            "draft: train with the target's (frozen) embedding",
            severity="warn", message="draft embedding taken from the {x} on {lx}, from the {y} on {ly}",
            shows=_EMBED, causes=("draft.attn_in",),
            engine_fixes={
                "sglang": "SGLang shares the target's embedding with an EAGLE-3 draft: train with the "
                    "target's (frozen) embedding",
                "vllm": "vLLM shares the target's embedding with an EAGLE-3 draft (llm_base_proposer.py:1416 "
                    "_maybe_share_embeddings): train with the target's (frozen) embedding",
            }),
    FactRow("embed_sha256", "draft.attn_in", "train and serve with the same target embedding (the engine "
            "uses the target's)",
            severity="warn", message="the embeddings the draft multiplies by differ ({lx} {xs}, {ly} {ys})",
            shows=_EMBED, causes=("draft.attn_in",),
            engine_fixes={
                "sglang": "train and serve with the same target embedding (SGLang uses the target's)",
                "vllm": "train and serve with the same target embedding (vLLM uses the target's when it "
                    "shares it)",
            }),
    FactRow("lm_head_source", "draft.logits", "put the trained lm_head into the draft checkpoint",
            severity="warn", message="draft lm_head taken from the {x} on {lx}, from the {y} on {ly}",
            shows=("draft.logits", "draft.topk"), causes=("draft.logits", "draft.topk"),
            engine_fixes={
                "sglang": "put the trained lm_head into the draft checkpoint (SGLang loads the checkpoint's "
                    "lm_head unless it has no draft_vocab_size or ties embeddings)",
                "vllm": "put the trained lm_head into the draft checkpoint (vLLM shares the target's only "
                    "when the draft has none: llm_base_proposer.py:1508 _maybe_share_lm_head)",
            }),
    FactRow("lm_head_sha256", "draft.logits", "serve the lm_head that was trained",
            severity="warn", message="the lm_heads the draft multiplies by differ ({lx} {xs}, {ly} {ys})",
            shows=("draft.logits", "draft.topk"), causes=("draft.logits", "draft.topk")),
    FactRow("rope_theta", "draft.hidden_out", "set rope_theta in the draft config to training's",
            severity="warn", message="draft rope theta: {lx} {x}, {ly} {y}",
            shows=_ROPE_SHOWS, causes=("draft.hidden_out",)),
    FactRow("rope_scaling", "draft.hidden_out", "set rope_scaling in the draft config to training's",
            severity="warn", message="draft rope scaling: {lx} {x}, {ly} {y}",
            shows=_ROPE_SHOWS, causes=("draft.hidden_out",)),
    FactRow("rope_style", "draft.hidden_out", "use the same rotary style (neox rotate-halves vs gptj "
            "interleaved) on both sides",
            severity="warn", message="draft rope style: {lx} {x}, {ly} {y}",
            shows=_ROPE_SHOWS, causes=("draft.hidden_out",)),
    FactRow("partial_rotary_factor", "draft.hidden_out", "set partial_rotary_factor in the draft config to "
            "what training used",
            severity="warn", message="draft partial rotary factor: {lx} {x}, {ly} {y} (the fraction of each "
            "head's dims rotated)",
            shows=_ROPE_SHOWS, causes=("draft.hidden_out",),
            engine_fixes={
                "sglang": "set partial_rotary_factor in the draft config to what training used (SGLang's "
                    "llama attention rotates head_dim * partial_rotary_factor dims, srt/models/llama.py:199)",
            }),
    FactRow("draft_weights_sha256", "draft.fc_out", "serve the checkpoint that was trained",
            severity="warn", message="draft weights differ ({lx} {xs}, {ly} {ys})",
            shows=_DRAFT_IN),
    FactRow("tokenizer_sha256", "tokens", "tokenize training data with the serving tokenizer",
            severity="warn", message="tokenizers differ ({lx} {xs}, {ly} {ys})",
            shows=_TOK, causes=("tokens",)),
    FactRow("bos_added", "tokens", "record training with the served token format (`specdiff record train "
            "--replay SERVE_TRACE`), or add/drop BOS in the training data as the server does",
            severity="warn", message="prompts start with BOS: {lx} {x}, {ly} {y}",
            shows=_TOK, causes=("tokens",)),
    FactRow("chat_template_sha256", "tokens", "format training data with the serving chat template",
            severity="info", message="chat templates differ ({lx} {xs}, {ly} {ys})",
            shows=_TOK, causes=("tokens",)),
    FactRow("dtype", "target.aux", "run both sides in one dtype: record training with the serving --dtype, "
            "or serve in the trained dtype (a bf16-trained draft in float16 can overflow: --dtype bfloat16)",
            severity="info", message="compute dtypes differ ({lx} {x}, {ly} {y}): tolerances use the looser",
            shows=_ALL),
    FactRow("spec_steps", "draft.topk", "record training with the serving --speculative-num-steps (--steps)",
            severity="info", message="draft steps differ ({lx} {x}, {ly} {y})",
            shows=("draft.topk", "verify"), causes=("verify",)),
    FactRow("spec_topk", "draft.topk", "record training with the serving --speculative-eagle-topk (--topk)",
            severity="info", message="draft top-k differs ({lx} {x}, {ly} {y})",
            shows=("draft.topk", "draft.topk_target", "verify"), causes=("verify",)),

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
    FactRow("target_config.*", "target.aux", _ONE_TARGET_CONFIG),
    # ---- identity facts other than the weights, of two traces whose weights agree (check.one_target_config) --
    *(FactRow(f, "target.aux", _ONE_TARGET_CONFIG) for f in ("target_architecture", "target_config_sha256",
                                                             "target_num_experts", "target_experts_per_token")),
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
    # ---- state no checkpoint holds, read off the live models after load (tracer/state_facts.py) --------
    FactRow("target_rope.*", "target.aux", "serve the target with the rope training captured it with: the same rope "
            "settings (an override such as --json-model-override-args rope_scaling changes every layer's table), and "
            "a rotary cos/sin cache rebuilt as built at load (a cache lost after load is state no checkpoint holds)"),
    FactRow("draft_rope.*", "draft.hidden_out", _ROPE + ", and a rotary cos/sin cache as built at load (SGLang 0.5.23's "
            "get_rope shares one rotary object between target and draft layers of one rope setting: "
            "srt/layers/rotary_embedding/factory.py:158-170)"),
    FactRow("target_buffers.*", "target.aux", "serve the target with its buffers as built at load: a buffer changed or "
            "lost after load (a rotary cache, a scale) is state no checkpoint holds"),
    FactRow("draft_buffers.*", "draft.hidden_out", "serve the draft with its buffers as built at load: a buffer changed "
            "or lost after load (a rotary cache, a scale) is state no checkpoint holds"),
    # ---- config keys an engine option set (value and the option: json_model_override_args, hf_overrides) --
    FactRow("target_config_overrides.*", "target.aux", "serve without the override (the option named in the value), "
            "or record training with the same override: the weights are the same target's"),
    FactRow("draft_config_overrides.*", "draft.hidden_out", "serve the draft without the override (the option named "
            "in the value), or record training with the same override"),
    FactRow("draft_input_ids_vocab", "draft.attn_in", "feed each later draft step the target-vocab id of the previous "
            "step's pick (hot_token_id[draft id], d2t offsets), as training does"),
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



#: field -> row of every contract field the check words itself (a ``severity``), in the table's order
WORDED: dict[str, FactRow] = {r.key: r for r in FACTS if r.severity}

#: first diverging stage -> the contract facts whose difference can make it the first, in the table's
#: order (``FactRow.causes``; module doc)
STAGE_CAUSES: dict[str, tuple[str, ...]] = {s: tuple(r.key for r in FACTS if s in r.causes) for s in STAGE_ORDER}

#: stages whose contract causes are judged by value, not by the contract: explain/aux.py identifies each
#: aux slot's layer in the other side's rows (explain_aux); a layer list that differs where no slot
#: matches any layer of the other side (another target, other weights) is not claimed as the cause.
VALUE_JUDGED = frozenset({"target.aux", "target.aux_cat"})


def causes_at(stage: str, mismatches: list[ContractMismatch]) -> list[ContractMismatch]:
    """The ``warn``/``error`` mismatches whose fact ``STAGE_CAUSES`` lists for ``stage``, in the
    table's order (the aux-dropped ids, recorded per side, are kept once)."""
    facts = STAGE_CAUSES.get(stage, ())
    found = [m for m in mismatches if m.field in facts and m.severity in ("warn", "error")
             and m.x != "unknown" and m.y != "unknown"]
    return sorted(found, key=lambda m: facts.index(m.field))


__all__ = ["FACTS", "STAGE_CAUSES", "VALUE_ALIASES", "VALUE_JUDGED", "FactRow", "canonical_value",
           "WORDED", "causes_at", "fact_row"]
