"""The target's top-k logits at each recorded position (``target.logits_topk.values`` / ``.ids``),
shared by the SGLang and vLLM recorders.

Why they are recorded: a random or barely trained target has nearly flat logits, so its greedy
token is often a near tie that the engine's kernels and the training forward round into different
ids (measured on ``make test-seeds`` seed 2's tiny DeepSeek-V3 and GPT-OSS pairs: 14-19 of ~180
``target.argmax`` rows flipped where every aux row agreed, half of that target's positions within
0.055 of their runner-up logit). With both sides' top-k logits the diff tells such a flip (the two
tokens' logits within the row's measured logit disagreement) from a target that computes something
else (replay/diff/judge/topk_ties.py).

The reduction follows the draft's (tracer/engines/sglang/attribution.py ``reduce_logits`` says
why): on a CPU server the logits are staged as served and reduced by the writer, off the serving
thread; on an accelerator they are reduced on the device and only the small results copied.
"""

from __future__ import annotations

import torch

from specdiff.tracer.engines.names import MISSING

#: the capture's keys: raw logits (CPU) and k (the writer process has no recorder options to read
#: it from), or the device-reduced values and ids
RAW, K, VALUES, IDS = "target_logits", "target_logits_k", "target_top_values", "target_top_ids"


def stage(rec, t: dict, logits, k: int) -> None:
    """Stage the target's ``logits`` [rows, vocab] (the forward's next-token logits, any float
    dtype) into the capture's tensor dict ``t`` via ``rec.snap``, once per capture; nothing when
    ``k`` is 0, the logits are missing or not [rows > 0, vocab]."""
    if k <= 0 or logits is None or logits is MISSING or RAW in t or IDS in t:
        return
    if not hasattr(logits, "dim") or logits.dim() != 2 or not logits.shape[0]:
        return
    lf = logits.detach()
    if lf.is_cpu:
        t[RAW], t[K] = rec.snap(lf), rec.snap(torch.tensor([k], dtype=torch.int64))
    else:
        got = torch.topk(lf.float(), min(k, lf.shape[-1]), dim=-1)
        t[VALUES], t[IDS] = rec.snap(got.values), rec.snap(got.indices, dtype=torch.int64)


def top(t: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values float32 [rows, k], ids int64 [rows, k]) of what ``stage`` put in ``t``, best first;
    None when nothing was staged. Runs in the writer."""
    raw = t.get(RAW)
    if raw is not None and t.get(K) is not None:
        got = torch.topk(raw.float(), min(int(t[K].reshape(-1)[0]), raw.shape[-1]), dim=-1)
        return got.values, got.indices.to(torch.int64)
    if t.get(IDS) is not None and t.get(VALUES) is not None:
        return t[VALUES].float(), t[IDS].to(torch.int64)
    return None


def add_rows(out, top_rows, rows, *, seq: int, pos, it: int) -> None:
    """Append the ``rows`` (index or slice into ``top_rows``, the result of ``top``) as
    ``target.logits_topk.values`` / ``.ids`` at ``pos`` (int or int array, one per row)."""
    if top_rows is None:
        return
    values, ids = top_rows[0][rows], top_rows[1][rows]
    if values.dim() == 1:
        values, ids = values[None], ids[None]
    out.add("target.logits_topk.values", values, seq=seq, pos=pos, depth=0, iter=it)
    out.add("target.logits_topk.ids", ids, seq=seq, pos=pos, depth=0, iter=it)


__all__ = ["stage", "top", "add_rows"]
