"""Each target family EAGLE-3 is served on, on real CPU SGLang servers (tests/support/family_servers.py:
one server per (family, mode), shared with test_family_contract.py and test_family_correct_pairs.py):

- every request completes with accept lengths reported;
- every served greedy token is the target's own greedy token (transformers, float32, teacher-forced
  on the served sequence) or a bfloat16 near tie of it (``FLOAT32_CHECKED``), or on an MoE target the
  greedy of a router near tie's other choice, proven by re-running the reference with that decision
  flipped;
- speculative greedy output equals the plain output up to the first near tie of the plain run
  (``replay.diff.measure.tolerance.first_near_tie``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("sglang")

from support.family_servers import (  # noqa: E402
    FAMILIES,
    FLOAT32_CHECKED,
    FLOAT32_TOKENS,
    MAX_NEW,
    MODES,
    MOE_FAMILIES,
    PLAIN_FAMILIES,
    SPEC_MODES,
)

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(3600)]


def _teacher_forced_logits(target: Path, prompt: list[int], output: list[int]):
    """float32 transformers logits [len(output), V] that predict each output token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1]


#: router decisions closer than this (choice-score units: softmax probability, or DeepSeek-V3's biased
#: sigmoid group score) are the candidates the routing-flip proof forces the other way. Only a
#: candidate: the proof re-runs the reference with that one decision flipped and accepts a served token
#: only when it then is the greedy (within a near tie). transformers bf16 vs float32 router logits of
#: the random-init DeepSeek-V3 target differ by up to 0.012, so a group score by up to ~0.006.
ROUTER_CANDIDATE_MARGIN = 0.02


