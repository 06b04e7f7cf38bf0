"""specdiff.replay: EAGLE-3 reference forward, replay/graft, align, compare, explain.

Reference forward API (torch only; transformers is imported lazily by ``load_target``):

- ``Eagle3DraftConfig``, ``Eagle3Draft`` (``ttt_forward`` -> ``TTTOutput``), ``ttt_labels``
- ``load_draft`` / ``save_draft`` / ``LoadedDraft`` / ``CheckpointError``
- ``load_target`` / ``capture_target`` / ``TargetCapture`` / ``TargetError``
"""

import importlib

# Lazy (PEP 562): the diff engine imports specdiff.replay.* without paying for torch.
_EXPORTS = {
    "Eagle3DraftConfig": "model.draft_model", "Eagle3Draft": "model.draft_model", "TTTOutput": "model.draft_model",
    "ttt_labels": "model.draft_model",
    "CheckpointError": "model.checkpoint", "LoadedDraft": "model.checkpoint", "load_draft": "model.checkpoint",
    "save_draft": "model.checkpoint",
    "TargetError": "model.target_capture", "TargetCapture": "model.target_capture", "capture_target": "model.target_capture",
    "load_target": "model.target_capture",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
