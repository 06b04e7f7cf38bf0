"""The aux layers the training side feeds the draft (``record train``).

Owns turning ``--aux-layers`` / ``--aux-convention`` or the draft config's own ids into HF
hidden-state indices in training's concat order (``specdiff.eagle3.aux_layers``), refusing ids
that cannot be used as given.
"""

from __future__ import annotations

import dataclasses

from specdiff.eagle3.aux_layers import AuxResolution, ConventionError, resolve_aux_ids
from specdiff.replay.model.checkpoint import LoadedDraft
from specdiff.replay.record.errors import RecordTrainError
from specdiff.replay.record.train_options import AUX_CONVENTION_DEFAULT

__all__ = ["resolve_train_aux"]


def resolve_train_aux(loaded: LoadedDraft, num_layers: int, aux_layers=None,
                      aux_convention: str | None = None) -> AuxResolution:
    """The aux layers training feeds, in the order listed (slot j = the j-th id): ``aux_layers``
    read in ``aux_convention`` (default ``hf``), else the draft config's own ids in its
    convention and order (tool default when it has none).

    Raises RecordTrainError when the ids are invalid, cannot be used in the order given (a
    layer twice, an id the convention never captures) or their count differs from the draft's K.
    """
    c = loaded.config
    try:
        if aux_layers is not None:
            res = resolve_aux_ids(list(aux_layers), convention=aux_convention or AUX_CONVENTION_DEFAULT,
                                  num_layers=num_layers, concat="listed")
        else:
            res = resolve_aux_ids(c.eagle_aux_hidden_state_layer_ids, convention=c.aux_convention,
                                  num_layers=num_layers, concat="listed")
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
    if aux_layers is None and list(res.hf_indices) != sorted(res.hf_indices):
        res = dataclasses.replace(res, notes=res.notes + (
            f"the draft config lists its aux ids {c.eagle_aux_hidden_state_layer_ids} out of ascending order: "
            f"the training side concatenates them as listed, HF {list(res.hf_indices)} (as SpecForge does); "
            f"SGLang concatenates HF {sorted(res.hf_indices)}. If training concatenated in ascending order, "
            "pass --aux-layers in that order",))
    return res
