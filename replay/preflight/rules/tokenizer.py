"""The tokenizer rules: the draft directory's tokenizer and chat template against the target's."""

from __future__ import annotations

from specdiff.replay.preflight.files import DraftInfo, TargetInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_tokenizer"]


def check_tokenizer(draft: DraftInfo, target: TargetInfo) -> list[Finding]:
    """Tokenizer / chat template of the draft directory vs the target's, when both are present."""
    out = []
    if draft.tokenizer_sha256 and target.tokenizer_sha256 and draft.tokenizer_sha256 != target.tokenizer_sha256:
        out.append(Finding("tokenizer.mismatch", "warn", "all",
                           f"draft tokenizer.json sha256 {draft.tokenizer_sha256[:12]} != target "
                           f"{target.tokenizer_sha256[:12]}: training data may have used another tokenizer",
                           "train the draft on data tokenized with the target's tokenizer"))
    if draft.chat_template_sha256 and target.chat_template_sha256 \
            and draft.chat_template_sha256 != target.chat_template_sha256:
        out.append(Finding("tokenizer.chat_template", "warn", "all",
                           f"draft chat template sha256 {draft.chat_template_sha256[:12]} != target "
                           f"{target.chat_template_sha256[:12]}: training prompts were formatted differently "
                           "from serving", "regenerate the training data with the target's chat template"))
    return out


