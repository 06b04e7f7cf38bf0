"""Aux-layer id conventions: what a list of layer ids means in each tool, as HF indices.

HF ``output_hidden_states[i]``: i = 0 is the embedding output, i in 1..L-1 the output of decoder
layer i-1, i = L is *after* the final norm. The tools number the same layers differently:

- ``hf``: the ids already are HF indices.
- ``sglang`` (SGLang 0.5.23 llama.py ``set_eagle3_layers_to_capture``): config id k captures the
  residual stream entering layer k+1 = HF index k+1; id -1 = embeddings (HF 0); id L-1 maps to
  index L, which is never reached, so it is silently dropped (and the first request crashes
  with a shape error when fc expects K slots). Default with no ids: HF [2, L//2, L-3].
  Ids are read only from ``eagle_config.eagle_aux_hidden_state_layer_ids``.
- ``vllm`` / ``speculators``: id k = HF index k (top-level key first). Default [2, L//2, L-3].
- ``specforge`` (SpecForge 0.2.0 eagle3_target_model.py): id k hooks the output of
  ``layers[k]`` = HF index k+1. Default ids [1, L//2-1, L-4] = HF [2, L//2, L-3].

Concat order - the order of the slots in the fc input - is a separate fact (``concat``):

- ``ascending``: engines capture a *set* of layers and concatenate it in ascending layer order
  whatever the list order (SGLang 0.5.23 srt/layers/aux_hidden_states.py:17-26,97-102, the
  capture loop runs over layers; vLLM likewise), so duplicates collapse.
- ``listed``: trainers concatenate in the order the ids are listed (SpecForge 0.2.0
  eagle3_target_model.py ``HFEagle3TargetModel.generate_eagle3_data``: ``torch.cat`` of
  ``aux_hidden_states_layers[0], [1], [2]``; specdiff ``record train``). The ids are used as
  given: a repeated layer or an id the convention cannot capture is refused, never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: contract field: HF index of each aux slot in fc-input concat order (slot j = fc_in[:, j*H:(j+1)*H])
AUX_CONCAT_ORDER = "aux_concat_order"

CONVENTIONS = ("hf", "sglang", "vllm", "speculators", "specforge")
#: how the captured slots are ordered in the fc input (see the module docstring)
CONCAT_RULES = ("ascending", "listed")


class ConventionError(ValueError):
    """Raised for an unknown convention or ids that the convention cannot express."""


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
    """Default capture of SGLang, vLLM and SpecForge alike: HF [2, L//2, L-3]."""
    return (2, num_layers // 2, num_layers - 3)


def resolve_aux_ids(ids, *, convention: str, num_layers: int, concat: str = "ascending") -> AuxResolution:
    """Resolve native aux layer ids to HF hidden-state indices.

    Args:
        ids: sequence of ints, or None for the tool's default.
        convention: one of ``CONVENTIONS``.
        num_layers: L, the target's decoder layer count.
        concat: ``ascending`` (what an engine feeds: sorted, repeats collapse, SGLang id L-1
            dropped with a note) or ``listed`` (what a trainer feeds: the ids' own order).

    Returns:
        AuxResolution whose ``hf_indices`` are in ``concat`` order.

    Raises:
        ConventionError: unknown convention or concat rule, an id outside what the convention
            accepts; with ``listed`` also a layer listed twice or an id the convention never
            captures (SGLang id L-1): the list cannot be used as given.
    """
    if convention not in CONVENTIONS:
        raise ConventionError(
            f"unknown aux convention {convention!r}; use one of: {', '.join(CONVENTIONS)}")
    if concat not in CONCAT_RULES:
        raise ConventionError(f"unknown concat rule {concat!r}; use one of: {', '.join(CONCAT_RULES)}")
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
        if convention == "hf":
            if not 0 <= i <= L:
                raise ConventionError(f"HF index {i} out of range 0..{L}")
            hf.append(i)
        elif convention == "sglang":
            if i == -1:
                hf.append(0)
            elif 0 <= i <= L - 2:
                hf.append(i + 1)
            elif i == L - 1:
                dropped.append(i)
                notes.append(f"SGLang id {i} (= L-1) maps to capture index {L}, which is never "
                             "reached: the slot is silently dropped")
            else:
                raise ConventionError(f"SGLang aux id {i} out of range -1..{L - 1}")
        elif convention in ("vllm", "speculators"):
            if not 0 <= i <= L:
                raise ConventionError(f"{convention} aux id {i} out of range 0..{L}")
            hf.append(i)
        else:  # specforge
            if not 0 <= i <= L - 1:
                raise ConventionError(f"SpecForge aux id {i} out of range 0..{L - 1}")
            hf.append(i + 1)
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


def _refuse_repeats(hf, what: str) -> None:
    seen: set[int] = set()
    for i in hf:
        if i in seen:
            raise ConventionError(
                f"{what} name HF hidden_states[{i}] twice; each aux slot must be "
                "a different layer (an engine captures each layer once)")
        seen.add(i)