class _ForcedRouting:
    """The float32 transformers target with each MoE router's selection recomputed here, so one
    decision (layer, position) can be forced to the runner-up: a bf16 engine whose router sees a
    near tie (the two choices ``margin`` apart) may pick either. Mirrors transformers 5.19's
    routers: Qwen3-MoE softmax top-k (``modeling_qwen3_moe.py`` ``Qwen3MoeTopKRouter``), DeepSeek-V3
    sigmoid + ``e_score_correction_bias``, ``topk_group`` of ``n_group`` groups by their top-2 sum,
    then top-k (``modeling_deepseek_v3.py`` ``DeepseekV3TopkRouter``); GPT-OSS is not float32-checked.

    ``margins[layer]``: float [T], the smaller of a token's group and expert boundary margins, from the
    last forward; ``flip``: (layer, position) to force, or None."""

    def __init__(self, model):
        self.model, self.margins, self.flip = model, {}, None
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                gate.forward = self._routed(i, gate)

    def _routed(self, layer: int, gate):
        grouped = hasattr(gate, "e_score_correction_bias")

        def forward(hidden):
            logits = torch.nn.functional.linear(hidden.reshape(-1, gate.hidden_dim).float(), gate.weight.float())
            probs = logits.sigmoid() if grouped else logits.softmax(-1)
            choice = probs + gate.e_score_correction_bias if grouped else probs.clone()
            flip_row = self.flip[1] if self.flip and self.flip[0] == layer else None
            inf = torch.full((len(choice),), float("inf"))
            group_margin = inf
            if grouped and gate.topk_group < gate.num_group:
                g = choice.view(len(choice), gate.num_group, -1).topk(2, dim=-1)[0].sum(-1)
                order = g.argsort(dim=-1, descending=True)
                gs = g.gather(1, order)
                group_margin = gs[:, gate.topk_group - 1] - gs[:, gate.topk_group]
                keep = order[:, :gate.topk_group].clone()
                expert_margin = self._expert_margin(choice, keep, gate)
                if flip_row is not None and group_margin[flip_row] <= expert_margin[flip_row]:
                    keep[flip_row, -1] = order[flip_row, gate.topk_group]  # the runner-up group
                    flip_row = None
                mask = torch.zeros_like(g, dtype=torch.bool).scatter_(1, keep, True)
                choice = choice.masked_fill(~mask.repeat_interleave(gate.num_experts // gate.num_group, 1), float("-inf"))
            top = choice.topk(min(gate.top_k + 1, choice.shape[1]), dim=-1)
            expert_margin = top.values[:, gate.top_k - 1] - top.values[:, gate.top_k] if top.values.shape[1] > gate.top_k \
                else inf
            idx = top.indices[:, :gate.top_k].clone()
            if flip_row is not None and top.values.shape[1] > gate.top_k:
                idx[flip_row, -1] = top.indices[flip_row, gate.top_k]  # the runner-up expert
            self.margins[layer] = torch.minimum(group_margin, expert_margin)
            weights = probs.gather(1, idx)
            if gate.norm_topk_prob:
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
            if grouped:
                weights = weights * gate.routed_scaling_factor
            return logits, weights, idx

        return forward

    @staticmethod
    def _expert_margin(choice, keep, gate):
        per = gate.num_experts // gate.num_group
        kept = choice.view(len(choice), gate.num_group, per).gather(1, keep[..., None].expand(-1, -1, per)).flatten(1)
        if kept.shape[1] <= gate.top_k:
            return torch.full((len(choice),), float("inf"))
        v = kept.topk(gate.top_k + 1, dim=-1).values
        return v[:, gate.top_k - 1] - v[:, gate.top_k]

    def logits(self, ids: list[int], flip=None):
        """float32 logits [len(ids), V] with ``flip`` = (layer, position) forced, or None."""
        self.flip = flip
        with torch.no_grad():
            return self.model(torch.tensor([ids])).logits[0]

    def proving_flip(self, ids: list[int], q: int, token: int):
        """The (layer, position <= q, margin) of a router near tie whose other choice makes ``token``
        the greedy at position ``q`` (within a bf16 near tie), or None: a bf16 engine that routed
        that token the other way served ``token`` legitimately."""
        from specdiff.replay.diff.measure.tolerance import is_near_tie

        self.logits(ids)
        candidates = sorted((float(m[pos]), layer, pos) for layer, m in self.margins.items()
                            for pos in range(q + 1) if m[pos] < ROUTER_CANDIDATE_MARGIN)
        for margin, layer, pos in candidates:
            row = self.logits(ids, flip=(layer, pos))[q]
            if is_near_tie(float(row.max()), float(row[token]), dtype="bfloat16"):
                return layer, pos, margin
        return None


@pytest.mark.parametrize("mode", SPEC_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_family_serves_eagle3_with_accept_lengths(family_servers, family, mode):
    for out in family_servers(family, mode).outputs:
        meta = out["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW == len(out["output_ids"])
        assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] >= 1.0
        # accept length counts the bonus token: every verify commits accept_length tokens on average
        assert meta["spec_accept_length"] * meta["spec_verify_ct"] == pytest.approx(MAX_NEW, abs=1e-6)


@pytest.mark.parametrize(("family", "mode"), [(f, m) for f in FLOAT32_CHECKED for m in MODES
                                              if MODES[m] is not None or f in PLAIN_FAMILIES])
def test_served_greedy_tokens_are_the_targets_own_greedy_tokens(family_servers, family, mode):
    """An independent implementation of each family (transformers, float32) checks the served
    kernels: a wrong MLA latent, yarn scale, routing rule, window or sink changes the argmax at
    most positions; bfloat16 serving may only pick another token inside a near tie, or, on an MoE
    target, the greedy of the other choice of a router near tie, proven by re-running the reference
    with that one decision flipped (measured: DeepSeek-V3 plain, a layer-4 group margin of 0.0002 at
    the position itself; flipped, the served token leads by 0.15)."""
    from transformers import AutoModelForCausalLM

    from specdiff.replay.diff.measure.tolerance import is_near_tie

    runs = family_servers(family, mode)
    ref = _ForcedRouting(AutoModelForCausalLM.from_pretrained(runs.target, dtype=torch.float32).eval())
    exact = total = 0
    flips = []
    for prompt, out in zip(runs.prompt_ids, runs.outputs, strict=True):
        served_ids = out["output_ids"][:FLOAT32_TOKENS]
        ids = prompt + served_ids
        logits = ref.logits(ids)[len(prompt) - 1:-1]
        for pos, tok in enumerate(served_ids):
            top1 = float(logits[pos].max())
            served = float(logits[pos, tok])
            if not is_near_tie(top1, served, dtype="bfloat16"):
                proof = ref.proving_flip(ids, len(prompt) - 1 + pos, tok) if family in MOE_FAMILIES else None
                assert proof is not None, (
                    f"{family} {mode}: position {pos} served token {tok} (logit {served:.4f}), the target's greedy "
                    f"is {int(logits[pos].argmax())} (logit {top1:.4f}), and no router near tie's other choice "
                    "makes it the greedy")
                flips.append((pos, tok, proof))
            exact += served == top1
            total += 1
    # near ties are rare: most tokens are the float32 argmax itself
    print(f"{family} {mode}: {exact}/{total} served tokens are the float32 argmax; routing flips: {flips}")
    assert exact >= 0.75 * total, f"{family} {mode}: only {exact}/{total} served tokens are the argmax"
    assert len(flips) <= 0.1 * total, f"{family} {mode}: {len(flips)} of {total} tokens need a routing flip: {flips}"


@pytest.mark.parametrize("mode", SPEC_MODES)
@pytest.mark.parametrize("family", PLAIN_FAMILIES)
def test_speculative_greedy_equals_plain_greedy_up_to_the_first_near_tie(family_servers, family, mode):
    from specdiff.replay.diff.measure.tolerance import first_near_tie

    plain_run, spec_run = family_servers(family, "plain"), family_servers(family, mode)
    compared = 0
    for prompt, plain, spec in zip(plain_run.prompt_ids, plain_run.outputs, spec_run.outputs, strict=True):
        # SGLang's own top-2 margin, placed at the top logit's magnitude (tests/server/test_cpu_server.py)
        margins = [t[0][0] - t[1][0] for t in plain["meta_info"]["output_top_logprobs"]]
        top1 = _teacher_forced_logits(plain_run.target, prompt, plain["output_ids"]).max(dim=-1).values.tolist()
        tie = first_near_tie([(a, a - m) for a, m in zip(top1, margins, strict=True)], dtype="bfloat16")
        n = MAX_NEW if tie is None else tie
        assert spec["output_ids"][:n] == plain["output_ids"][:n], f"{family} {mode} before the near tie at {tie}"
        compared += n
    print(f"{family} {mode}: {compared}/{MAX_NEW * len(spec_run.prompt_ids)} tokens compared before the first near tie")
    assert compared > 0, f"{family}: a near tie at the first token of every prompt leaves nothing compared"


