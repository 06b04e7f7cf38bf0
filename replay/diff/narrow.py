"""Narrow a divergence no explanation fits: which serving input, grafted into the training draft,
reproduces what serving's draft computed?

The draft as trained (the training contract's ``draft_name``, as in replay.graft) is re-run,
teacher-forced at depth 0, on the first diverging aligned sequences, once on every training
input and once per serving input substituted: ``target.aux_cat`` (the target's hidden states),
``tokens`` (the draft's input tokens), ``draft.d2t`` (the vocab map) and the norm flags (when the
contracts differ). Each run's draft stages (fc_in ... topk_target, depth 0) are compared with the
rows serving recorded. A substitution that makes the training draft compute what serving
computed is where the difference enters; when even every serving input together does not
reproduce serving, the difference is inside the draft's own computation (weights, rope,
attention), and the differing contract fields are the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdiff.replay.diff import metrics
from specdiff.replay.diff.align import match_rows
from specdiff.replay.diff.rerun import RerunError, prepare, sides, with_norm_flags
from specdiff.tracer.errors import SpecdiffError

#: draft stages a depth-0 re-run computes, in dataflow order (ids compared on the top-1 id)
STAGES = ("draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.attn_in", "draft.hidden_out",
          "draft.logits_topk.ids", "draft.topk", "draft.topk_target")
MAX_SEQS = 4
ID_AGREE = 0.95  # ids: near-tie flips in bf16 allowed in a few rows


class NarrowError(RerunError):
    """The narrowing cannot run (no draft checkpoint, no aux rows): one clear line."""


@dataclass(frozen=True)
class Variant:
    """One re-run of the training draft.

    Attributes:
        name: ``training inputs``, ``serving's target.aux_cat`` ..., ``every serving input``.
        scores: stage -> mean relative error (float stages) or top-1 disagreement (id stages)
            against the rows SERVING recorded.
        matches: stage -> within tolerance of serving's rows.
        reproduces: every compared stage from the first diverging one on matches serving.
    """

    name: str
    scores: dict
    matches: dict
    reproduces: bool


@dataclass
class Narrowing:
    """The narrowing of one divergence (``DiffReport.narrowing``).

    Attributes:
        stages: the stages compared (recorded by serving, computed by the re-run).
        from_stage: the first diverging draft stage (reproduction is judged from it on).
        positions: depth-0 positions re-run.
        variants: training inputs first, then one per substitution, then every serving input.
        conclusion: one line: the substitution that reproduces serving, or why none does.
        contract_fields: differing contract fields, the candidates when no input reproduces serving.
    """

    stages: tuple[str, ...]
    from_stage: str
    positions: int
    variants: list[Variant] = field(default_factory=list)
    conclusion: str = ""
    contract_fields: list[str] = field(default_factory=list)


def _outputs(out, d2t) -> dict:
    """Depth-0 tensors [B,T,...] of one ttt_forward, by stage name."""

    from specdiff.eagle3.vocab_map import hot_token_ids
    from specdiff.tracer.rows import draft_top_ids

    top1 = draft_top_ids(out.logits[0].float(), 1)  # the recorders' tie rule
    hot = hot_token_ids(d2t)
    return {"draft.fc_in": out.fc_in, "draft.fc_out": out.fc_out, "draft.hidden_in": out.hidden_in[0],
            "draft.attn_in": out.attn_in[0], "draft.hidden_out": out.hidden_out[0],
            "draft.logits_topk.ids": top1, "draft.topk": top1, "draft.topk_target": hot[top1]}


def narrow(report, *, draft_path: str | None = None, target_path: str | None = None) -> Narrowing:
    """Re-run the training draft on the first diverging sequences with each serving input grafted in.

    Raises:
        NarrowError: no draft checkpoint, no aux rows on both sides, nothing to compare.
        CheckpointError: the checkpoint cannot be loaded.
    """
    tr, sv = sides(report)
    strace = getattr(report.traces, sv)
    stages = tuple(s for s in STAGES if s in strace.names)
    if not stages:
        raise NarrowError(f"{strace.path}: serving recorded no draft stage to compare a re-run with")
    import torch

    from specdiff.tracer.arrays import to_torch

    run = prepare(report, draft_path=draft_path, target_path=target_path, error=NarrowError)
    traces, model, cfg, dtype, d2t, flags = report.traces, run.model, run.cfg, run.dtype, run.d2t, run.flags
    first_pair = (report.first.first_where or {}).get("pair", 0)
    plan = sorted(run.plan, key=lambda s: (s.seq_train != _seq_of(report, first_pair, tr)))[:MAX_SEQS]

    B, T = len(plan), max(s.n for s in plan)
    side = {"train": tr, "serve": sv}
    ids = {k: torch.zeros(B, T, dtype=torch.int64) for k in side}
    aux = {k: torch.zeros(B, T, cfg.aux_width, dtype=dtype) for k in side}
    lengths = torch.tensor([s.n for s in plan], dtype=torch.int64)
    pair_of = {getattr(p.seq, tr): p for p in report.alignment.seq_pairs}
    for r, s in enumerate(plan):
        p = pair_of[s.seq_train]
        for k, attr in side.items():
            t = getattr(traces, attr)
            aux[k][r, : s.n] = to_torch(t.take("target.aux_cat", s.rows[attr]), t.info("target.aux_cat").dtype).to(dtype)
            start = getattr(p.start, attr)
            seq = t.sequence(getattr(p.seq, attr)).tokens[start: start + s.n]
            ids[k][r, : len(seq)] = torch.as_tensor(np.asarray(seq, np.int64))
    tokens_differ = not torch.equal(ids["train"], ids["serve"])

    variants = {"training inputs": ("train", "train", "train", "train"),
                "serving's target.aux_cat": ("serve", "train", "train", "train"),
                "serving's tokens": ("train", "serve", "train", "train"),
                "serving's draft.d2t": ("train", "train", "serve", "train")}
    if not tokens_differ:
        variants.pop("serving's tokens")
    if flags["train"] != flags["serve"]:
        variants["serving's norm flags"] = ("train", "train", "train", "serve")
    variants["every serving input"] = ("serve", "serve", "serve", "serve")

    # Serving's (and training's) recorded depth-0 rows of each stage, at (plan row, position).
    recorded = {}
    for name in stages:
        m = match_rows(traces, report.alignment, name)
        keep = m.depth == 0
        rows_b, rows_t, picks = [], [], []
        for r, s in enumerate(plan):
            sel = keep & (m.pair == pair_of[s.seq_train].index) & (m.pos < s.n)
            rows_b += [r] * int(sel.sum())
            rows_t += m.pos[sel].tolist()
            picks.append(np.nonzero(sel)[0])
        idx = np.concatenate(picks) if picks else np.zeros(0, np.int64)
        if not len(idx):
            continue
        ys = strace.take_float(name, m.rows.y[idx] if sv == "y" else m.rows.x[idx])
        recorded[name] = (np.asarray(rows_b), np.asarray(rows_t), ys)
    stages = tuple(s for s in stages if s in recorded)
    if not stages:
        raise NarrowError("serving's draft stages have no depth-0 rows on the re-run positions")
    diverged = [s for s in stages if s in report.comparisons and report.comparisons[s].diverged]
    from_stage = diverged[0] if diverged else stages[0]
    judged = stages[stages.index(from_stage):]

    res = Narrowing(stages, from_stage, int(lengths.sum()))
    dev = next(model.parameters()).device
    for name, (a, tk, d, f) in variants.items():
        with with_norm_flags(model, flags[f]), torch.no_grad():
            out = model.ttt_forward(aux[a].to(dev), ids[tk].to(dev), 1, lengths=lengths)
        got = _outputs(out, d2t[d])
        scores, matches = {}, {}
        for st in stages:
            rb, rt, ys = recorded[st]
            xs = got[st][torch.as_tensor(rb), torch.as_tensor(rt)].detach().float().cpu().numpy()
            if st in ("draft.logits_topk.ids", "draft.topk", "draft.topk_target"):
                disagree = float((xs.reshape(len(xs), -1)[:, 0] != ys.reshape(len(ys), -1)[:, 0]).mean())
                scores[st], matches[st] = disagree, disagree <= 1 - ID_AGREE
            else:
                rel = float(metrics.relative_error(xs, ys).mean())
                tol = report.comparisons[st].tolerance.rel if st in report.comparisons else 0.05
                scores[st], matches[st] = rel, rel <= tol
        res.variants.append(Variant(name, scores, matches, all(matches[s] for s in judged)))
    res.contract_fields = [f"{m.field} ({m.x} vs {m.y})" for m in report.contract]
    hits = [v for v in res.variants[1:-1] if v.reproduces]
    base, every = res.variants[0], res.variants[-1]
    if base.reproduces:
        res.conclusion = ("the training draft on training's own inputs already computes what serving recorded: "
                          "the divergence is not in the draft's computation on these rows")
    elif hits:
        res.conclusion = (f"substituting {' / '.join(v.name for v in hits)} reproduces serving from {from_stage} on: "
                          "the difference enters with that input")
    elif every.reproduces:
        res.conclusion = ("no single serving input reproduces serving, every serving input together does: "
                          "the difference is a combination of inputs")
    else:
        cands = ", ".join(res.contract_fields) or "none recorded (compare the draft weights and rope settings)"
        res.conclusion = ("no serving input reproduces serving, not even all together: the difference is inside "
                          f"the draft's own computation (weights, rope, attention); differing contract fields: {cands}")
    return res


def _seq_of(report, pair_index: int, attr: str) -> int:
    for p in report.alignment.seq_pairs:
        if p.index == pair_index:
            return getattr(p.seq, attr)
    return -1


def narrow_or_reason(report, **kw) -> Narrowing | str:
    """``narrow(report)``, or the one-line reason it could not run (never raises SpecdiffError)."""
    try:
        return narrow(report, **kw)
    except SpecdiffError as exc:
        return str(exc)


__all__ = ["Narrowing", "Variant", "NarrowError", "narrow", "narrow_or_reason"]
