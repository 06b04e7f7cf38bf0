"""MoE routing near-ties: a named, legitimate difference at ``target.aux.{j}``.

On a mixture-of-experts target every layer's router picks the top-k experts of each token. Two
engines compute the router logits with different bf16 rounding (another kernel, batch shape or
summation order), so a token whose k-th and (k+1)-th expert scores are a near tie goes to
another expert on each side. That layer's output at that token then differs by far more than
bf16 noise (issue 20: tiny Qwen3-MoE, 4 experts top-2, ``target.aux.1`` rows at max_rel 0.10;
GPT-OSS rows up to 0.59), while the layer before it agrees, and the flip is a per-token event:
isolated positions, a few percent of them.

``routing_flips`` names that pattern when the target is MoE (a contract fact) and every failing
row of an aux slot j >= 1 whose inputs agree fits it:

- the previous slot ``target.aux.{j-1}`` agrees at that row (the layer before the flip);
- the rows are isolated: no run of more than ``ROUTING_MAX_RUN`` consecutive positions of one
  sequence (a real bug at a position range, a wrong chunk, a wrong layer, fails runs or most
  rows);
- each row still points the same way (cosine > 0, rel error < ``ROUTING_MAX_REL``): other experts
  of the same layer, not another layer or garbage;
- they are few: at most ``ROUTING_MAX_FRAC`` of the rows whose inputs agree (the target stage's
  fail fraction on an MoE target; the default bf16 one, 2 %, is below the 2.7-3.9 % measured on
  the tiny MoE targets of issue 20).

Slot 0 is never named: no earlier slot shows that the layer before agreed. Those rows are
judged by the stage's tolerance as before, and, within it, the rows they feed are inherited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.tracer.contract import known
from specdiff.tracer.schema import aux_name, aux_slot

#: most rows of an aux slot (of those whose inputs agree) that routing near-ties may explain
ROUTING_MAX_FRAC = 0.10
#: longest run of consecutive failing positions of one sequence that is still "isolated"
ROUTING_MAX_RUN = 2
#: a flipped row is other experts' output of the same layer: related to the right row
ROUTING_MAX_REL = 1.0

#: why slot 0's failing rows are never named routing near-ties (for the report)
SLOT0_WHY = ("slot 0 has no earlier aux slot to show that the layer before the flip agreed, so its rows are "
             "judged by the stage's tolerance")
#: HF architectures whose decoder layers route tokens to experts (SGLang 0.5.23 model files:
#: srt/models/qwen3_moe.py, qwen2_moe.py, deepseek_v2.py (V2, V3, Kimi-K2), gpt_oss.py,
#: mixtral.py, glm4_moe.py, llama4.py, kimi_k25.py), used when the contract records the
#: architecture but not the expert counts.
MOE_ARCHITECTURES = frozenset({
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
    "GptOssForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM", "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration", "KimiK25ForConditionalGeneration",
})
#: HF architectures with dense MLPs only (SGLang 0.5.23 srt/models/llama.py, qwen2.py, qwen3.py,
#: mistral.py, gemma2.py, gemma3_causal.py, phi3.py)
DENSE_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM", "Gemma2ForCausalLM",
    "Gemma3ForCausalLM", "Phi3ForCausalLM",
})
#: contract facts naming the target family (the live contract; the training side as fallback)
FAMILY_FIELDS = ("target_architecture", "target_num_experts", "target_experts_per_token")


@dataclass(frozen=True)
class TargetFamily:
    """What the contracts say about the target's routing.

    Attributes:
        architecture: HF architecture name, or None when neither side recorded it.
        moe: True (routes tokens to experts), False (dense), None (unknown).
        num_experts, experts_per_token: routed experts and top-k, where recorded.
        source: the side label whose contract said it, or ``"unknown"``.
    """

    architecture: str | None
    moe: bool | None
    num_experts: int | None
    experts_per_token: int | None
    source: str

    def words(self) -> str:
        """``Qwen3MoeForCausalLM, 4 experts, top-2 (serving contract)`` or ``target family unknown``."""
        if self.moe is None and self.architecture is None:
            return "target family unknown (no target_architecture / target_num_experts in either contract)"
        parts = [self.architecture or "architecture not recorded"]
        if self.num_experts:
            parts.append(f"{self.num_experts} experts")
        if self.experts_per_token:
            parts.append(f"top-{self.experts_per_token}")
        kind = {True: "MoE", False: "dense", None: "MoE unknown"}[self.moe]
        return f"{', '.join(parts)} ({kind}; {self.source} contract)"


def _int(v) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def target_family(traces, labels) -> TargetFamily:
    """The target family from the contracts (``traces``/``labels``: ``Pair``): the serving side's
    facts first (the live contract reads the loaded model), then the training side's."""
    order = [(traces.y, labels.y), (traces.x, labels.x)]
    if traces.x.side == "serve" and traces.y.side != "serve":
        order.reverse()
    for trace, label in order:
        c = trace.contract
        arch = known(c, "target_architecture")
        n, k = _int(known(c, "target_num_experts")), _int(known(c, "target_experts_per_token"))
        if arch is None and n is None:
            continue
        if n is not None:
            moe = n > 1 and (k is None or k < n)
        elif "target_num_experts" in c and c["target_num_experts"] is None:
            moe = False  # recorded as null: the recorder read a dense config (tracer/contract.py moe_routing_facts)
        else:
            a = str(arch)
            moe = True if a in MOE_ARCHITECTURES or "Moe" in a else False if a in DENSE_ARCHITECTURES else None
        return TargetFamily(str(arch) if arch is not None else None, moe, n, k, label)
    return TargetFamily(None, None, None, None, "unknown")


