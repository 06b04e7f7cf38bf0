"""The aux layers the training side feeds the draft (``record train``).

Owns turning ``--aux-layers`` / ``--aux-convention`` or the draft config's own ids into HF
hidden-state indices in training's concat order (``specdiff.eagle3.aux_layers``), refusing ids
that cannot be used as given.
"""

from __future__ import annotations

import dataclasses

from specdiff.eagle3.aux_layers import AuxResolution, ConventionError, resolve_aux_ids, sglang_family_rule
from specdiff.replay.model.checkpoint import LoadedDraft
from specdiff.replay.record.errors import RecordTrainError
from specdiff.replay.record.train_options import AUX_CONVENTION_DEFAULT

__all__ = ["resolve_train_aux"]


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
                      aux_convention: str | None = None, *, architecture: str | None = None) -> AuxResolution:
    """The aux layers training feeds, in the order listed (slot j = the j-th id): ``aux_layers``
    read in ``aux_convention`` (default ``hf``), else the draft config's own ids in its
    convention and order (tool default when it has none).

    ``architecture`` is the target's HF ``architectures[0]``: SGLang ids are read by that
    family's rule (``eagle3.aux_layers.sglang_family_rule``: DeepSeek-V3 reads [0, 3, 6] as
    HF [0, 3, 6], Llama as HF [1, 4, 7]); None or an unknown one assumes the plus-one rule, and
    the returned ``notes`` say which rule was used.

    Raises RecordTrainError when the ids are invalid, cannot be used in the order given (a
    layer twice, an id the convention never captures) or their count differs from the draft's K.
    """
    c = loaded.config
    conv = (aux_convention or AUX_CONVENTION_DEFAULT) if aux_layers is not None else c.aux_convention
    try:
        ids = list(aux_layers) if aux_layers is not None else c.eagle_aux_hidden_state_layer_ids
        res = resolve_aux_ids(ids, convention=conv, num_layers=num_layers, concat="listed", architecture=architecture)
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
    return res
