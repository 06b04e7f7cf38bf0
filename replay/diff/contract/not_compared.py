"""What the diff never compares (``NOT_COMPARED``): provenance, recorder bookkeeping, results, facts
compared as another fact, and engine options known not to change the computation. Every other fact that
differs is named (contract/fact_diff.py), by its row of contract/facts.py ``FACTS`` or as unlisted."""

from __future__ import annotations

from fnmatch import fnmatchcase

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
                          "disagreement a warning of that side (contract/check.py)",
    "trainer_*": "the trainer's version, class, own config and variants: what they change is compared as the stages",
    "request_prefill": "per request", "crash": "reported on its own", "unrecorded_stages": "recorder coverage",
    "engine_process_start": "how the engine's process was started (spawn or fork: the same computation)",
    "graph_hidden_stages": "recorder coverage", "depth_coverage": "recorder coverage", "capture_level": "recorder",
    "probe_positions": "recorder", "engine_options.probe_positions": "recorder (layer probes are evidence)",
    "bos_token_id": "read as bos_added",
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
    "target_architecture": "target identity (refused when the weights differ too: check.one_target_config)",
    "draft_rope_shared": "which target rotary a served draft layer shares (read with draft_rope)",
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


def not_compared(key: str) -> str | None:
    """Why ``key`` is never compared (``NOT_COMPARED``), or None when it is compared."""
    for pattern, why in NOT_COMPARED.items():
        if key == pattern or fnmatchcase(key, pattern):
            return why
    return None


__all__ = ["NOT_COMPARED", "not_compared"]
