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

Engines concatenate slots in ascending layer order whatever the list order
(SGLang aux_hidden_states.py), so resolved indices are sorted and de-duplicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONVENTIONS = ("hf", "sglang", "vllm", "speculators", "specforge")


class ConventionError(ValueError):
    """Raised for an unknown convention or ids that the convention cannot express."""


@dataclass(frozen=True)
class AuxResolution:
    """Result of resolving aux ids to HF hidden-state indices.

    Attributes:
        hf_indices: HF ``hidden_states`` indices in concat (ascending) order.
        ids: the native ids as given (None = the tool's default was used).
        convention: the convention the ids were read in.
        dropped: native ids the tool silently drops (SGLang id L-1).
        notes: plain-words remarks (defaults used, reordering, dropped ids).
    """

    hf_indices: tuple[int, ...]
    ids: tuple[int, ...] | None
    convention: str
    dropped: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def as_facts(self) -> dict:
        """JSON/msgpack-safe dict for the contract facts."""
        return {
            "aux_hf_indices": list(self.hf_indices),
            "aux_native_ids": None if self.ids is None else list(self.ids),
            "aux_convention": self.convention,
            "aux_dropped_ids": list(self.dropped),
        }


def default_hf_indices(num_layers: int) -> tuple[int, ...]:
    """Default capture of SGLang, vLLM and SpecForge alike: HF [2, L//2, L-3]."""
    return (2, num_layers // 2, num_layers - 3)


def resolve_aux_ids(ids, *, convention: str, num_layers: int) -> AuxResolution:
    """Resolve native aux layer ids to HF hidden-state indices.

    Args:
        ids: sequence of ints, or None for the tool's default.
        convention: one of ``CONVENTIONS``.
        num_layers: L, the target's decoder layer count.

    Returns:
        AuxResolution with ascending, de-duplicated HF indices.

    Raises:
        ConventionError: unknown convention, or an id outside what the convention accepts.
    """
    if convention not in CONVENTIONS:
        raise ConventionError(
            f"unknown aux convention {convention!r}; use one of: {', '.join(CONVENTIONS)}")
    L = num_layers
    notes: list[str] = []
    if ids is None:
        return AuxResolution(default_hf_indices(L), None, convention,
                             notes=(f"no ids given: {convention} default HF {list(default_hf_indices(L))}",))
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
    resolved = tuple(sorted(set(hf)))
    if list(resolved) != hf:
        notes.append(f"engines concatenate in ascending layer order: {hf} -> {list(resolved)}")
    return AuxResolution(resolved, ids, convention, tuple(dropped), tuple(notes))
