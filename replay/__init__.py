"""specdiff.replay: EAGLE-3 reference forward, replay/graft, align, compare, explain.

Reference forward API (torch only; transformers is imported lazily by ``load_target``):

- ``Eagle3DraftConfig``, ``Eagle3Draft`` (``ttt_forward`` -> ``TTTOutput``), ``ttt_labels``
- ``load_draft`` / ``save_draft`` / ``LoadedDraft`` / ``CheckpointError``
- ``load_target`` / ``capture_target`` / ``TargetCapture`` / ``TargetError``
"""

from .checkpoint import CheckpointError, LoadedDraft, load_draft, save_draft
from .draft_model import Eagle3Draft, Eagle3DraftConfig, RowBlock, TTTOutput, ttt_labels
from .target_capture import TargetCapture, TargetError, capture_target, load_target

__all__ = [
    "Eagle3DraftConfig", "Eagle3Draft", "TTTOutput", "RowBlock", "ttt_labels",
    "CheckpointError", "LoadedDraft", "load_draft", "save_draft",
    "TargetError", "TargetCapture", "capture_target", "load_target",
]
