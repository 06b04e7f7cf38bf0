"""The pre-flight report: the ``Finding`` rows and the ``PreflightReport`` that holds them.

Owns the data a check returns and its JSON form (``as_dict``, ``findings_as_facts`` for the
contract field ``findings``): which engines' findings set the verdict (``judged``: the engine
asked for, else the ones the draft is written for), each engine's verdict, and what could not be
checked from the files given (``Unchecked``). Reading files is in ``files``, what the engines capture in
``engines``, the rule families in ``rules``; the text rendering is ``specdiff check``'s
(``tui/cmd_check.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdiff.eagle3.config_ids import DraftEngines
from specdiff.replay.preflight.engines import EngineCapture
from specdiff.replay.preflight.files import DraftInfo, TargetInfo

__all__ = ["SEVERITIES", "Finding", "findings_as_facts", "Unchecked", "EngineVerdict", "PreflightReport"]

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


@dataclass(frozen=True)
class Unchecked:
    """Something the check could not judge from what it was given, and what would let it.

    Attributes:
        what: short id ('training_layers').
        flag: the ``specdiff check`` option that supplies it ('--training-layers').
        message: one line: what was not checked, why it matters, how to check it.
    """

    what: str
    flag: str
    message: str

    def as_dict(self) -> dict:
        """JSON-safe dict."""
        return {"what": self.what, "flag": self.flag, "message": self.message}


@dataclass(frozen=True)
class EngineVerdict:
    """One engine's verdict.

    Attributes:
        engine: 'sglang' or 'vllm'.
        judged: whether its findings set the exit code (the engine asked for, or one the draft is
            written for); False: information only, what would break if the draft were served there.
        counts: severity -> findings for this engine or for every engine ('all').
    """

    engine: str
    judged: bool
    counts: dict[str, int]

    @property
    def outcome(self) -> str:
        """'ok', 'error' (a judged engine with an error finding) or 'not for this engine'."""
        if not self.judged:
            return "not for this engine"
        return "error" if self.counts["error"] else "ok"

    def as_dict(self) -> dict:
        """JSON-safe dict."""
        return {"engine": self.engine, "judged": self.judged, "outcome": self.outcome, "counts": dict(self.counts)}


def _counts(findings) -> dict[str, int]:
    findings = list(findings)
    return {s: sum(f.severity == s for f in findings) for s in SEVERITIES}


@dataclass
class PreflightReport:
    """A check's result: what was read, what each engine captures, the training layers (HF
    indices, concat order) and the findings, error first.

    ``draft_for``: the engines the draft's config is written for (``eagle3.config_ids.draft_engines``);
    ``judged``: the engines whose findings set the verdict (empty: every engine checked);
    ``unchecked``: what could not be judged from the inputs given.
    """

    target: TargetInfo
    draft: DraftInfo
    engines: tuple[str, ...]
    captures: dict[str, EngineCapture]
    training_hf: tuple[int, ...] | None
    findings: list[Finding] = field(default_factory=list)
    draft_for: DraftEngines | None = None
    judged: tuple[str, ...] = ()
    unchecked: list[Unchecked] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        """Every error finding, judged engines or not (``failing``: those that set the verdict)."""
        return [f for f in self.findings if f.severity == "error"]

    def judges(self, f: Finding) -> bool:
        """Whether finding ``f`` counts toward the verdict: it concerns every engine or a judged one."""
        return f.engine == "all" or not self.judged or f.engine in self.judged

    @property
    def failing(self) -> list[Finding]:
        """The error findings that set the verdict (``specdiff check`` exits 1 when there is one)."""
        return [f for f in self.errors if self.judges(f)]

    @property
    def counts(self) -> dict[str, int]:
        """severity -> findings that count toward the verdict."""
        return _counts(f for f in self.findings if self.judges(f))

    def verdicts(self) -> dict[str, EngineVerdict]:
        """engine -> its verdict, for every engine checked, in ``engines`` order."""
        return {e: EngineVerdict(e, not self.judged or e in self.judged,
                                 _counts(f for f in self.findings if f.engine in (e, "all")))
                for e in self.engines}

    def as_dict(self) -> dict:
        """JSON-safe dict (``specdiff check --format json``): ``counts`` and each finding's ``judged``
        follow the verdict; ``verdicts`` per engine; ``not_checked`` what needs another input."""
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
            "draft_for": None if self.draft_for is None else {"engines": list(self.draft_for.engines),
                                                              "why": self.draft_for.why},
            "judged_engines": list(self.judged or self.engines),
            "verdicts": {e: v.as_dict() for e, v in self.verdicts().items()},
            "captures": {e: cap.as_dict() for e, cap in self.captures.items()},
            "training_hf_indices": None if self.training_hf is None else list(self.training_hf),
            "findings": [{**f.as_fact(), "judged": self.judges(f)} for f in self.findings],
            "not_checked": [u.as_dict() for u in self.unchecked],
            "counts": self.counts,
        }

