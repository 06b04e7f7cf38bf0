"""The pre-flight report: the ``Finding`` rows and the ``PreflightReport`` that holds them.

Owns the data a check returns and its JSON form (``as_dict``, ``findings_as_facts`` for the
contract field ``findings``). Reading files is in ``files``, what the engines capture in
``engines``, the rule families in ``rules``; the text rendering is ``specdiff check``'s
(``tui/cmd_check.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdiff.replay.preflight.engines import EngineCapture
from specdiff.replay.preflight.files import DraftInfo, TargetInfo

__all__ = ["SEVERITIES", "Finding", "findings_as_facts", "PreflightReport"]

SEVERITIES = ("error", "warn", "info")


@dataclass(frozen=True)
class Finding:
    """One pre-flight finding.

    Attributes:
        kind: dotted category, e.g. ``aux.dropped_id``, ``vocab.d2t_direct``, ``weights.shape``.
        severity: 'error' (serving will crash or be wrong), 'warn' (likely wrong) or 'info'.
        engine: 'sglang', 'vllm' or 'all'.
        message: one line of evidence.
        fix: what to change (may be empty).
    """

    kind: str
    severity: str
    engine: str
    message: str
    fix: str = ""

    def as_fact(self) -> dict:
        """JSON/msgpack-safe dict of the finding."""
        return {"kind": self.kind, "severity": self.severity, "engine": self.engine,
                "message": self.message, "fix": self.fix}


def findings_as_facts(findings) -> list[dict]:
    """Findings as JSON/msgpack-safe dicts for the contract field ``findings``."""
    return [f.as_fact() for f in findings]


@dataclass
class PreflightReport:
    """A check's result: what was read, what each engine captures, the training layers (HF
    indices, concat order) and the findings, error first."""

    target: TargetInfo
    draft: DraftInfo
    engines: tuple[str, ...]
    captures: dict[str, EngineCapture]
    training_hf: tuple[int, ...] | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def as_dict(self) -> dict:
        t, d = self.target, self.draft
        c = d.config
        return {
            "target": {"path": t.path, "num_layers": t.num_layers, "hidden_size": t.hidden_size,
                       "vocab_size": t.vocab_size},
            "draft": {"path": d.path, "format": d.format,
                      "hidden_size": getattr(c, "hidden_size", None),
                      "draft_vocab_size": getattr(c, "draft_vocab_size", None),
                      "num_aux": getattr(c, "num_aux", None)},
            "engines": list(self.engines),
            "captures": {e: cap.as_dict() for e, cap in self.captures.items()},
            "training_hf_indices": None if self.training_hf is None else list(self.training_hf),
            "findings": findings_as_facts(self.findings),
            "counts": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
        }

