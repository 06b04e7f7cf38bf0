"""The aux layers the training side feeds the draft (``record train``).

Owns turning ``--aux-layers`` / ``--aux-convention`` or the draft config's own ids into HF
hidden-state indices in training's concat order (``specdiff.eagle3.aux_layers``), refusing ids
that cannot be used as given.

An SGLang id that the target family's rule captures as the last decoder layer's output *before*
the final norm (SGLang 0.5.23 GPT-OSS capture index L, srt/models/gpt_oss.py:726-738) is
replayed, not refused: its slot is listed as L and marked pre-norm (``TrainAux.prenorm``,
contract ``aux_prenorm_indices``), and the target capture reads it from the final norm's input (``replay.model.target_capture.capture_target``). HF index L in the
``hf`` convention stays what HF defines: after the final norm.
"""

from __future__ import annotations

import dataclasses

from specdiff.eagle3.aux_layers import AuxResolution, ConventionError, engine_capture, resolve_aux_ids
from specdiff.eagle3.engines import FAMILY_CONVENTIONS
from specdiff.eagle3.families import sglang_family_rule
from specdiff.replay.model.checkpoint import LoadedDraft
from specdiff.replay.record.train_options import AUX_CONVENTION_DEFAULT
from specdiff.replay.trainers.errors import RecordTrainError

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


def _resolve_prenorm(ids, conv: str, num_layers: int, architecture: str | None) -> TrainAux | None:
    """The listed resolution of SGLang ``ids`` when the target family's rule captures one of them as
    the last layer's pre-norm output (None otherwise: the plain ``resolve_aux_ids`` applies, with
    its refusals; vLLM / speculators id L and SpecForge id L-1 stay refused there).

    Raises:
        ConventionError: two ids name the pre-norm output, another id names nothing the
            convention captures (the engine drops it) or a layer twice.
    """
    L = num_layers
    if ids is None or conv not in FAMILY_CONVENTIONS or architecture is None:
        # the Llama rule (RULES['sglang']) never reaches the pre-norm output; vLLM / speculators id L and
        # SpecForge id L-1 keep resolve_aux_ids' refusal (tests/replay/record/test_train_order.py pins it)
        return None
    ids = [int(i) for i in ids]
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
    if len(pre) > 1:
        raise ConventionError(f"sglang ids {ids} name the last layer's pre-norm output twice (ids "
                              f"{[ids[k] for k in pre]}); each aux slot must be a different layer")
    if len(set(hf)) != len(hf):
        raise ConventionError(f"sglang ids {ids} name one layer twice (HF {hf}); each aux slot must be a "
                              "different layer")
    note = (f"sglang id {ids[pre[0]]} names the last decoder layer's output before the final norm (the SGLang "
            f"{fam.name} rule of {architecture}, {fam.sources[-1].split(' ')[0]}); no HF hidden_states index holds "
            f"it (HF {L} is after the norm): record train reads slot {pre[0]} from the final norm's input "
            f"(contract aux_prenorm_indices [{L}])")
    return TrainAux(tuple(hf), tuple(ids), "sglang", (), (note,), "listed", prenorm=(L,))


def _family_note(convention: str, architecture: str | None) -> tuple[str, ...]:
    """How SGLang ids were read: the target's rule, or that the plus-one rule was assumed."""
    if convention not in FAMILY_CONVENTIONS:
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
    family's rule (``eagle3.families.sglang_family_rule``: DeepSeek-V3 reads [0, 3, 6] as
    HF [0, 3, 6], Llama as HF [1, 4, 7]); None or an unknown one assumes the plus-one rule, and
    the returned ``notes`` say which rule was used. An id that names the last layer's pre-norm
    output under the target family's SGLang rule (GPT-OSS: ids whose max is L, or id L-1 read +1)
    gives a slot listed as L with ``prenorm == (L,)`` (module docstring).

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
