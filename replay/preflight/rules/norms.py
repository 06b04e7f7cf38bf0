"""The norm rules: norm_before_fc / fc_norm / norm_output / norm_before_residual against the weights
they need and what each engine does with them (``specdiff.eagle3.norms``).
"""

from __future__ import annotations

from specdiff.eagle3.engines import REGISTRY
from specdiff.eagle3.norms import NORM_FLAGS, SPECFORGE_NORM_OUTPUT
from specdiff.replay.model.weight_files import canonical_name
from specdiff.replay.preflight.engines import checked_specs
from specdiff.replay.preflight.files import DraftInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_norms"]


def check_norms(draft: DraftInfo, *, engines) -> list[Finding]:
    """norm_before_fc / fc_norm / norm_output / norm_before_residual and the weights they need;
    ``norm_before_residual`` is an error on each engine in ``engines`` that does not read it
    (``EngineSpec.norm_before_residual``)."""
    cfg, raw = draft.config, draft.raw
    out: list[Finding] = []
    canon = {canonical_name(n) for n in draft.tensors}
    has_input_norm = "input_norm.weight" in canon
    has_fc_norm = any(c.startswith("fc_norm.") for c in canon)
    if has_input_norm and not cfg.norm_before_fc:
        out.append(Finding("norm.flag_missing", "error", "all",
                           "input_norm.weight is in the checkpoint but norm_before_fc is not set: the engines "
                           "skip the norm over the aux concat that training applied",
                           "set eagle_config.norm_before_fc = true (SGLang reads eagle_config first, then "
                           "the top level)"))
    if has_fc_norm and not cfg.fc_norm:
        out.append(Finding("norm.flag_missing", "error", "all",
                           "fc_norm.{j}.weight are in the checkpoint but fc_norm / use_aux_norm is not set: "
                           "the per-slot norms are skipped", "set fc_norm = true"))
    if cfg.norm_before_fc or cfg.fc_norm:
        flags = [n for n in ("norm_before_fc", "fc_norm") if getattr(cfg, n)]
        out.append(Finding("norm.flags", "info", "all",
                           "; ".join(f"{n} set: {NORM_FLAGS[n].meaning} ({NORM_FLAGS[n].sources['sglang']})"
                                     for n in flags), ""))
    if "norm_output" in raw or "norm_output" in (raw.get("eagle_config") or {}):
        out.append(Finding("norm.norm_output", "warn" if cfg.norm_output else "info", "sglang",
                           f"norm_output={cfg.norm_output}: in SGLang true means the next draft step gets the "
                           f"normed hidden; {SPECFORGE_NORM_OUTPUT}",
                           "check which hidden (pre- or post-norm) training fed back, and set the flag for SGLang"))
    if cfg.norm_before_residual:
        readers = [s.title for s in REGISTRY.values() if s.norm_before_residual]
        fix = (f"serve with {' or '.join(readers)} or " if readers else "") + "retrain without it"
        out += [Finding("norm.norm_before_residual", "error", spec.name,
                        f"norm_before_residual=true (speculators): {spec.label} does not implement it "
                        "(residual = raw hidden)", fix)
                for spec in checked_specs(engines) if not spec.norm_before_residual]
    return out
