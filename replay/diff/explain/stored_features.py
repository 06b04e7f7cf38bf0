"""When the side whose aux rows differ was recorded from a trainer's stored features, the cause is in those
files, not in the draft or the target: the fix says so.

``record train --features`` (replay/record/record_features.py) writes the stored tensors as ``target.aux.*``
and records the ``features`` contract fact (format, directory, the capture layers and where they came from).
Against a target replay of the same tokens (the other side a training trace too), a layer shift (explain/aux.py) or a systematic shift
(judge/shift.py) at ``target.aux.*`` then means the files are not what this target computes at the recorded
layers: they hold other layers than their records say, or came from another target revision. The engine-side
fixes those checks give (change the draft config's layer ids; look for other weights or options) would send
the user to the wrong place. The row-owner checks (explain/row_owner.py) word their own features fix.
"""

from __future__ import annotations

from dataclasses import replace

from specdiff.replay.diff.types import Explanation, Pair
from specdiff.tracer.contract import known

__all__ = ["LAYER_CAUSES", "on_stored_features"]

#: the causes at target.aux.* that say the aux rows hold other layers (explain/aux.py: a shift, a permutation
#: of the slots, another capture) or other values (judge/shift.py), whose fix is the stored files' when one
#: side is stored features
LAYER_CAUSES = ("aux_layer_shift", "aux_slot_permutation", "aux_capture_differs")


def on_stored_features(traces: Pair, first_name: str, explanations: list[Explanation]) -> list[Explanation]:
    """``explanations`` with the fix of each ``LAYER_CAUSES`` or ``systematic_shift`` explanation of a ``target.aux.*`` first
    divergence rewritten to name the stored features, when exactly one side holds them (contract
    ``features``) and both are training traces (the other a target replay); unchanged otherwise."""
    if not first_name.startswith("target.aux"):
        return explanations
    feats = traces.map(lambda t: known(t.contract, "features"))
    if (feats.x is None) == (feats.y is None) or traces.x.side != "train" or traces.y.side != "train":
        # against serving the stored features are training's side as any training trace is: a layer shift
        # there is the draft's served ids (the seed's mistake), fixed in the draft config as ever
        return explanations
    f = feats.x if feats.x is not None else feats.y
    layers = (f.get("capture_layers") or {})
    where = f"{f.get('format', 'stored')} features in {f.get('directory', '?')}"
    said = layers.get("hf_indices")
    source = layers.get("source")
    layer_fix = (f"the stored features ({where}) hold other layers than their records say "
                 f"(HF {said}{f', from {source}' if source else ''}): give record train --features the layers they "
                 "were captured at (--aux-layers, --aux-convention), or regenerate them with the capture the draft is "
                 "served with")
    fix = dict.fromkeys(LAYER_CAUSES, layer_fix)
    fix["systematic_shift"] = (f"the stored features ({where}) are not what this target computes at the recorded "
                               "layers (another target revision or dtype stored them?): regenerate them with the "
                               "target you serve, or diff against a replay of the target they were stored with")
    return [replace(e, fix=fix[e.cause]) if e.cause in fix else e for e in explanations]
