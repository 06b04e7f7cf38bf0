"""The attention-window rule: a draft config that gives its layers a window (``layer_types`` /
``sliding_window``, speculators' keys, eagle3/attention_window.py) against what SGLang 0.5.23 builds
from it: nothing, unless the server is given ``--speculative-draft-window-size`` (llama_eagle3.py:286-299).
"""

from __future__ import annotations

from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_window"]


def check_window(draft: DraftInfo, *, engines: tuple[str, ...]) -> list[Finding]:
    """One SGLang finding when the draft config gives any layer a window: SGLang serves full attention
    unless told the window, and with it windows every layer and counts the step's draft tokens (depth >= 1
    differs from speculators' rule by construction)."""
    windows = draft.config.attention_windows
    if windows is None or "sglang" not in engines:
        return []
    sizes = sorted({w for w in windows if w is not None})
    slid = [i for i, w in enumerate(windows) if w is not None]
    where = f"layers {slid}" if len(slid) < len(windows) else "every layer"
    if len(sizes) == 1 and len(slid) == len(windows):
        fix = (f"serve with --speculative-draft-window-size {sizes[0]} (the config's sliding_window - 1); rows past the "
               "window at TTT depth >= 1 still differ (SGLang counts the step's draft tokens in the window, "
               "speculators does not), so `record train --replay` that serving trace to see how much")
    else:
        fix = ("SGLang windows every draft layer with one size or none: retrain with one window on every layer (or "
               "none), or serve the draft on an engine that reads layer_types")
    return [Finding("window.config_ignored", "warn", "sglang",
                    f"the draft config gives {where} an attention window of {sizes} keys back (layer_types / "
                    "sliding_window); SGLang 0.5.23 ignores those keys and serves full attention unless started "
                    "with --speculative-draft-window-size (llama_eagle3.py:286-299)", fix)]
