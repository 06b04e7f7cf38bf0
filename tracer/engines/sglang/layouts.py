"""Where each SGLang 0.5.23 target family keeps what the EAGLE-3 contract reads: one
``TargetLayout`` per live target class (``TARGET_LAYOUTS``), the wrappers that delegate to an inner
language model (``TARGET_WRAPPERS``), and what the recorder does with each attribute
(``LAYOUT_USE``). ``adapter`` declares every attribute here as an SGLang name it checks.

These are SGLang's classes, files and lines, so they live with the SGLang recorder; what a family
*is* (its aux-id rule, experts) is ``specdiff.eagle3.families``.
"""

from __future__ import annotations

from dataclasses import dataclass

_M = "sglang.srt.models."

#: Outer-model attributes a layout declares (the ``*ForCausalLM`` SGLang instantiates) ...
OUTER_ATTRS = ("model", "lm_head", "capture_aux_hidden_states", "config")
#: ... and the decoder stack's (what ``outer.model`` holds).
INNER_ATTRS = ("layers_to_capture", "start_layer", "end_layer", "embed_tokens")

#: attribute -> (what the recorder does with it, contract facts it feeds)
LAYOUT_USE = {
    "model": ("the target's decoder stack (holds layers_to_capture, start/end_layer, embed_tokens)",
              ("aux_hf_indices", "embed_source", "target_weights_fingerprint")),
    "lm_head": ("the target's lm_head (the head get_embed_and_head returns): is the draft's the same tensor?",
                ("lm_head_source",)),
    "capture_aux_hidden_states": ("whether the target returns aux hidden states at all (EAGLE-3 capture on)",
                                  ("aux_hf_indices",)),
    "config": ("the config the target's language model was built with (its MoE routing)",
               ("target_num_experts", "target_experts_per_token")),
    "layers_to_capture": ("what SGLang really captures: layer i in it captures its input, HF hidden_states[i] "
                          "(set by the family's set_eagle3_layers_to_capture)",
                          ("aux_hf_indices", "aux_dropped_ids", "aux_concat_order", "aux_prenorm_indices")),
    "start_layer": ("first layer this rank runs: capture indices outside the run range are never reached",
                    ("aux_hf_indices", "aux_dropped_ids")),
    "end_layer": ("end of the layers this rank runs (GPT-OSS: index end_layer is the pre-norm output)",
                  ("aux_hf_indices", "aux_dropped_ids", "aux_prenorm_indices")),
    "embed_tokens": ("the target's embedding (the embed get_embed_and_head returns, which init_lm_head shares "
                     "with the draft): is the draft's the same tensor?",
                     ("embed_source", "lm_head_source", "target_weights_fingerprint")),
}


@dataclass(frozen=True)
class TargetLayout:
    """Where one SGLang target family keeps what the EAGLE-3 contract reads (SGLang 0.5.23).

    Every family that serves EAGLE-3 has the same shape: the ``*ForCausalLM`` SGLang builds holds
    ``model`` (the decoder stack), ``lm_head``, ``capture_aux_hidden_states`` and ``config``; the
    decoder stack holds ``layers_to_capture``, ``start_layer`` / ``end_layer`` and ``embed_tokens``.
    The class names, the files and lines that set them and what a capture index means differ.

    In every family's forward, layer ``i`` in ``layers_to_capture`` captures its *input* residual
    stream, HF ``hidden_states[i]``, for ``start_layer <= i < end_layer`` (llama.py:492,
    qwen2.py:462, qwen2_moe.py:1201 via the ``_is_layer_to_capture`` flags, deepseek_v2.py:3194,
    gpt_oss.py:719). GPT-OSS also captures index ``end_layer`` at the final norm
    (``final_capture``): the residual after the last layer, before the norm.

    Attributes:
        outer: dotted path of the ``*ForCausalLM`` class that sets model / lm_head / capture flag.
        inner: dotted path of the decoder-stack class.
        classes: live class names served with this layout. Exact names, never subclasses found by
            MRO: a subclass may build other modules (Llama4ForCausalLM is a LlamaForCausalLM with MoE).
        sources: attribute -> "srt/models/<file>.py:<line>" where SGLang 0.5.23 sets it.
        rule: where the family's ``set_eagle3_layers_to_capture`` is defined (ids -> layers_to_capture).
        final_capture: where capture index ``end_layer`` is taken (None: only layer inputs).

    MoE routing is read from ``config`` through tracer/contract.py ``MOE_CONFIG_KEYS`` (shared
    with the training side).
    """

    outer: str
    inner: str
    classes: tuple[str, ...]
    sources: dict
    rule: str
    final_capture: str | None = None

    @property
    def outer_name(self) -> str:
        return self.outer.rsplit(".", 1)[1]

    @property
    def inner_name(self) -> str:
        return self.inner.rsplit(".", 1)[1]

    def key(self, attr: str) -> str:
        """Adapter key of ``attr`` (one of ``OUTER_ATTRS`` / ``INNER_ATTRS``) in this layout."""
        return f"{self.outer_name if attr in OUTER_ATTRS else self.inner_name}.{attr}"


def _src(lines: str) -> dict:
    """``"model=llama.py:567 ..."`` -> {attr: "srt/models/llama.py:567"}."""
    return {a: "srt/models/" + where for a, where in (item.split("=") for item in lines.split())}


_QWEN2_INNER = "layers_to_capture=qwen2.py:423 start_layer=qwen2.py:392 end_layer=qwen2.py:392 embed_tokens=qwen2.py:370"
_QWEN2MOE_INNER = ("layers_to_capture=qwen2_moe.py:1151 start_layer=qwen2_moe.py:1132 end_layer=qwen2_moe.py:1132 "
                   "embed_tokens=qwen2_moe.py:1115")

