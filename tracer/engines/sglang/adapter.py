"""Every SGLang name the recorder touches, declared once, checked against the running SGLang.

The recorder (tracer/engines/sglang/plugin.py, tracer/engines/sglang/hooks.py) reads SGLang's private objects:
hook targets, private methods, dataclass fields, attributes set in ``__init__``, the locals of
the scheduler's entry function. A rename in a new SGLang release must not turn into silently
missing rows or a contract fact filled in from elsewhere. So:

- ``NAMES`` declares each name with what it is used for, the tensors (stages) and contract
  facts that depend on it, and the SGLang 0.5.23 source it comes from.
- ``SGLangAdapter.check_static`` (plugin load, scheduler process) resolves every class,
  function, method and dataclass field by import + ``hasattr``; ``check_instance`` checks
  attributes that only exist on instances where they are first seen (worker init, first batch).
- A missing name is logged ONCE: ``specdiff: SGLang <version> has no <name> (<source>): now
  unobservable: tensors ...; contract facts ...``. The facts it feeds are recorded as
  ``"unknown"`` and the contract field ``unobservable`` lists the name, tensors and facts.
- Hooks read through ``SGLangAdapter.get`` (never ``getattr(x, name, None)``): an absent
  attribute is ``MISSING`` (logged, marked), a present attribute that is None stays None.

The machinery (``EngineName``, ``EngineAdapter``, ``MISSING``) is engine-independent and lives in
tracer/engines/names.py; this module holds SGLang's table (the target layouts it declares: ``layouts``).

Sources are paths under ``site-packages/sglang/`` of SGLang 0.5.23. ``SGLANG.tested_range``
(``specdiff.eagle3.engines``) is the inclusive range of SGLang versions this table was verified on;
outside it the plugin warns once.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable

from specdiff.eagle3.engines import SGLANG
from specdiff.tracer.engines.names import EngineAdapter, EngineName
from specdiff.tracer.engines.sglang.layouts import (
    INNER_ATTRS,
    LAYOUT_USE,
    OUTER_ATTRS,
    TARGET_LAYOUTS,
    TARGET_WRAPPERS,
)

logger = logging.getLogger("specdiff.tracer")


_P = "sglang.srt."
_EW2 = _P + "speculative.eagle_worker_v2"


_ALL_DRAFT = ("tokens", "draft.input_ids", "draft.fc_in", "draft.fc_out", "draft.hidden_out", "draft.logits",
              "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp")
_VERIFY = ("verify.accept_length", "verify.accept_index", "verify.accepted_tokens", "verify.predict",
           "target.argmax")
_TARGET = ("target.aux.{j}", "target.aux_cat")
_EVERYTHING = ("every tensor",)


def _n(key, owner, kind, source, used_for, *, attr=None, tensors=(), facts=(), hook=None,
       essential=False, optional=False) -> EngineName:
    return EngineName(key=key, owner=owner, attr=attr or key.rsplit(".", 1)[1], kind=kind, source=source,
                      used_for=used_for, tensors=tuple(tensors), facts=tuple(facts), hook=hook,
                      essential=essential, optional=optional)


def _target_layout_names() -> tuple[EngineName, ...]:
    """The NAMES entries of every TARGET_LAYOUTS / TARGET_WRAPPERS attribute (each once)."""
    out: dict[str, EngineName] = {}
    for lay in {id(v): v for v in TARGET_LAYOUTS.values()}.values():
        for attr in (*OUTER_ATTRS, *INNER_ATTRS):
            used_for, facts = LAYOUT_USE[attr]
            owner = lay.outer if attr in OUTER_ATTRS else lay.inner
            if attr == "layers_to_capture" and lay.final_capture:
                used_for += f"; index end_layer captures the residual after the last layer ({lay.final_capture})"
            out.setdefault(lay.key(attr), _n(lay.key(attr), owner, "instance", lay.sources[attr], used_for,
                                             facts=facts))
        key = f"{lay.outer_name}.set_eagle3_layers_to_capture"
        out[key] = _n(key, lay.outer, "method", lay.rule, "the family's rule from the draft's aux ids to "
                      "layers_to_capture (the contract names the one that ran)", facts=("aux_capture_rule",))
    for name, (owner, attr, source) in TARGET_WRAPPERS.items():
        out[f"{name}.{attr}"] = _n(f"{name}.{attr}", owner, "instance", source,
                                   "the inner language model a wrapper's EAGLE-3 methods delegate to",
                                   attr=attr, facts=("aux_hf_indices", "embed_source", "lm_head_source",
                                                     "target_num_experts", "aux_capture_rule"))
    return tuple(out.values())


#: Every SGLang name the recorder touches (SGLang 0.5.23, EAGLE worker v2).
NAMES: tuple[EngineName, ...] = (
    # ---- hook targets ----------------------------------------------------------------------
    _n("EagleDraftWorker.alloc_memory_pool", f"{_EW2}.EagleDraftWorker", "hook",
       "srt/speculative/eagle_worker_v2.py:243", "build the contract and open the trace at start-up, before "
       "any request: here SGLang has set hot_token_id and shared the target's embedding / lm_head "
       "(init_token_map, init_lm_head); at EAGLEWorkerV2.__init__ it has not",
       tensors=_EVERYTHING, hook=("AFTER", "_after_draft_alloc"), essential=True),
    _n("DefaultModelLoader.load_weights_only", _P + "model_loader.loader.DefaultModelLoader", "hook",
       "srt/model_loader/loader.py:1033", "the load path of target and draft: fingerprint each checkpoint tensor "
       "the weight iterator yields and note which parameters the loading wrote (tracer/weight_facts.py LoadWatch)",
       facts=("draft_weights", "target_weights", "draft_unloaded", "target_unloaded"),
       hook=("AROUND", "_around_load_weights")),
    _n("ServerArgs.resolved_dict", _P + "server_args.ServerArgs", "method", "srt/server_args.py:316",
       "every ServerArgs field as resolved (the engine_options fact)", facts=("engine_options",)),
    _n("EAGLEWorkerV2.forward_batch_generation", f"{_EW2}.EAGLEWorkerV2", "hook",
       "srt/speculative/eagle_worker_v2.py:1416", "one recorded iteration (prefill or decode) per call; "
       "the crash record when it raises", tensors=_EVERYTHING, hook=("AROUND", "_around_iteration"),
       essential=True),
    _n("TpModelWorker.forward_batch_generation", _P + "managers.tp_worker.TpModelWorker", "hook",
       "srt/managers/tp_worker.py:622", "the target forward's aux hidden states and prefill next token",
       tensors=(*_TARGET, "target.argmax", "target.logits_topk.values", "target.logits_topk.ids"),
       hook=("AFTER", "_after_target_forward")),
    _n("ModelRunner.forward", _P + "model_executor.model_runner.ModelRunner", "hook",
       "srt/model_executor/model_runner.py:1813", "every draft forward (extend, draft extend v2, decode): "
       "input ids, positions, fc, hidden, logits", tensors=_ALL_DRAFT, hook=("AROUND", "_around_runner_forward")),
    _n("EagleDraftWorker._draft_extend_for_prefill", f"{_EW2}.EagleDraftWorker", "hook",
       "srt/speculative/eagle_worker_v2.py:961", "the draft's depth-0 top-k after the prefill draft extend",
       tensors=("draft.topk",), hook=("AFTER", "_after_de_prefill")),
    _n("EagleDraftWorker._draft_extend_for_decode", f"{_EW2}.EagleDraftWorker", "hook",
       "srt/speculative/eagle_worker_v2.py:1110", "the draft's depth-0 top-k after the decode draft extend",
       tensors=("draft.topk",), hook=("AFTER", "_after_de_decode")),
    _n("spec_utils.select_top_k_tokens", _P + "speculative.spec_utils", "hook",
       "srt/speculative/spec_utils.py:474", "the mapped (target-vocab) draft ids of each draft step",
       tensors=("draft.topk_target",), hook=("AFTER", "_after_select_top_k")),
    _n("eagle_worker_common.build_eagle_verify_input", _P + "speculative.eagle_worker_common", "hook",
       "srt/speculative/eagle_worker_common.py:377", "the draft tree sent to verify and its positions",
       tensors=("verify.draft_tokens", "verify.retrieve_index", "verify.parents"),
       hook=("AFTER", "_after_build_verify")),
    _n("eagle_utils.eagle_sample", _P + "speculative.eagle_utils", "hook",
       "srt/speculative/eagle_utils.py:521", "verify's predictions, accept lengths and accepted indices "
       "(which also place the decode target rows)", tensors=(*_VERIFY, *_TARGET, "tokens"),
       hook=("AFTER", "_after_eagle_sample")),
    _n("EagleDraftWorker._capture_cuda_graphs", f"{_EW2}.EagleDraftWorker", "hook",
       "srt/speculative/eagle_worker_v2.py:476", "last start-up step (after the target's init_attention_backends "
       "set layers_to_capture, model_runner.py:1105): read the aux capture and which draft stages the captured "
       "CUDA graphs hide; SPECDIFF_EAGER_DRAFT=1 drops the graphs so every draft stage runs eagerly",
       facts=("graph_hidden_stages", "aux_hf_indices", "aux_dropped_ids", "aux_concat_order"),
       hook=("AFTER", "_after_capture_graphs")),
    # ---- hook argument layouts ---------------------------------------------------------------
    _n("select_top_k_tokens(i, topk_p, topk_index)", _P + "speculative.spec_utils.select_top_k_tokens",
       "param", "srt/speculative/spec_utils.py:474", "positional layout (i, topk_p, topk_index) the hook reads",
       attr="topk_index", tensors=("draft.topk_target",)),
    _n("_draft_extend_for_decode(batch, batch_result)", f"{_EW2}.EagleDraftWorker._draft_extend_for_decode",
       "param", "srt/speculative/eagle_worker_v2.py:1110", "positional layout (self, batch, batch_result)",
       attr="batch_result", tensors=("draft.topk",)),
    # ---- the scheduler's frame (tp_rank / dp_rank) ----------------------------------------------
    _n("scheduler.run_scheduler_process", _P + "managers.scheduler", "method", "srt/managers/scheduler.py:6310",
       "the call-stack walk finds this frame: the plugin records only in the scheduler process",
       tensors=_EVERYTHING, essential=True),
    _n("run_scheduler_process.tp_rank", _P + "managers.scheduler.run_scheduler_process", "param",
       "srt/managers/scheduler.py:6314", "record on TP rank 0 only (read from the scheduler frame's locals)",
       attr="tp_rank", tensors=_EVERYTHING, essential=True),
    _n("run_scheduler_process.dp_rank", _P + "managers.scheduler.run_scheduler_process", "param",
       "srt/managers/scheduler.py:6316", "data-parallel replica r > 0 writes <trace>.dp<r>",
       attr="dp_rank", facts=("trace path of DP replicas",)),
    # ---- EAGLE worker (contract at init) -------------------------------------------------------
    _n("BaseSpecWorker.draft_worker", _P + "speculative.base_spec_worker.BaseSpecWorker", "method",
       "srt/speculative/base_spec_worker.py:207", "the EagleDraftWorker of an EAGLEWorkerV2 (when the trace is "
       "opened at the first iteration instead of at alloc_memory_pool)", tensors=_EVERYTHING),
    _n("EagleDraftWorker.target_worker", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:191", "the target TpModelWorker (its runner, config, model)",
       facts=("num_layers", "hidden_size", "vocab_size", "dtype", "aux_hf_indices")),
    _n("EagleDraftWorker.speculative_num_steps", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:198", "draft steps of the contract", facts=("spec_steps",)),
    _n("EagleDraftWorker.topk", f"{_EW2}.EagleDraftWorker", "instance", "srt/speculative/eagle_worker_v2.py:195",
       "tree width: rows per (seq, pos, depth) of the draft steps", facts=("spec_topk",),
       tensors=("draft.topk", "draft.topk_target")),
    _n("EagleDraftWorker.speculative_num_draft_tokens", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:199", "draft tokens per verify", facts=("spec_draft_tokens",)),
    _n("EagleDraftWorker.server_args", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:188", "model paths of the contract (pre-flight check in diff)",
       facts=("model_name", "draft_name")),
    _n("ServerArgs.model_path", _P + "server_args.ServerArgs", "field", "srt/server_args.py",
       "the target's path", facts=("model_name",)),
    _n("ServerArgs.speculative_draft_model_path", _P + "server_args.ServerArgs", "field", "srt/server_args.py",
       "the draft's path", facts=("draft_name",)),
    _n("ServerArgs.port", _P + "server_args.ServerArgs", "field", "srt/arg_groups/fields/serving.py:66",
       "register <port> -> trace so `specdiff record client` can name the trace of a server that died",
       facts=("trace of a dead server found by record client",)),
    _n("TpModelWorker.model_runner", _P + "managers.tp_worker.TpModelWorker", "method",
       "srt/managers/tp_worker.py:87", "the target's ModelRunner",
       facts=("num_layers", "hidden_size", "vocab_size", "dtype", "aux_hf_indices")),
    _n("EagleDraftWorker.draft_runner", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:235", "the draft's ModelRunner (config, model)",
       facts=("draft_hidden_size", "norm_before_fc", "fc_norm")),
    _n("EagleDraftWorker.hot_token_id", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:330", "the draft->target id map SGLang applies (d2t + arange)",
       facts=("d2t_sha256", "hot_token_id_sha256", "draft_vocab_size"), tensors=("draft.d2t",)),
    _n("EagleDraftWorker.cuda_graph_runner", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:478", "which draft-decode stages a CUDA graph hides",
       facts=("graph_hidden_stages",)),
    _n("EagleDraftWorker.cuda_graph_runner_for_draft_extend", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:479", "which draft-extend stages a CUDA graph hides",
       facts=("graph_hidden_stages",)),
    _n("ModelRunner.model_config", _P + "model_executor.model_runner.ModelRunner", "instance",
       "srt/model_executor/model_runner.py:367", "hf_config and dtype of target and draft",
       facts=("num_layers", "hidden_size", "vocab_size", "draft_hidden_size", "dtype", "aux_native_ids")),
    _n("ModelRunner.model", _P + "model_executor.model_runner.ModelRunner", "instance",
       "srt/model_executor/model_runner.py:1321", "the nn.Module of target / draft",
       facts=("aux_hf_indices", "norm_before_fc", "fc_norm"), tensors=("draft.fc_in", "draft.fc_out")),
    _n("ModelRunnerOutput.logits_output", _P + "model_executor.model_runner.ModelRunnerOutput", "field",
       "srt/model_executor/model_runner.py:299", "what a draft forward returned (hidden, logits)",
       tensors=("draft.hidden_out", "draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids",
                "draft.logsumexp", "draft.topk")),
    _n("ModelRunner.is_draft_worker", _P + "model_executor.model_runner.ModelRunner", "instance",
       "srt/model_executor/model_runner.py:370", "tell the draft's forwards from the target's",
       tensors=_ALL_DRAFT),
    _n("ModelConfig.hf_config", _P + "configs.model_config.ModelConfig", "instance",
       "srt/configs/model_config.py", "dims of target and draft; the draft's configured aux ids",
       facts=("num_layers", "hidden_size", "vocab_size", "draft_hidden_size", "aux_native_ids")),
    _n("ModelConfig.dtype", _P + "configs.model_config.ModelConfig", "instance", "srt/configs/model_config.py",
       "compute dtype", facts=("dtype",)),
    _n("ModelConfig.model_override_args", _P + "configs.model_config.ModelConfig", "instance",
       "srt/configs/model_config.py:612", "the parsed --json-model-override-args the config was built with",
       facts=("target_config_overrides", "draft_config_overrides")),
    _n("ModelConfig.context_len", _P + "configs.model_config.ModelConfig", "instance",
       "srt/configs/model_config.py:1291-1325", "the context length the engine settled",
       facts=("target_config_overrides", "draft_config_overrides")),
    _n("ServerArgs.context_length", _P + "server_args.ServerArgs", "field", "srt/arg_groups/fields/model.py:110",
       "the operator's --context-length (None: the config's)", facts=("target_config_overrides",
                                                                       "draft_config_overrides")),
    *_target_layout_names(),
    _n("LlamaForCausalLMEagle3.model", _P + "models.llama_eagle3.LlamaForCausalLMEagle3", "instance",
       "srt/models/llama_eagle3.py:292", "the draft's inner model (fc, norms)",
       facts=("norm_before_fc", "fc_norm"), tensors=("draft.fc_in", "draft.fc_out")),
    _n("LlamaForCausalLMEagle3.hot_token_id", _P + "models.llama_eagle3.LlamaForCausalLMEagle3", "instance",
       "srt/models/llama_eagle3.py:323", "d2t + arange as loaded (when the worker has none)",
       facts=("d2t_sha256", "hot_token_id_sha256")),
    _n("Eagle3LlamaModel.fc", _P + "models.llama_eagle3.LlamaModel", "instance", "srt/models/llama_eagle3.py:163",
       "forward hook on fc: its input (aux concat after norms) and output",
       tensors=("draft.fc_in", "draft.fc_out")),
    _n("Eagle3LlamaModel.norm_before_fc", _P + "models.llama_eagle3.LlamaModel", "instance",
       "srt/models/llama_eagle3.py:173", "whether one RMSNorm is applied to the aux concat before fc",
       facts=("norm_before_fc",)),
    _n("Eagle3LlamaModel.fc_norm", _P + "models.llama_eagle3.LlamaModel", "instance",
       "srt/models/llama_eagle3.py:189", "per-aux-slot RMSNorms before fc (None = off)", facts=("fc_norm",)),
    # ---- what decides the draft's computation (contract facts) ---------------------------------
    _n("EagleDraftWorker.speculative_algorithm", f"{_EW2}.EagleDraftWorker", "instance",
       "srt/speculative/eagle_worker_v2.py:200", "the algorithm the draft runs under (EAGLE skips fc)",
       facts=("spec_algorithm",)),
    _n("Eagle3LlamaModel.norm_output", _P + "models.llama_eagle3.LlamaModel", "instance",
       "srt/models/llama_eagle3.py:207", "whether the hidden fed to the next depth is the normed one",
       facts=("norm_output",)),
    _n("Eagle3LlamaModel.embed_tokens", _P + "models.llama_eagle3.LlamaModel", "instance",
       "srt/models/llama_eagle3.py:145", "the embedding the draft multiplies by (init_lm_head shares the "
       "target's)", facts=("embed_sha256", "embed_source")),
    _n("LlamaForCausalLMEagle3.lm_head", _P + "models.llama_eagle3.LlamaForCausalLMEagle3", "instance",
       "srt/models/llama_eagle3.py:309", "the lm_head the draft multiplies by", facts=("lm_head_sha256", "lm_head_source")),
    _n("VocabParallelEmbedding.weight", _P + "layers.vocab_parallel_embedding.VocabParallelEmbedding",
       "instance", "srt/layers/vocab_parallel_embedding.py:188", "embedding / lm_head rows (created by the "
       "quant method's create_weights)", facts=("embed_sha256", "lm_head_sha256", "embed_source", "lm_head_source")),
    _n("Eagle3LlamaModel.layers", _P + "models.llama_eagle3.LlamaModel", "instance",
       "srt/models/llama_eagle3.py:198", "the draft's decoder layer (its attention's rope); forward pre-hook on "
       "layers[0]: the hidden it is fed (draft_stages)",
       tensors=("draft.hidden_in", "draft.positions", "draft.attn_in"), facts=("rope_theta", "rope_scaling", "rope_style")),
    _n("LlamaDecoderLayer.self_attn", _P + "models.llama.LlamaDecoderLayer", "instance", "srt/models/llama.py:342",
       "the draft layer's attention; forward pre-hook: its keyword inputs positions and hidden_states",
       tensors=("draft.positions", "draft.attn_in"), facts=("rope_theta", "rope_scaling", "rope_style")),
    _n("Eagle3LlamaModel.norm", _P + "models.llama_eagle3.LlamaModel", "instance", "srt/models/llama_eagle3.py:206",
       "the draft's final norm; forward hook: output[1] is the pre-norm midlayer output (called at :263)",
       tensors=("draft.hidden_out",)),
    _n("Eagle3LlamaDecoderLayer.forward(hidden_states)", _P + "models.llama_eagle3.LlamaDecoderLayer.forward",
       "param", "srt/models/llama_eagle3.py:88", "the third positional argument the hidden_in tap reads",
       attr="hidden_states", tensors=("draft.hidden_in",)),
    _n("LlamaAttention.forward(positions)", _P + "models.llama.LlamaAttention.forward", "param",
       "srt/models/llama.py:264", "keyword the draft.positions tap reads (the rope positions)",
       attr="positions", tensors=("draft.positions",)),
    _n("LlamaAttention.forward(hidden_states)", _P + "models.llama.LlamaAttention.forward", "param",
       "srt/models/llama.py:264", "keyword the draft.attn_in tap reads (cat of both normed halves)",
       attr="hidden_states", tensors=("draft.attn_in",)),
    _n("LlamaAttention.rotary_emb", _P + "models.llama.LlamaAttention", "instance", "srt/models/llama.py:225",
       "the rope the draft's attention applies (get_rope)", facts=("rope_theta", "rope_scaling", "rope_style")),
    _n("LlamaAttention.attn", _P + "models.llama.LlamaAttention", "instance", "srt/models/llama.py:233",
       "the draft layer's RadixAttention (its window)", facts=("draft_attention_window",)),
    _n("RadixAttention.sliding_window_size", _P + "layers.radix_attention.RadixAttention", "instance",
       "srt/layers/radix_attention.py:90", "the window the attention backend applies (-1: none); set on every "
       "draft layer from --speculative-draft-window-size (llama_eagle3.py:297-299)", facts=("draft_attention_window",)),
    _n("RotaryEmbedding.base", _P + "layers.rotary_embedding.base.RotaryEmbedding", "instance",
       "srt/layers/rotary_embedding/base.py:106", "rope theta as applied", facts=("rope_theta",)),
    _n("RotaryEmbedding.is_neox_style", _P + "layers.rotary_embedding.base.RotaryEmbedding", "instance",
       "srt/layers/rotary_embedding/base.py:107", "rotate halves (neox) or interleaved pairs (gptj)",
       facts=("rope_style",)),
    # llama.py:199-200 builds rotary_dim = partial_rotary_factor * head_dim; the rope keeps both
    _n("RotaryEmbedding.rotary_dim", _P + "layers.rotary_embedding.base.RotaryEmbedding", "instance",
       "srt/layers/rotary_embedding/base.py:104", "dims the rope rotates (partial_rotary_factor * head_dim)",
       facts=("partial_rotary_factor",)),
    _n("RotaryEmbedding.head_size", _P + "layers.rotary_embedding.base.RotaryEmbedding", "instance",
       "srt/layers/rotary_embedding/base.py:103", "head dim the rope's rotary_dim is a part of",
       facts=("partial_rotary_factor",)),
    _n("LinearScalingRotaryEmbedding.scaling_factors", _P + "layers.rotary_embedding.base.LinearScalingRotaryEmbedding",
       "instance", "srt/layers/rotary_embedding/base.py:642", "linear rope scaling factor", facts=("rope_scaling",)),
    _n("Llama3RotaryEmbedding.scaling_factor", _P + "layers.rotary_embedding.rope_variant.Llama3RotaryEmbedding",
       "instance", "srt/layers/rotary_embedding/rope_variant.py:571", "llama3 rope scaling factor",
       facts=("rope_scaling",)),
    _n("Llama3RotaryEmbedding.low_freq_factor", _P + "layers.rotary_embedding.rope_variant.Llama3RotaryEmbedding",
       "instance", "srt/layers/rotary_embedding/rope_variant.py:572", "llama3 rope low_freq_factor",
       facts=("rope_scaling",)),
    _n("Llama3RotaryEmbedding.high_freq_factor", _P + "layers.rotary_embedding.rope_variant.Llama3RotaryEmbedding",
       "instance", "srt/layers/rotary_embedding/rope_variant.py:573", "llama3 rope high_freq_factor",
       facts=("rope_scaling",)),
    _n("Llama3RotaryEmbedding.orig_max_position", _P + "layers.rotary_embedding.rope_variant.Llama3RotaryEmbedding",
       "instance", "srt/layers/rotary_embedding/rope_variant.py:574", "llama3 rope original max position",
       facts=("rope_scaling",)),
    _n("runtime_context.get_serving", _P + "runtime_context", "method", "srt/runtime_context.py:1346",
       "the resolved serving config (ServerArgs keeps the raw flags: tokenizer_path stays None there)",
       facts=("tokenizer_sha256", "chat_template_sha256")),
    _n("serving.tokenizer_path", _P + "runtime_context._ConfigBag", "instance", "srt/arg_groups/serving_hook.py:636",
       "the tokenizer SGLang's tokenizer process loads (resolved: --tokenizer-path or the model path)",
       facts=("tokenizer_sha256", "chat_template_sha256")),
    _n("serving.chat_template", _P + "runtime_context._ConfigBag", "instance", "srt/arg_groups/fields/serving.py:176",
       "a --chat-template override (applied in the tokenizer process, not read here)",
       facts=("chat_template_sha256",)),
    # ---- per-iteration objects ---------------------------------------------------------------
    _n("ScheduleBatch.reqs", _P + "managers.schedule_batch.ScheduleBatch", "field",
       "srt/managers/schedule_batch.py:2460", "the requests of the iteration (rids, prompts)",
       tensors=_EVERYTHING, essential=True),
    _n("ScheduleBatch.forward_iter", _P + "managers.schedule_batch.ScheduleBatch", "field",
       "srt/managers/schedule_batch.py:2514", "the iteration number (iter key); else the recorder counts "
       "its own calls", facts=("iter keys are SGLang's forward_iter",)),
    _n("ScheduleBatch.forward_mode", _P + "managers.schedule_batch.ScheduleBatch", "field",
       "srt/managers/schedule_batch.py:2588", "prefill (extend) or decode", tensors=_EVERYTHING, essential=True),
    _n("ScheduleBatch.prefix_lens", _P + "managers.schedule_batch.ScheduleBatch", "field",
       "srt/managers/schedule_batch.py:2647", "prefill row positions (radix-cache prefix)",
       tensors=("prefill rows of every tensor",)),
    _n("ScheduleBatch.extend_lens", _P + "managers.schedule_batch.ScheduleBatch", "field",
       "srt/managers/schedule_batch.py:2648", "prefill rows per request",
       tensors=("prefill rows of every tensor",)),
    _n("ScheduleBatch.seq_lens", _P + "managers.schedule_batch.ScheduleBatch", "field",
       "srt/managers/schedule_batch.py:2546", "committed length L of each request (decode row positions)",
       tensors=("decode rows of every tensor",)),
    _n("ForwardMode.is_extend", _P + "model_executor.forward_batch_info.ForwardMode", "method",
       "srt/model_executor/forward_batch_info.py:198", "prefill vs decode", tensors=_EVERYTHING),
    _n("ForwardMode.EXTEND", _P + "model_executor.forward_batch_info.ForwardMode", "method",
       "srt/model_executor/forward_batch_info.py:201", "the draft's prefill extend forward",
       tensors=_ALL_DRAFT),
    _n("ForwardMode.DRAFT_EXTEND_V2", _P + "model_executor.forward_batch_info.ForwardMode", "method",
       "srt/model_executor/forward_batch_info.py:212", "the draft's decode draft-extend forward",
       tensors=_ALL_DRAFT),
    _n("ForwardMode.DECODE", _P + "model_executor.forward_batch_info.ForwardMode", "method",
       "srt/model_executor/forward_batch_info.py:203", "the draft's decode steps (depth >= 1)",
       tensors=_ALL_DRAFT),
    _n("Req.rid", _P + "managers.schedule_batch.Req", "instance", "srt/managers/schedule_batch.py:1088",
       "request id: one sequence per request, SPECDIFF_RIDS filter", tensors=_EVERYTHING, essential=True),
    _n("Req.sampling_params", _P + "managers.schedule_batch.Req", "instance",
       "srt/managers/schedule_batch.py:1157", "the request's sampling parameters (a client's recording mark)",
       facts=("sampled_requests",), optional=True),
    _n("SamplingParams.custom_params", _P + "sampling.sampling_params.SamplingParams", "field",
       "srt/sampling/sampling_params.py:180", "custom_params[specdiff_record]: the client asks for (or "
       "against) recording the request", facts=("sampled_requests",), optional=True),
    _n("Req.cached_tokens", _P + "managers.schedule_batch.Req", "instance",
       "srt/managers/schedule_batch.py:1353", "the request's radix-cache hit at its first prefill (cached prefix "
       "length; tracer/engines/sglang/prefill.py)", facts=("request_prefill",), optional=True),
    _n("Req.origin_input_ids", _P + "managers.schedule_batch.Req", "instance",
       "srt/managers/schedule_batch.py:1090", "the prompt tokens of the sequence", tensors=("tokens",)),
    _n("ForwardBatch.input_ids", _P + "model_executor.forward_batch_info.ForwardBatch", "field",
       "srt/model_executor/forward_batch_info.py:502", "the draft's input tokens", tensors=("tokens",)),
    _n("ForwardBatch.positions", _P + "model_executor.forward_batch_info.ForwardBatch", "field",
       "srt/model_executor/forward_batch_info.py:659", "positions the draft attends at",
       tensors=("draft positions",)),
    _n("ForwardBatch.forward_mode", _P + "model_executor.forward_batch_info.ForwardBatch", "field",
       "srt/model_executor/forward_batch_info.py", "which draft forward this is", tensors=_ALL_DRAFT),
    _n("GenerationBatchResult.logits_output", _P + "managers.utils.GenerationBatchResult", "field",
       "srt/managers/utils.py:57", "the target's output (aux hidden states in hidden_states)",
       tensors=_TARGET),
    _n("GenerationBatchResult.next_token_ids", _P + "managers.utils.GenerationBatchResult", "field",
       "srt/managers/utils.py:59", "the prefill's sampled token", tensors=("target.argmax", "tokens")),
    _n("GenerationBatchResult.next_draft_input", _P + "managers.utils.GenerationBatchResult", "field",
       "srt/managers/utils.py:111", "the decode draft extend's result (its topk_index)",
       tensors=("draft.topk",)),
    _n("EagleDraftInput.topk_index", _P + "speculative.eagle_info.EagleDraftInput", "field",
       "srt/speculative/eagle_info.py:164", "the draft's depth-0 top-k ids", tensors=("draft.topk",)),
    _n("LogitsProcessorOutput.hidden_states", _P + "layers.logits_processor.LogitsProcessorOutput", "field",
       "srt/layers/logits_processor.py:226", "target: the aux concat; draft: its hidden output",
       tensors=(*_TARGET, "draft.hidden_out")),
    _n("LogitsProcessorOutput.next_token_logits", _P + "layers.logits_processor.LogitsProcessorOutput",
       "field", "srt/layers/logits_processor.py:223", "the draft's logits (top-k, logsumexp, full); the "
       "target's, of verify before eagle_sample (eagle_worker_common.py:654-680) and of the prefill after "
       "the target worker sampled (a non-greedy request's sampler may change them in place)",
       tensors=("draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp",
                "draft.topk", "target.logits_topk.values", "target.logits_topk.ids")),
    _n("EagleVerifyInput.draft_token", _P + "speculative.eagle_info.EagleVerifyInput", "field",
       "srt/speculative/eagle_info.py:18", "the draft tree's tokens", tensors=("verify.draft_tokens",)),
    _n("EagleVerifyInput.positions", _P + "speculative.eagle_info.EagleVerifyInput", "field",
       "srt/speculative/eagle_info.py:22", "positions of the accepted target rows",
       tensors=("decode rows of target.aux.{j}",)),
    _n("EagleVerifyInput.retrieve_index", _P + "speculative.eagle_info.EagleVerifyInput", "field",
       "srt/speculative/eagle_info.py:23", "tree node -> verify row", tensors=("verify.retrieve_index",)),
    _n("EagleVerifyInput.retrieve_next_token", _P + "speculative.eagle_info.EagleVerifyInput", "field",
       "srt/speculative/eagle_info.py:24", "first-child links of the tree", tensors=("verify.parents",)),
    _n("EagleVerifyInput.retrieve_next_sibling", _P + "speculative.eagle_info.EagleVerifyInput", "field",
       "srt/speculative/eagle_info.py:25", "sibling links of the tree", tensors=("verify.parents",)),
)

BY_KEY: dict[str, EngineName] = {n.key: n for n in NAMES}


def hook_table(*, eager_draft: bool = False, names=NAMES) -> dict[str, tuple[str, str]]:
    """HookRegistry target -> (HookType name, hook function in plugin), optional ones on request."""
    return {n.target: n.hook for n in names if n.kind == "hook" and (eager_draft or not n.optional)}


class SGLangAdapter(EngineAdapter):
    """The recorder's view of the running SGLang: ``EngineAdapter``'s name checks, accessors and
    ``unobservable`` list over ``NAMES``. One per scheduler process.

    Args:
        version: ``sglang.__version__`` of the running SGLang ("?" when unreadable).
        names: the declared names (default ``NAMES``).
        log: where the one-line warnings go (default the ``specdiff.tracer`` logger's warning).
    """

    spec = SGLANG

    def __init__(self, version: str, *, names=NAMES, log: Callable[[str], None] | None = None):
        super().__init__(version, names=names, log=log)

    def check_static(self, *, resolve: Callable[[str], object] = pkgutil.resolve_name,
                     eager_draft: bool = False) -> list[EngineName]:
        """Check every class / function / method / field / parameter name (the SPECDIFF_EAGER_DRAFT
        ones only with ``eager_draft``); returns the missing ones (each logged once). Instance
        attributes are left to ``check_instance``."""
        return self.check_names(lambda n: eager_draft or not n.optional, resolve=resolve)


__all__ = ["BY_KEY", "NAMES", "SGLangAdapter", "hook_table"]
