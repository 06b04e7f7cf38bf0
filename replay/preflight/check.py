"""``specdiff check``: what each engine will really feed an EAGLE-3 draft, from files only.

``run_preflight(target, draft)`` reads the target's config.json (never its weights; its
architecture picks SGLang's aux-id rule), the draft's
config.json, safetensors headers and ``d2t`` / ``t2d`` (``files``), resolves what each engine
captures (``engines``), runs every rule family that applies (``rules.RULES``) and returns the
``PreflightReport`` (``report``) with findings ordered error, warn, info, the engines whose findings
set the verdict, and what could not be checked. This module is the driver only; the EAGLE-3 facts
come from ``specdiff.eagle3``.
"""

from __future__ import annotations

from specdiff.eagle3.aux_layers import CONVENTIONS, ConventionError, resolve_aux_ids
from specdiff.eagle3.config_ids import draft_engines
from specdiff.eagle3.engines import ENGINES, REGISTRY
from specdiff.replay.model.weight_files import canonical_name
from specdiff.replay.preflight.engines import EngineCapture, fc_slots, resolve_engine_capture
from specdiff.replay.preflight.files import PreflightError, read_draft, read_target
from specdiff.replay.preflight.report import (
    SEVERITIES,
    Finding,
    PreflightReport,
    Unchecked,
    findings_as_facts,
)
from specdiff.replay.preflight.rules import RULES, RuleInputs

__all__ = ["run_preflight", "PreflightError", "PreflightReport", "findings_as_facts"]


def _training_hf(layers, convention: str, num_layers: int, architecture: str | None) -> tuple[int, ...] | None:
    if layers is None:
        return None
    if convention not in CONVENTIONS:
        raise PreflightError(f"--training-convention {convention!r}: use one of {', '.join(CONVENTIONS)}")
    try:
        return resolve_aux_ids(list(layers), convention=convention, num_layers=num_layers,
                               concat="listed", architecture=architecture).hf_indices
    except ConventionError as e:
        raise PreflightError(f"--training-layers {list(layers)}: {e}") from None


#: what ``check`` says when no training layers were given (a shifted id list passes every other rule)
TRAINING_UNCHECKED = Unchecked(
    "training_layers", "--training-layers",
    "whether the layers each engine feeds are the layers the draft was trained on: a draft whose aux ids are "
    "all shifted passes every other rule; give --training-layers (HF indices, or another numbering with "
    "--training-convention) to check it")


def _judged(engines: tuple[str, ...], draft_for: tuple[str, ...]) -> tuple[str, ...]:
    """The engines whose findings set the verdict: the one engine asked for; of several, those the
    draft is written for (every one checked when it is written for none of them)."""
    if len(engines) == 1:
        return engines
    return tuple(e for e in engines if e in draft_for) or engines


def run_preflight(target, draft, *, engines=ENGINES, training_layers=None, training_convention: str = "hf",
                  speculative_algorithm: str | None = "EAGLE3", served_dtype: str = "auto",
                  context_length: int | None = None) -> PreflightReport:
    """Read both directories and return the report (findings ordered error, warn, info).

    ``engines``: the engines checked. Their findings are all reported; the verdict (``report.failing``,
    ``report.verdicts()``) follows one engine asked for, or, of several, those the draft's config is
    written for (``eagle3.config_ids.draft_engines``: SGLang's ``eagle_config`` ids, vLLM's top-level
    ids or the speculators layout); the others' findings say what would break there.
    ``served_dtype``: the server's --dtype (SGLang's ``auto`` rule applied to the draft's config);
    ``context_length``: the server's --context-length (None: derived from the target's config).

    Raises:
        PreflightError: a directory that cannot be checked (one line).
    """
    engines = tuple(e for e in ENGINES if e in engines)
    if not engines:
        raise PreflightError("no engine selected: use sglang, vllm or all")
    t = read_target(target)
    d = read_draft(draft)
    train_hf = _training_hf(training_layers, training_convention, t.num_layers, t.architecture)
    captures: dict[str, EngineCapture] = {}
    k_weights = None
    if d.format is not None:
        cfg = d.config
        fc_shape = next((shape for n, (shape, _) in d.tensors.items() if canonical_name(n) == "fc.weight"), None)
        k_weights = (fc_shape[1] // t.hidden_size if fc_shape is not None and len(fc_shape) == 2
                     and fc_shape[1] % t.hidden_size == 0 else cfg.num_aux)
        for e in engines:
            k = fc_slots(d.raw) if (REGISTRY[e].fc_slots_from_config and d.format == "specforge") else k_weights
            captures[e] = resolve_engine_capture(e, raw=d.raw, fmt=d.format, num_layers=t.num_layers, k_fc=k,
                                                 aux_width=t.hidden_size, draft_hidden=cfg.hidden_size,
                                                 architecture=t.architecture)
    inputs = RuleInputs(target=t, draft=d, engines=engines, captures=captures, training_hf=train_hf,
                        k_weights=k_weights, algorithm=speculative_algorithm, served_dtype=served_dtype,
                        context_length=context_length)
    findings: list[Finding] = [f for rule in RULES if rule.applies(inputs) for f in rule.check(inputs)]
    findings = [f for f in findings if f.engine == "all" or f.engine in engines]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    draft_for = draft_engines(d.raw, d.format)
    unchecked = [TRAINING_UNCHECKED] if train_hf is None and d.format is not None else []
    return PreflightReport(target=t, draft=d, engines=engines, captures=captures, training_hf=train_hf,
                           findings=findings, draft_for=draft_for, judged=_judged(engines, draft_for.engines),
                           unchecked=unchecked)
