"""The attention-window rule: a draft config that gives its layers a window (``layer_types`` /
``sliding_window``, speculators' keys, eagle3/attention_window.py) against what an engine that reads the
window from a server option only (``EngineSpec.draft_window_option``, read at ``draft_window_site``) builds
from it: nothing, unless the server is given that option. Engines that read the config's keys get no finding.
"""

from __future__ import annotations

from specdiff.eagle3.engines import EngineSpec
from specdiff.replay.preflight.engines import checked_specs
from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_window"]


def check_window(draft: DraftInfo, *, engines: tuple[str, ...]) -> list[Finding]:
    """One finding per engine in ``engines`` that reads the window from a server option only
    (``EngineSpec.draft_window_option``) when the draft config gives any layer a window: it serves full
    attention unless told the window, and with it windows every layer and counts the step's draft tokens
    (depth >= 1 differs from speculators' rule by construction; SGLang 0.5.23, the one engine with the
    option, reads it so at llama_eagle3.py:286-299, its size being the config's sliding_window - 1)."""
    windows = draft.config.attention_windows
    told = [s for s in checked_specs(engines) if s.draft_window_option]
    if windows is None or not told:
        return []
    sizes = sorted({w for w in windows if w is not None})
    slid = [i for i, w in enumerate(windows) if w is not None]
    where = f"layers {slid}" if len(slid) < len(windows) else "every layer"
    return [_ignored(spec, sizes, where, every=len(sizes) == 1 and len(slid) == len(windows)) for spec in told]


def _ignored(spec: EngineSpec, sizes: list[int], where: str, *, every: bool) -> Finding:
    """``window.config_ignored`` for ``spec``: the windows ``sizes`` the config gives ``where``; ``every``: one
    size on every layer, which the server option can give."""
    name, option = spec.title, spec.draft_window_option
    if every:
        fix = (f"serve with {option} {sizes[0]} (the config's sliding_window - 1); rows past the "
               f"window at TTT depth >= 1 still differ ({name} counts the step's draft tokens in the window, "
               "speculators does not), so `record train --replay` that serving trace to see how much")
    else:
        fix = (f"{name} windows every draft layer with one size or none: retrain with one window on every layer (or "
               "none), or serve the draft on an engine that reads layer_types")
    return Finding("window.config_ignored", "warn", spec.name,
                   f"the draft config gives {where} an attention window of {sizes} keys back (layer_types / "
                   f"sliding_window); {spec.label} ignores those keys and serves full attention unless started "
                   f"with {option} ({spec.draft_window_site})", fix)
