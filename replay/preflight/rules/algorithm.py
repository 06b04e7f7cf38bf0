"""The speculative-algorithm rule: the draft is an EAGLE-3 checkpoint, served with
``--speculative-algorithm EAGLE3``.
"""

from __future__ import annotations

from specdiff.replay.model.draft_config import SPECFORGE_ARCH, SPECULATORS_ARCHS
from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_algorithm"]


def _normalize_algorithm(a: str) -> str:
    return a.upper().replace("-", "").replace("_", "")


def check_algorithm(draft: DraftInfo, algorithm: str | None, *, target_hidden: int) -> list[Finding]:
    """--speculative-algorithm vs the checkpoint kind."""
    archs = draft.raw.get("architectures") or []
    if draft.format is None:
        return [Finding("algorithm.not_eagle3", "error", "all",
                        f"draft architectures {archs} is not an EAGLE-3 checkpoint (expected {SPECFORGE_ARCH} "
                        f"or {list(SPECULATORS_ARCHS)})",
                        "use an EAGLE-3 draft, or the speculative algorithm this draft was trained for")]
    if algorithm is None:
        return []
    a = _normalize_algorithm(algorithm)
    if a == "EAGLE3":
        return []
    if a == "EAGLE":
        hd = draft.config.hidden_size
        what = ("fc is skipped because the width equals the draft hidden" if target_hidden == hd
                else "fc gets a width it was not built for")
        return [Finding("algorithm.mismatch", "error", "sglang",
                        f"--speculative-algorithm EAGLE with an EAGLE-3 checkpoint ({archs}): no aux layers are "
                        f"captured, the last hidden [{target_hidden}] arrives, {what}, and lm_head is replaced "
                        "by the target's", "serve with --speculative-algorithm EAGLE3")]
    return [Finding("algorithm.mismatch", "error", "all",
                    f"--speculative-algorithm {algorithm} with an EAGLE-3 checkpoint ({archs})",
                    "serve with --speculative-algorithm EAGLE3")]
