"""The aux layers the training side feeds the draft (``record train``).

Owns turning ``--aux-layers`` / ``--aux-convention`` or the draft config's own ids into HF
hidden-state indices in training's concat order (``specdiff.eagle3.aux_layers``), refusing ids
that cannot be used as given.

An id that names the last decoder layer's output *before* the final norm in its own convention
(SGLang 0.5.23 GPT-OSS capture index L, srt/models/gpt_oss.py:726-738; vLLM 0.32 / speculators id
L; SpecForge's HF backend id L-1) is replayed, not refused: its slot is listed as L and marked
pre-norm (``TrainAux.prenorm``, contract ``aux_prenorm_indices``), and the target capture reads it
from the final norm's input (``replay.model.target_capture.capture_target``). HF index L in the
``hf`` convention stays what HF defines: after the final norm.
"""

from __future__ import annotations

import dataclasses

from specdiff.eagle3.aux_layers import (
    RULES,
    AuxResolution,
    ConventionError,
    engine_capture,
    resolve_aux_ids,
    sglang_family_rule,
)
from specdiff.replay.model.checkpoint import LoadedDraft
from specdiff.replay.record.errors import RecordTrainError
from specdiff.replay.record.train_options import AUX_CONVENTION_DEFAULT

__all__ = ["TrainAux", "resolve_train_aux"]


@dataclasses.dataclass(frozen=True)
class TrainAux(AuxResolution):
    """The training aux layers: an ``AuxResolution`` (``hf_indices`` in concat order) plus
    ``prenorm``: ``()`` or ``(L,)``, the entry L of ``hf_indices`` whose slot is the last decoder
    layer's output before the final norm (no HF ``hidden_states`` index holds it)."""

    prenorm: tuple[int, ...] = ()

    def as_facts(self) -> dict:
        """``AuxResolution.as_facts`` plus ``aux_prenorm_indices`` (tracer/contract.py)."""
        return {**super().as_facts(), "aux_prenorm_indices": list(self.prenorm)}


def _prenorm_source(conv: str, architecture: str | None) -> str:
    if conv == "sglang":
        fam = sglang_family_rule(architecture)
        return f"the SGLang {fam.name} rule of {architecture}, {fam.sources[-1].split(' ')[0]}"
    return RULES[conv].sources[0].split(" ")[0] if RULES[conv].sources else RULES[conv].tool


def _resolve_prenorm(ids, conv: str, num_layers: int, architecture: str | None) -> TrainAux | None:
    """The listed resolution of ``ids`` when one of them names the last layer's pre-norm output in
    ``conv`` (None when none does: the plain ``resolve_aux_ids`` applies, with its refusals).

    Raises:
        ConventionError: two ids name the pre-norm output, another id names nothing the
            convention captures (the engine drops it) or a layer twice.
    """
    L = num_layers
    if ids is None or conv not in RULES:
        return None
    ids = [int(i) for i in ids]
    if conv == "sglang":
        if architecture is None:
            return None  # the Llama rule (RULES['sglang']): no capture index reaches the pre-norm output
        fam = sglang_family_rule(architecture)
        outcomes = [fam.outcome(c, L) for c in fam.capture_indices(ids, L)]
        pre = [k for k, (kind, _) in enumerate(outcomes) if kind == "prenorm"]
        if not pre:
            return None
        plan = engine_capture("sglang", ids, num_layers=L, architecture=architecture)
        if plan.dropped:
            raise ConventionError(f"sglang id {plan.dropped[0]} captures nothing on {architecture} (the SGLang "
                                  f"{fam.name} rule: {fam.id_meaning()}){'; ' + plan.failure if plan.failure else ''}")
        hf = [L if kind == "prenorm" else h for kind, h in outcomes]
    else:
        rule = RULES[conv]
        pre = [k for k, i in enumerate(ids) if rule.to_hf(i, L) is None and i - L in rule.prenorm]
        if not pre:
            return None
        rest = resolve_aux_ids([i for k, i in enumerate(ids) if k not in pre], convention=conv, num_layers=L,
                               concat="listed")
        it = iter(rest.hf_indices)
        hf = [L if k in pre else next(it) for k in range(len(ids))]
    if len(pre) > 1:
        raise ConventionError(f"{conv} ids {ids} name the last layer's pre-norm output twice (ids "
                              f"{[ids[k] for k in pre]}); each aux slot must be a different layer")
    if len(set(hf)) != len(hf):
        raise ConventionError(f"{conv} ids {ids} name one layer twice (HF {hf}); each aux slot must be a "
                              "different layer")
    i = ids[pre[0]]
    note = (f"{conv} id {i} names the last decoder layer's output before the final norm "
            f"({_prenorm_source(conv, architecture)}); no HF hidden_states index holds it (HF {L} is after the "
            f"norm): record train reads slot {pre[0]} from the final norm's input (contract aux_prenorm_indices "
            f"[{L}])")
    return TrainAux(tuple(hf), tuple(ids), conv, (), (note,), "listed", prenorm=(L,))