def eligible(name: str, family: TargetFamily) -> bool:
    """Whether failing rows of tensor ``name`` may be routing near-ties (an aux slot j >= 1 of an
    MoE target)."""
    j = aux_slot(name)
    return bool(family.moe) and j is not None and j >= 1


def bound(tolerance) -> float:
    """The fail fraction routing near-ties may explain at an eligible slot (never below the
    stage's own)."""
    return max(ROUTING_MAX_FRAC, tolerance.max_fail_frac)


@dataclass(frozen=True)
class RoutingFlips:
    """Rows of one aux slot explained as MoE routing near-ties (JSON-safe).

    Attributes:
        tensor: ``target.aux.{j}``; previous: ``target.aux.{j-1}`` (agrees at every row).
        rows: ``[{"seq", "pos", "rel", "cos"}]`` of every explained row (aligned keys).
        fraction: explained rows / rows whose inputs agree; bound: ``ROUTING_MAX_FRAC`` used.
        max_rel: the largest relative error among them; longest_run: their longest run of
            consecutive positions in one sequence.
        family: ``TargetFamily.words()``.
    """

    tensor: str
    previous: str
    rows: list
    fraction: float
    bound: float
    max_rel: float
    longest_run: int
    family: str

    @property
    def cause(self) -> str:
        return "moe_routing_near_tie"

    def message(self) -> str:
        return (f"MoE routing near-tie: {len(self.rows)} {self.tensor} row(s) ({self.fraction:.1%} of the rows whose "
                f"inputs agree, at most {self.bound:.0%} allowed) differ where {self.previous} agrees, at isolated "
                f"positions (longest run {self.longest_run}), max_rel {self.max_rel:.3g}: bf16 near-ties in the "
                f"router send these tokens to other experts on the two sides [{self.family}]")

    def evidence(self, limit: int = 8) -> list[str]:
        lines = [f"seq {r['seq']} pos {r['pos']}: rel {r['rel']:.3g}, cos {r['cos']:.4f}" for r in self.rows[:limit]]
        if len(self.rows) > limit:
            lines.append(f"... {len(self.rows) - limit} more")
        return lines


def _longest_run(pair: np.ndarray, pos: np.ndarray) -> int:
    """Longest run of consecutive positions within one pair, over rows sorted by (pair, pos)."""
    if not len(pair):
        return 0
    step = (np.diff(pair) == 0) & (np.diff(pos) == 1)
    best = run = 1
    for s in step:
        run = run + 1 if s else 1
        best = max(best, run)
    return best


def routing_flips(comp, previous, family: TargetFamily, candidates: np.ndarray,
                  counted: np.ndarray) -> RoutingFlips | str | None:
    """The routing near-ties that explain ``candidates`` (bool [n]: the failing rows of
    ``comp``, a ``target.aux.{j}`` comparison, whose inputs agree); when any of them does not fit
    (module doc) nothing is explained and the answer is why, in words (for the report); None when
    the tensor is not eligible or nothing fails.

    ``previous``: the comparison of ``target.aux.{j-1}`` (None: not compared, nothing is
    explained); ``counted``: bool [n], the rows whose inputs agree (the fraction's denominator).
    """
    if not eligible(comp.name, family) or previous is None or not candidates.any():
        return None
    m = comp.match
    idx = np.nonzero(candidates)[0]
    readable = int((counted & (comp.status != 4)).sum())  # compare.UNREADABLE
    frac = len(idx) / readable if readable else 1.0
    if comp.nonfinite[idx].any():
        return "non-finite rows"
    if frac > bound(comp.tolerance):
        return (f"{len(idx)} rows ({frac:.1%}) whose inputs agree fail, more than the {bound(comp.tolerance):.0%} "
                "routing near-ties may explain")
    if (comp.score[idx] >= ROUTING_MAX_REL).any() or (comp.cos[idx] <= 0).any():
        return f"some rows are unrelated to the other side's (rel >= {ROUTING_MAX_REL:g} or cosine <= 0)"
    # the previous slot must have agreed at every one of these rows
    pm = previous.match
    pkeys = (pm.pair.astype(np.int64) << 32) | pm.pos.astype(np.int64)
    keys = (m.pair[idx].astype(np.int64) << 32) | m.pos[idx].astype(np.int64)
    order = np.argsort(pkeys)
    at = np.searchsorted(pkeys[order], keys)
    found = at < len(pkeys)
    at = np.minimum(at, max(len(pkeys) - 1, 0))
    if not len(pkeys) or not (found & (pkeys[order][at] == keys)).all():
        return f"{previous.name} has no row at some of them"
    if (previous.status[order][at] > 1).any():  # DIVERGED or UNREADABLE there
        return f"{previous.name} already differs (or is unreadable) at some of them"
    run = _longest_run(m.pair[idx], m.pos[idx])
    if run > ROUTING_MAX_RUN:
        return f"they form a run of {run} consecutive positions (a near-tie flips single tokens)"
    rows = [{"seq": int(m.pair[i]), "pos": int(m.pos[i]), "rel": float(comp.score[i]), "cos": float(comp.cos[i])}
            for i in idx]
    j = aux_slot(comp.name)
    return RoutingFlips(comp.name, aux_name(j - 1), rows, frac, bound(comp.tolerance),
                        float(comp.score[idx].max()), run, family.words())


__all__ = ["TargetFamily", "RoutingFlips", "target_family", "routing_flips", "eligible", "bound",
           "SLOT0_WHY", "MOE_ARCHITECTURES", "DENSE_ARCHITECTURES", "ROUTING_MAX_FRAC", "ROUTING_MAX_RUN", "ROUTING_MAX_REL", "FAMILY_FIELDS"]
