"""The known contract fields: name -> (accepted Python types, meaning). ``tracer.contract`` checks a
trace's facts against it (``validate_contract``)."""

from __future__ import annotations

from specdiff.eagle3.aux_layers import AUX_CONCAT_ORDER
from specdiff.eagle3.norms import meaning as norm_meaning

#: every value ``record train`` filled in for an option the user did not give: name -> {value, source}
DEFAULTS_USED = "defaults_used"

_num = (int, float)
_list = (list, tuple)

#: name -> (accepted python types, meaning)
CONTRACT_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "side": ((str,), "'serve' or 'train'"),
    "engine": ((str,), "who recorded: a serving engine registered in tracer/engines ('sglang', 'vllm'), or a "
                       "training side ('specdiff-reference', 'specforge', 'speculators', ...)"),
    "engine_version": ((str,), "version string of the engine"),
    "trainer": ((str,), "training side: the trainer whose own draft class and TTT loop computed the forward "
                        "('specforge', 'speculators'; absent: specdiff's reference, replay/trainers)"),
    "trainer_version": ((str,), "training side: the installed version of that trainer's package"),
    "trainer_class": ((str,), "training side: the trainer's draft class (module.qualname)"),
    "trainer_variants": ((dict,), "training side: fact -> value where the trainer computes what the reference's "
                                  "default does not (e.g. rope_position_offset 1); {} when it agrees"),
    "specforge_contract": ((dict,), "training side: what SpecForge recorded of the run, as read (checkpoint provenance, capture contract), and each disagreement with this recording (replay/record/specforge_contract.py)"),
    "features": ((dict,), "training side recorded from a trainer's stored features (record train --features): "
                          "format, directory, reader, dtype, the capture layers and where they came from, the "
                          "target tensors read (replay/record/record_features.py)"),
    "engine_target": ((dict,), "training side whose target ran in a serving engine (record train --target-backend "
                               "sglang): the engine, device, dtype and server arguments as given, the engine's capture "
                               "ids, the HF indices they capture and where they came from, the slot order "
                               "(replay/record/engine_target.py)"),
    "trainer_config": ((dict,), "training side: what the trainer's own config of the draft says (speculators: "
                                "algorithm, speculative_tokens, verifier, aux ids, norm flags, layer_types)"),
    "num_layers": ((int,), "target decoder layers L"),
    "hidden_size": ((int,), "target hidden size H"),
    "draft_hidden_size": ((int,), "draft hidden size Hd"),
    "vocab_size": ((int,), "target vocab V"),
    "draft_vocab_size": ((int,), "draft vocab Vd"),
    "spec_algorithm": ((str,), "speculative algorithm the draft runs under: 'EAGLE3', 'EAGLE', ..."),
    "aux_hf_indices": (_list, "the aux layers captured, as HF hidden_states indices, ascending"),
    AUX_CONCAT_ORDER: (_list + (str,), "HF index of each aux slot in concat order (slot j = "
                       "target.aux.{j}): SGLang ascending, record train as the user listed; 'unknown' "
                       "when the engine's capture could not be read"),
    "aux_native_ids": (_list + (type(None),), "the ids as configured (None = tool default)"),
    "aux_convention": ((str,), "convention of aux_native_ids (tracer.conventions)"),
    "aux_dropped_ids": (_list, "native ids the engine silently drops"),
    "aux_prenorm_indices": (_list, "entries L of aux_hf_indices whose slot holds the last decoder layer's "
                                   "output before the final norm (SGLang GPT-OSS capture index L, gpt_oss.py:731), "
                                   "which HF hidden_states[L] (after the norm) is not; [] when none"),
    # the norm flags' meanings are written once, in specdiff.eagle3.norms
    "norm_before_fc": ((bool,), norm_meaning("norm_before_fc")),
    "fc_norm": ((bool,), norm_meaning("fc_norm")),
    "norm_output": ((bool,), norm_meaning("norm_output")),
    "norm_before_residual": ((bool,), norm_meaning("norm_before_residual")),
    "d2t_sha256": ((str, type(None)), "sha256 of d2t int64 bytes (None = no d2t: identity)"),
    "t2d_sha256": ((str, type(None)), "sha256 of t2d bool bytes"),
    "hot_token_id_sha256": ((str, type(None)), "sha256 of hot_token_id = d2t + arange (int64)"),
    "draft_weights_sha256": ((str, type(None)), "sha256 over the draft state dict"),
    "embed_source": ((str,), "'draft', 'target' or 'random'"),
    "lm_head_source": ((str,), "'draft', 'target' or 'random'"),
    "embed_sha256": ((str,), "sha256 of the embedding the draft multiplies by (weight_sha256)"),
    "lm_head_sha256": ((str,), "sha256 of the lm_head the draft multiplies by (weight_sha256)"),
    "rope_theta": (_num, "rope base of the draft's attention"),
    "rope_scaling": ((dict, type(None)), "rope scaling of the draft's attention (rope_scaling_fact)"),
    "rope_style": ((str,), "'neox' (rotate halves) or 'gptj' (rotate interleaved pairs)"),
    "draft_attention_window": ((list,), "per draft decoder layer: null (full attention) or {window W: the farthest key "
                               "seen, distance: 'kv' | 'prefix', how it is counted} (eagle3/attention_window.py)"),
    "partial_rotary_factor": (_num, "fraction of each head's dims the draft's rope rotates (SGLang: rotary_dim / "
                                    "head_size of its rotary_emb, srt/models/llama.py:199-200)"),
    "embed_fingerprint": ((str,), "dtype-independent hash of the embedding the draft multiplies by (values rounded "
                                  "through float16 then bfloat16): equal for one checkpoint held in bf16, fp16 or "
                                  "fp32 (replay/diff/contract/check.py WEIGHT_HASHES)"),
    "lm_head_fingerprint": ((str,), "dtype-independent hash of the draft's lm_head (as embed_fingerprint)"),
    "bos_added": ((bool, str, type(None)), "every prompt starts with BOS (False: none does; 'mixed'; None: "
                                          "no prompt) - bos_added_fact"),
    "spec_steps": ((int,), "--speculative-num-steps / TTT steps"),
    "spec_topk": ((int,), "--speculative-eagle-topk"),
    "spec_draft_tokens": ((int,), "--speculative-num-draft-tokens"),
    "dtype": ((str,), "compute dtype of the recorded tensors"),
    "logits_topk": ((int,), "k of draft.logits_topk.* at the capture level"),
    "capture_level": ((str,), "'default' or 'full'"),
    "tokenizer_sha256": ((str, type(None)), "sha256 of tokenizer.json"),
    "chat_template_sha256": ((str, type(None)), "sha256 of the chat template"),
    "graph_hidden_stages": (_list, "stages that CUDA graphs hid from the recorder"),
    "unrecorded_stages": ((dict,), "tensor -> why this recorder could not observe it (a CUDA graph, "
                                   "a module the engine's draft lacks); the app shows the reason"),
    "depth_coverage": ((str,), "which positions have draft rows at depth >= 1, in words (serving drafts "
                               "only from the last accepted position of each step)"),
    "dropped_records": ((int,), "records the recorder dropped because the writer fell behind"),
    "recorder_hook_s": (_num, "seconds the serving recorder's hooks ran inside the engine's iterations "
                              "(its cost on the serving path; benchmarks/recorder_overhead.py)"),
    "recorder_iter_s": (_num, "seconds the recorded iterations took, hooks included"),
    "recorder_writer_s": (_num, "seconds the background writer (thread, or process: tracer/engines/writer/child.py) "
                                "spent writing the store"),
    "recorder_writer_cpu_s": (_num, "CPU seconds the recorder's writer process spent after start-up (off the server's process)"),
    "recorder_caught_up_at": (_num + (type(None),), "unclosed traces only: a moment (the writer's Unix seconds) before "
                                                    "which the writer process had written every capture handed to it, "
                                                    "from its last journal 'progress' entry; None: it has written all "
                                                    "it will (replay/watch/follow.py settles requests on it)"),
    "engine_process_start": ((str,), "how the engine process the recorder ran in was started, read there: "
                                     "multiprocessing's start method ('spawn': SGLang 0.5.23's own, "
                                     "srt/entrypoints/engine.py:1995; 'fork': specdiff's CPU launcher with "
                                     "SPECDIFF_SGLANG_START=fork, tracer/engines/sglang/cpu/serve.py)"),
    "recorder_writer": ((dict,), "which writer the serving recorder ran, read off the live writer: {'kind': "
                                 "'process' (rows built in a writer process fed through a shared-memory ring) or "
                                 "'thread' (in the server's process), 'ring_bytes' (the ring's size; None for the "
                                 "thread), 'why' (why the thread ran: 'SPECDIFF_WRITER=thread' or 'no shared-memory "
                                 "ring: <error>'; None for the process), 'queue_bytes' (the thread's queue bound; None for the process or a lossless queue), "
                                 "'nice' and 'autogroup_nice' (the writer's niceness and its session's, read back "
                                 "after setting: None where unreadable or no autogroup), 'nice_why' (why it is not "
                                 "the writer process's nice 19, None when it is)} (tracer/engines/writer/thread.py facts())"),
    "sampling": ((dict,), "how requests were chosen for recording: {'fraction', 'marker', 'rids'} "
                          "(tracer/engines/requests.py RequestSampler)"),
    "sampled_requests": ((dict,), "rid -> why it was recorded: 'all', 'fraction' (blake2b draw < fraction) "
                                  "or 'marked' (the client's custom_params.specdiff_record)"),
    "dropped_requests": (_list, "rids the recorder dropped whole because its writer fell behind (rows "
                                "written before the drop stay; later ones are not recorded)"),
    "findings": (_list, "pre-flight contract findings (specdiff check)"),
    "model_name": ((str,), "target model path or name"),
    DEFAULTS_USED: ((dict,), "options the recorder filled in: name -> {'value': ..., 'source': where "
                    "the value came from}"),
    "draft_name": ((str,), "draft model path or name"),
    "unknown_reasons": ((dict,), "facts read but not settled: {field: {why, fix}} (vLLM's draft_attention_window)"),
    "unobservable": (_list, "engine names the recorder could not find: [{name, <engine>, source, tensors, facts, "
                            "why, <engine>_version}], <engine> being the trace's engine fact ('sglang': "
                            "{..., sglang: dotted path, sglang_version}; 'vllm': {..., vllm, vllm_version}) "
                            "(tracer/engines/names.py EngineAdapter.unobservable; read back: unobservable_engine)"),
    # ---- facts only some engines record (vLLM 0.32: tracer/engines/vllm/contract.py) ----------------
    "engine_runner": ((str,), "the engine's model runner that ran, '<runner> <module>.<Class>' (vLLM: 'v1 "
                              "vllm.v1.worker.cpu_model_runner.CPUModelRunner'; only V1 is hooked: a 'v2 ...' "
                              "runner means nothing per step was recorded)"),
    "aux_ids_source": ((str,), "where the engine took the aux ids from, in its own key precedence: a config key "
                               "('top-level eagle_aux_hidden_state_layer_ids', 'eagle_config."
                               "eagle_aux_hidden_state_layer_ids', ...) or, starting with 'default', the "
                               "engine's fallback when no key it reads held ids (AUX_IDS_DEFAULT_PREFIX)"),
    "aux_id_rule": ((str,), "the engine's aux-id convention in words, with its source lines (vLLM: id k = HF "
                            "hidden_states[k], deduplicated, ascending)"),
    "d2t_rule": ((str,), "how the engine maps draft-vocab logits to target ids, with its source lines (vLLM: "
                         "scattered into the full vocab at arange(Vd) + d2t)"),
    "draft_class": ((str,), "dotted class of the draft model the engine built (vLLM: 'vllm.model_executor."
                            "models.llama_eagle3.Eagle3LlamaForCausalLM')"),
    "draft_num_aux": ((int,), "aux hidden states the draft's fc takes (its input width / hidden size); a count "
                              "that differs from the captured slots crashes the first request"),
    "target_architecture": ((str,), "the target model class the engine instantiated, named after the HF "
                                    "architecture it serves (SGLang: type(ModelRunner.model).__name__, "
                                    "e.g. 'DeepseekV3ForCausalLM'; training: config.architectures[0])"),
    "target_config_sha256": ((str,), "config_sha256 of the target's config as the engine loaded it: canonical "
                                     "JSON of its to_dict() without CONFIG_UNHASHED_KEYS (provenance and what "
                                     "SGLang adds)"),
    "target_num_experts": ((int, type(None)), "routed experts per MoE layer of the target (None: dense)"),
    "target_experts_per_token": ((int, type(None)), "experts each token is routed to (top-k; None: dense)"),
    "aux_capture_rule": ((str,), "whose set_eagle3_layers_to_capture turned the draft's aux ids into the "
                                 "captured layers: 'sglang srt/models/<file>.py:<line> <Class>.<method>' "
                                 "(plus the wrapper it was reached through); 'none' when the target has none"),
    "target_weights_fingerprint": ((str,), "weights_fingerprint of the target's input embedding: the same "
                                           "checkpoint in bf16 or fp32 gives the same value"),
    "crash": ((dict,), "the exception that stopped the engine: {type, message, forward, shapes, "
                       "traceback} (written before the process died)"),
    # ---- read whole from the live objects (tracer/config_facts.py, tracer/weight_facts.py): every key ----
    "draft_config": ((dict,), "every key of the draft's config as the engine or trainer built it (its to_dict(), "
                              "defaults filled in), JSON-safe"),
    "target_config": ((dict,), "every key of the target's config as the engine or trainer built it"),
    "engine_options": ((dict,), "every field of the engine's argument object as resolved (SGLang: ServerArgs."
                                "resolved_dict(); vLLM: its VllmConfig's configs; record train: its options)"),
    "engine_options_given": ((dict,), "the options the operator gave: field -> {'value', 'default'} (raw "
                                      "ServerArgs fields that differ from their defaults)"),
    "draft_structure": ((dict,), "the draft as built: parameter name -> '<shape> <dtype>' (the engine's names)"),
    "target_structure": ((dict,), "the target as built, per unit (decoder layer): unit -> '<n> params sha <digest>'"),
    "draft_weights": ((dict,), "checkpoint tensor name -> tensor_fingerprint of the draft's checkpoint, read on the "
                               "load path (tracer/weight_facts.py)"),
    "target_weights": ((dict,), "unit (decoder layer, or module) -> fingerprint of the target checkpoint's tensors "
                                "in it, read on the load path (weight_facts.unit_fingerprints)"),
    "draft_layer_input_norms": ((dict,), "layers.{i} (i >= 1) -> fingerprint of the norm weight that later layer "
                                         "normalises its input with, read off the live model by the side's rule"),
    "draft_unloaded": (_list, "draft parameters the model built that its checkpoint did not provide: their values "
                              "left as allocated"),
    "target_unloaded": (_list, "target parameters the model built that its checkpoint did not provide"),
    # ---- state besides the parameters, read off the live models after loading (tracer/state_facts.py) ----
    "draft_buffers": ((dict,), "serving: every registered buffer of the draft as live after loading, persistent "
                               "or not: buffer name (the engine's module path; a shared buffer under each) -> "
                               "tensor_fingerprint, 'meta' (no storage) or 'unknown'; between traces of one "
                               "engine only (record train's are covered by draft_rope / d2t_sha256)"),
    "target_buffers": ((dict,), "every registered buffer of the target as live after loading (as draft_buffers)"),
    "draft_rope": ((dict,), "layers.{i} -> fingerprint of the rope table draft layer i applies, in one layout on "
                            "every side: cat(cos, sin) [P, rotary_dim], positions 0..P-1, P = min(4096, "
                            "max_position_embeddings) (SGLang: the rotary's cos_sin_cache; training: computed "
                            "as its forward does); 'unknown' per layer where unreadable"),
    "target_rope": ((dict,), "layers.{i} -> fingerprint of the rope table target layer i applies (as draft_rope)"),
    "draft_rope_shared": ((dict,), "serving: layers.{i} of each draft layer whose rotary module is a target layer's own "
                                   "object -> that target layer (SGLang 0.5.23 get_rope caches one rotary per "
                                   "rope setting, srt/layers/rotary_embedding/factory.py:158-170); {} when none"),
    "target_config_overrides": ((dict,), "config key an engine option overrode -> {'value': as the engine built "
                                         "with, 'source': the option ('json_model_override_args', "
                                         "'context_length'; vLLM 'hf_overrides')}; 'context_len' is SGLang's "
                                         "context length when --context-length gave it; {} when none"),
    "draft_config_overrides": ((dict,), "the draft's config keys an engine option overrode (as "
                                        "target_config_overrides)"),
    "draft_input_ids_vocab": ((str,), "the vocabulary of draft.input_ids (what a draft step is fed): 'target' "
                                      "(target ids: SGLang after hot_token_id, eagle_worker_v2.py:757-758, "
                                      ":897-898; vLLM after compute_logits' d2t scatter; training the token "
                                      "sequence) or 'draft' (draft-vocab ids, before any map)"),
}

__all__ = ["CONTRACT_FIELDS", "DEFAULTS_USED"]