#: live target class name -> its layout (SGLang 0.5.23). A class not here is read through
#: Llama's names, with one warning saying so (reading.target_language_model).
TARGET_LAYOUTS: dict[str, TargetLayout] = {c: lay for lay in (
    TargetLayout(_M + "llama.LlamaForCausalLM", _M + "llama.LlamaModel", ("LlamaForCausalLM",), _src(
        "model=llama.py:567 lm_head=llama.py:573 capture_aux_hidden_states=llama.py:591 config=llama.py:565 "
        "layers_to_capture=llama.py:463 start_layer=llama.py:446 end_layer=llama.py:446 embed_tokens=llama.py:432"),
        rule="srt/models/llama.py:929"),
    TargetLayout(_M + "qwen2.Qwen2ForCausalLM", _M + "qwen2.Qwen2Model", ("Qwen2ForCausalLM",), _src(
        "model=qwen2.py:530 lm_head=qwen2.py:539 capture_aux_hidden_states=qwen2.py:552 config=qwen2.py:528 "
        + _QWEN2_INNER), rule="srt/models/qwen2.py:781"),
    TargetLayout(_M + "qwen3.Qwen3ForCausalLM", _M + "qwen3.Qwen3Model", ("Qwen3ForCausalLM",), _src(
        "model=qwen3.py:573 lm_head=qwen3.py:582 capture_aux_hidden_states=qwen3.py:597 config=qwen3.py:571 "
        + _QWEN2_INNER), rule="srt/models/qwen3.py:778"),
    TargetLayout(_M + "qwen2_moe.Qwen2MoeForCausalLM", _M + "qwen2_moe.Qwen2MoeModel", ("Qwen2MoeForCausalLM",), _src(
        "model=qwen2_moe.py:1232 lm_head=qwen2_moe.py:1238 capture_aux_hidden_states=qwen2_moe.py:1247 "
        "config=qwen2_moe.py:1229 " + _QWEN2MOE_INNER), rule="srt/models/qwen2_moe.py:1418"),
    TargetLayout(_M + "qwen3_moe.Qwen3MoeForCausalLM", _M + "qwen3_moe.Qwen3MoeModel", ("Qwen3MoeForCausalLM",), _src(
        "model=qwen3_moe.py:1014 lm_head=qwen3_moe.py:1017 capture_aux_hidden_states=qwen3_moe.py:1025 "
        "config=qwen3_moe.py:1012 " + _QWEN2MOE_INNER), rule="srt/models/qwen3_moe.py:1128"),
    TargetLayout(_M + "deepseek_v2.DeepseekV2ForCausalLM", _M + "deepseek_v2.DeepseekV2Model",
                 ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"), _src(
        "model=deepseek_v2.py:3283 lm_head=deepseek_v2.py:3291 capture_aux_hidden_states=deepseek_v2.py:3310 "
        "config=deepseek_v2.py:3278 layers_to_capture=deepseek_v2.py:3051 start_layer=deepseek_v2.py:2962 "
        "end_layer=deepseek_v2.py:2962 embed_tokens=deepseek_v2.py:2943"), rule="srt/models/deepseek_v2.py:3458"),
    TargetLayout(_M + "gpt_oss.GptOssForCausalLM", _M + "gpt_oss.GptOssModel", ("GptOssForCausalLM",), _src(
        "model=gpt_oss.py:765 lm_head=gpt_oss.py:768 capture_aux_hidden_states=gpt_oss.py:776 config=gpt_oss.py:763 "
        "layers_to_capture=gpt_oss.py:686 start_layer=gpt_oss.py:670 end_layer=gpt_oss.py:670 "
        "embed_tokens=gpt_oss.py:659"), rule="srt/models/gpt_oss.py:1337",
        final_capture="srt/models/gpt_oss.py:731"),
    TargetLayout(_M + "qwen3_vl.Qwen3VLForConditionalGeneration", _M + "qwen3_vl.Qwen3LLMModel",
                 ("Qwen3VLForConditionalGeneration",), _src(
        "model=qwen3_vl.py:1357 lm_head=qwen3_vl.py:1370 capture_aux_hidden_states=qwen3_vl.py:1389 "
        "config=qwen3_vl.py:1344 " + _QWEN2_INNER), rule="srt/models/qwen3_vl.py:1777"),
) for c in lay.classes}

#: The layout assumed for a target class TARGET_LAYOUTS does not declare (said in one warning).
ASSUMED_LAYOUT = TARGET_LAYOUTS["LlamaForCausalLM"]

#: Wrappers whose EAGLE-3 methods delegate to an inner language model: class name ->
#: (dotted class path, attribute, source). set_eagle3_layers_to_capture / get_embed_and_head
#: of the wrapper call the inner model's (kimi_k25.py:928-974, mllama4.py:971-985, gemma3_mm.py:528-545).
TARGET_WRAPPERS: dict[str, tuple[str, str, str]] = {
    "KimiK25ForConditionalGeneration": (_M + "kimi_k25.KimiK25ForConditionalGeneration", "language_model",
                                        "srt/models/kimi_k25.py:693"),
    "Llama4ForConditionalGeneration": (_M + "mllama4.Llama4ForConditionalGeneration", "language_model",
                                       "srt/models/mllama4.py:496"),
    "Gemma3ForConditionalGeneration": (_M + "gemma3_mm.Gemma3ForConditionalGeneration", "language_model",
                                       "srt/models/gemma3_mm.py:195"),
}
