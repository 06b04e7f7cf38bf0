"""Every vLLM name the recorder touches, declared once, checked against the running vLLM.

The vLLM recorder (tracer/engines/vllm/plugin.py) wraps a few plain-Python methods of vLLM's
model runner and drafter and puts forward hooks on modules of the draft that run outside the
``torch.compile``d graph. A rename in a new vLLM release must not become silently missing rows,
so each name is declared here with the vLLM 0.32.0 source it comes from (path under
``site-packages/vllm/``, line), what the recorder does with it and the tensors / contract facts
that depend on it. The machinery is the engine-independent one of tracer/engines/names.py
(``EngineName``, ``EngineAdapter``: import + ``hasattr`` checks, one warning per missing name,
``MISSING`` accessors); only the table and the runner split are vLLM's.

vLLM 0.32 has two model runners (config/vllm.py:703-738: V2 is the GPU default when Triton is
present and every feature is supported, else V1). The CPU build runs V1 (no Triton): the recorder
hooks V1's names. V2's names are declared too (``runner == "v2"``) and checked when a V2 runner is
the one that runs, so a GPU user learns in one warning per name what is unobservable there.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable

from specdiff.eagle3.engines import VLLM
from specdiff.tracer.engines.names import EngineAdapter, EngineName

_W = "vllm.v1.worker."
_V1R = _W + "gpu_model_runner.GPUModelRunner"
_V1P = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer"
_E3 = "vllm.model_executor.models.llama_eagle3."
_IF = "vllm.model_executor.models.interfaces."
_V2 = _W + "gpu."
_ML = "vllm.model_executor.model_loader.default_loader."

_AUX = ("target.aux.{j}", "target.aux_cat")
_DRAFT = ("tokens", "draft.input_ids", "draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.positions", "draft.hidden_out",
          "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp", "draft.topk",
          "draft.topk_target")
_VERIFY = ("verify.accept_length", "verify.accepted_tokens", "verify.accept_index", "verify.draft_tokens",
           "verify.predict", "target.argmax", "target.logits_topk.values", "target.logits_topk.ids")
_EVERYTHING = ("every tensor",)


def _n(key, owner, kind, source, used_for, *, attr=None, tensors=(), facts=(), essential=False,
       runner="v1") -> EngineName:
    # ``optional`` of EngineName marks the V2 names: checked only when the V2 runner runs.
    return EngineName(key=key, owner=owner, attr=attr or key.rsplit(".", 1)[1], kind=kind, source=source,
                      used_for=used_for, tensors=tuple(tensors), facts=tuple(facts), essential=essential,
                      optional=runner == "v2")


NAMES: tuple[EngineName, ...] = (
    # ---- V1 runner (the CPU build's) -----------------------------------------------------------
    _n("GPUModelRunner.sample_tokens", _V1R, "method", "v1/worker/gpu_model_runner.py:4304",
       "wrapped: one recorded iteration (target sampling / verify, then the draft's propose)",
       tensors=_EVERYTHING, essential=True),
    _n("GPUModelRunner.execute_model", _V1R, "method", "v1/worker/gpu_model_runner.py:3940",
       "wrapped: the target forward (prefill / verify) of an iteration: its time counts in recorder_iter_s, "
       "an exception in it is written as the trace's crash", facts=("crash",)),
    _n("GPUModelRunner._sample", _V1R, "method", "v1/worker/gpu_model_runner.py:3437",
       "wrapped: sampled / accepted tokens per request ([B, K+1], -1 = rejected) and the target logits' argmax",
       tensors=_VERIFY),
    _n("GPUModelRunner.propose_draft_token_ids", _V1R, "method", "v1/worker/gpu_model_runner.py:4748",
       "where the aux concat is built (:4952-4993) and drafter.propose called (:5006); not wrapped"),
    _n("GPUModelRunner._get_eagle3_aux_layers_from_config", _V1R, "method", "v1/worker/gpu_model_runner.py:5251",
       "called at start-up: the aux ids the runner took from the draft config (top-level key, then "
       "dflash_config +1, then eagle_config, :5268-5280), None -> the model's default",
       facts=("aux_native_ids", "aux_ids_source")),
    _n("GPUModelRunner._setup_eagle3_aux_hidden_state_outputs", _V1R, "method",
       "v1/worker/gpu_model_runner.py:5230", "wrapped: end of load_model (aux layers set, draft built): the "
       "contract is read and the trace opened here, before any request", tensors=_EVERYTHING),
    _n("GPUModelRunner.requests", _V1R, "instance", "v1/worker/gpu_model_runner.py:683",
       "request id -> CachedRequestState (prompt_token_ids)", tensors=_EVERYTHING),
    _n("GPUModelRunner.input_batch", _V1R, "instance", "v1/worker/gpu_model_runner.py:714",
       "the persistent batch: req_ids in row order", tensors=_EVERYTHING),
    _n("GPUModelRunner.drafter", _V1R, "instance", "v1/worker/gpu_model_runner.py:591",
       "the EAGLE proposer (its model is the draft)", tensors=_DRAFT, facts=("draft_class",)),
    _n("GPUModelRunner.model", _V1R, "instance", "v1/worker/cpu_model_runner.py:69",
       "the target model (aux layers, embedding, architecture)", tensors=_AUX,
       facts=("aux_hf_indices", "target_architecture")),
    _n("GPUModelRunner.model_config", _V1R, "instance", "v1/worker/gpu_model_runner.py:477",
       "target hf_config, dtype, model and tokenizer paths", facts=("num_layers", "hidden_size", "vocab_size", "dtype")),
    _n("GPUModelRunner.speculative_config", _V1R, "instance", "v1/worker/gpu_model_runner.py:485",
       "num_speculative_tokens, method, the draft's model_config", facts=("spec_steps", "spec_algorithm")),
    _n("GPUModelRunner.vllm_config", _V1R, "instance", "v1/worker/gpu_model_runner.py:476",
       "every engine option: the VllmConfig's configs", facts=("engine_options",)),
    _n("DefaultModelLoader.load_weights", _ML + "DefaultModelLoader", "method",
       "model_executor/model_loader/default_loader.py:485", "wrapped: the load path of target and draft (weights "
       "fingerprinted, parameters the loading wrote noted: tracer/weight_facts.py LoadWatch)",
       facts=("target_weights", "draft_weights", "target_unloaded", "draft_unloaded")),
    _n("DefaultModelLoader.get_all_weights", _ML + "DefaultModelLoader", "method",
       "model_executor/model_loader/default_loader.py:367", "the (name, tensor) iterator load_weights consumes",
       facts=("target_weights", "draft_weights")),
    _n("InputBatch.req_ids", _W + "gpu_input_batch.InputBatch", "method", "v1/worker/gpu_input_batch.py:315",
       "request ids in row order", tensors=_EVERYTHING),
    _n("CachedRequestState.prompt_token_ids", _W + "gpu_input_batch.CachedRequestState", "field",
       "v1/worker/gpu_input_batch.py:37", "the prompt of each recorded sequence", tensors=_EVERYTHING),
    _n("SpecDecodeMetadata.num_draft_tokens", "vllm.v1.spec_decode.metadata.SpecDecodeMetadata", "field",
       "v1/spec_decode/metadata.py:14", "drafts verified per request", tensors=_VERIFY),
    _n("SpecDecodeMetadata.draft_token_ids", "vllm.v1.spec_decode.metadata.SpecDecodeMetadata", "field",
       "v1/spec_decode/metadata.py:12", "the drafts verified (target ids, flattened)", tensors=("verify.draft_tokens",)),
    _n("SamplerOutput.sampled_token_ids", "vllm.v1.outputs.SamplerOutput", "field", "v1/outputs.py:210",
       "committed tokens per request [B, K+1], -1 = rejected", tensors=_VERIFY),
    _n("SpecDecodeBaseProposer.propose", _V1P, "method", "v1/spec_decode/llm_base_proposer.py:512",
       "wrapped: target aux concat [N, K*H], target ids / positions, next token ids, sample rows",
       tensors=_AUX + _DRAFT, essential=True),
    _n("SpecDecodeBaseProposer.load_model", _V1P, "method", "v1/spec_decode/llm_base_proposer.py:1319",
       "wrapped: the draft model is built here (module hooks attached after it)", tensors=_DRAFT),
    _n("SpecDecodeBaseProposer.model", _V1P, "instance", "v1/spec_decode/llm_base_proposer.py:1327",
       "the draft model vLLM built", tensors=_DRAFT, facts=("draft_class",)),
    _n("CommonAttentionMetadata.query_start_loc_cpu", "vllm.v1.attention.backend.CommonAttentionMetadata",
       "field", "v1/attention/backend.py:395", "first row of each request in the target batch",
       tensors=_AUX + _DRAFT),
    _n("Eagle3LlamaForCausalLM.model", _E3 + "Eagle3LlamaForCausalLM", "instance",
       "model_executor/models/llama_eagle3.py:320", "the draft's LlamaModel (fc, norms, layers)", tensors=_DRAFT),
    _n("Eagle3LlamaForCausalLM.logits_processor", _E3 + "Eagle3LlamaForCausalLM", "instance",
       "model_executor/models/llama_eagle3.py:335",
       "forward hook: draft-vocab logits [N, Vd] before the d2t scatter (:373-395)",
       tensors=("draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp", "draft.topk")),
    _n("Eagle3LlamaForCausalLM.draft_id_to_target_id", _E3 + "Eagle3LlamaForCausalLM", "instance",
       "model_executor/models/llama_eagle3.py:340", "d2t as loaded (renamed from 'd2t' at :428-429); None = same vocab",
       facts=("d2t_sha256", "hot_token_id_sha256", "draft_vocab_size")),
    _n("Eagle3LlamaForCausalLM.combine_hidden_states", _E3 + "Eagle3LlamaForCausalLM", "method",
       "model_executor/models/llama_eagle3.py:397", "norm_before_fc / fc_norm then fc, eager (the fc hook fires)"),
    _n("LlamaModel.fc", _E3 + "LlamaModel", "instance", "model_executor/models/llama_eagle3.py:242",
       "forward hook: fc input (after the norms) and output", tensors=("draft.fc_in", "draft.fc_out")),
    _n("LlamaModel.norm_before_fc", _E3 + "LlamaModel", "instance", "model_executor/models/llama_eagle3.py:184",
       "contract", facts=("norm_before_fc",)),
    _n("LlamaModel.fc_norm", _E3 + "LlamaModel", "instance", "model_executor/models/llama_eagle3.py:233",
       "contract", facts=("fc_norm",)),
    _n("LlamaModel.norm_output", _E3 + "LlamaModel", "instance", "model_executor/models/llama_eagle3.py:252",
       "contract (which hidden is fed back: post-norm or pre-norm, :286)", facts=("norm_output",)),
    _n("LlamaModel.num_aux_hidden_states", _E3 + "LlamaModel", "instance",
       "model_executor/models/llama_eagle3.py:210", "the fc's aux count (top-level num_aux_hidden_states, else the "
       "nested ids' count, else 3: :210-216)", facts=("draft_num_aux",)),
    _n("LlamaModel.layers", _E3 + "LlamaModel", "instance", "model_executor/models/llama_eagle3.py:198",
       "rope of the draft's attention", facts=("rope_theta", "rope_style", "rope_scaling")),
    _n("LlamaDecoderLayer.self_attn", "vllm.model_executor.models.llama.LlamaDecoderLayer", "instance",
       "model_executor/models/llama.py:285", "a draft layer's attention (set by the EAGLE-3 layer's base class)",
       facts=("draft_attention_window",)),
    _n("LlamaAttention.attn", "vllm.model_executor.models.llama.LlamaAttention", "instance",
       "model_executor/models/llama.py:212", "the attention kernel layer of a draft layer",
       facts=("draft_attention_window",)),
    _n("Attention.sliding_window", "vllm.model_executor.layers.attention.attention.Attention", "instance",
       "model_executor/layers/attention/attention.py:339", "a draft layer's window (None: full attention)",
       facts=("draft_attention_window",)),
    _n("LlamaModel.embed_tokens", _E3 + "LlamaModel", "instance", "model_executor/models/llama_eagle3.py:192",
       "embedding the draft multiplies by (shared with the target or its own)", facts=("embed_sha256", "embed_source")),
    _n("Eagle3LlamaForCausalLM.lm_head", _E3 + "Eagle3LlamaForCausalLM", "instance",
       "model_executor/models/llama_eagle3.py:329", "the draft lm_head", facts=("lm_head_sha256", "lm_head_source")),
    _n("EagleModelMixin.aux_hidden_state_layers", _IF + "EagleModelMixin", "method",
       "model_executor/models/interfaces.py:1571",
       "the layers the target really captures (sorted, deduplicated: :1577-1578)",
       tensors=_AUX, facts=("aux_hf_indices", "aux_dropped_ids", "aux_concat_order")),
    _n("SupportsEagle3.get_eagle3_default_aux_hidden_state_layers", _IF + "SupportsEagle3", "method",
       "model_executor/models/interfaces.py:1712", "the fallback (2, L//2, L-3) when no config key gave ids",
       facts=("aux_ids_source",)),
    # ---- V2 runner (the GPU default), checked only when it runs ----------------------------------
    _n("V2.GPUModelRunner.sample_tokens", _V2 + "model_runner.GPUModelRunner", "method",
       "v1/worker/gpu/model_runner.py:2088", "V2 iteration boundary (not hooked in this version)",
       attr="sample_tokens", tensors=_EVERYTHING, runner="v2"),
    _n("V2.GPUModelRunner.execute_model", _V2 + "model_runner.GPUModelRunner", "method",
       "v1/worker/gpu/model_runner.py:1719", "V2 target forward; propose at :943 and :2239",
       attr="execute_model", tensors=_AUX, runner="v2"),
    _n("V2.TargetDependentARSpeculator.propose", _V2 + "spec_decode.target_dependent_ar.speculator."
       "TargetDependentARSpeculator", "method", "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:165",
       "V2 draft input assembly (aux concat + fc at :210-214)", attr="propose", tensors=_AUX + _DRAFT, runner="v2"),
    _n("V2.eagle3_utils.get_eagle3_aux_layers_from_config", _V2 + "spec_decode.eagle.eagle3_utils", "method",
       "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:100",
       "V2's aux ids: top-level key, dflash/dspark keys, eagle_config['layer_ids'] - NOT "
       "eagle_config['eagle_aux_hidden_state_layer_ids'] (V1 reads it)", attr="get_eagle3_aux_layers_from_config",
       facts=("aux_native_ids", "aux_ids_source"), runner="v2"),
    _n("V2.RejectionSampler.__call__", _V2 + "spec_decode.rejection_sampler.RejectionSampler", "method",
       "v1/worker/gpu/spec_decode/rejection_sampler.py:407", "V2 verify", attr="__call__", tensors=_VERIFY,
       runner="v2"),
)

BY_KEY = {n.key: n for n in NAMES}


def runner_version(runner) -> str:
    """'v2' for vLLM's V2 model runner: a class of ``vllm.v1.worker.gpu.*`` or one derived from it (the
    V2 CPU runner, v1/worker/cpu/model_runner.py:10, subclasses the V2 GPUModelRunner), else 'v1'."""
    return "v2" if any(k.__module__.startswith(_V2) for k in type(runner).__mro__) else "v1"


class VLLMAdapter(EngineAdapter):
    """The recorder's view of the running vLLM: ``EngineAdapter``'s checks and accessors over
    ``NAMES``. One per process that runs a model runner."""

    spec = VLLM

    def __init__(self, version: str, *, names=NAMES, log: Callable[[str], None] | None = None):
        super().__init__(version, names=names, log=log)

    def check_runner(self, runner: str, *, module: str | None = None,
                     resolve: Callable[[str], object] = pkgutil.resolve_name) -> list[EngineName]:
        """Check the static names of ``runner`` ('v1' or 'v2'), only those held by ``module`` when
        given (a module being imported cannot resolve names of another one that imports it);
        returns the missing ones (each logged once)."""
        return self.check_names(lambda n: n.optional == (runner == "v2")
                                and (module is None or n.owner.startswith(module + ".")), resolve=resolve)


__all__ = ["BY_KEY", "NAMES", "VLLMAdapter", "runner_version"]