def _family_note(convention: str, architecture: str | None) -> tuple[str, ...]:
    """How SGLang ids were read: the target's rule, or that the plus-one rule was assumed."""
    if convention != "sglang":
        return ()
    fam = sglang_family_rule(architecture)
    if not fam.known:
        return (fam.note,)
    return (f"SGLang ids read by the {fam.name} rule of the target {architecture} "
            f"({fam.sources[0].split(' ')[0]}: {fam.id_meaning()})",)


def resolve_train_aux(loaded: LoadedDraft, num_layers: int, aux_layers=None,
                      aux_convention: str | None = None, *, architecture: str | None = None) -> TrainAux:
    """The aux layers training feeds, in the order listed (slot j = the j-th id): ``aux_layers``
    read in ``aux_convention`` (default ``hf``), else the draft config's own ids in its
    convention and order (tool default when it has none).

    ``architecture`` is the target's HF ``architectures[0]``: SGLang ids are read by that
    family's rule (``eagle3.aux_layers.sglang_family_rule``: DeepSeek-V3 reads [0, 3, 6] as
    HF [0, 3, 6], Llama as HF [1, 4, 7]); None or an unknown one assumes the plus-one rule, and
    the returned ``notes`` say which rule was used. An id that names the last layer's pre-norm
    output in its convention (GPT-OSS ids whose max is L, vLLM id L, SpecForge id L-1) gives a
    slot listed as L with ``prenorm == (L,)`` (module docstring).

    Raises RecordTrainError when the ids are invalid, cannot be used in the order given (a
    layer twice, an id the convention never captures) or their count differs from the draft's K.
    """
    c = loaded.config
    conv = (aux_convention or AUX_CONVENTION_DEFAULT) if aux_layers is not None else c.aux_convention
    try:
        ids = list(aux_layers) if aux_layers is not None else c.eagle_aux_hidden_state_layer_ids
        res = (_resolve_prenorm(ids, conv, num_layers, architecture)
               or resolve_aux_ids(ids, convention=conv, num_layers=num_layers, concat="listed",
                                  architecture=architecture))
    except ConventionError as e:
        src = (f"--aux-layers {list(aux_layers)}" if aux_layers is not None
               else f"the draft config ids {c.eagle_aux_hidden_state_layer_ids} ({c.aux_convention})")
        raise RecordTrainError(f"aux layers: {e}; give the layers training fed, in its concat order, "
                               f"with --aux-layers (from {src})") from None
    if len(res.hf_indices) != c.num_aux:
        src = (f"--aux-layers {list(aux_layers)} ({aux_convention or AUX_CONVENTION_DEFAULT})"
               if aux_layers is not None
               else f"the draft config ids {c.eagle_aux_hidden_state_layer_ids} ({c.aux_convention})")
        raise RecordTrainError(
            f"{src} resolve to {len(res.hf_indices)} aux slots HF {list(res.hf_indices)} but the draft's "
            f"fc expects {c.num_aux} slots x {c.target_hidden_size} = {c.aux_width} features")
    extra = _family_note(conv, architecture)
    if extra:  # an unknown architecture's resolution already carries the same note
        res = dataclasses.replace(res, notes=extra + tuple(n for n in res.notes if n not in extra))
    if aux_layers is None and list(res.hf_indices) != sorted(res.hf_indices):
        res = dataclasses.replace(res, notes=res.notes + (
            f"the draft config lists its aux ids {c.eagle_aux_hidden_state_layer_ids} out of ascending order: "
            f"the training side concatenates them as listed, HF {list(res.hf_indices)} (as SpecForge does); "
            f"SGLang concatenates HF {sorted(res.hf_indices)}. If training concatenated in ascending order, "
            "pass --aux-layers in that order",))
    if not isinstance(res, TrainAux):
        res = TrainAux(**{f.name: getattr(res, f.name) for f in dataclasses.fields(res)})
    return res
