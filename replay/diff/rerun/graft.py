"""Graft: which serving-side input, swapped for training's, recovers the acceptance gap.

The training-side reference forward (the draft *as trained*: ``Eagle3Draft.ttt_forward`` on the
checkpoint named by the training trace's contract ``draft_name``) is re-run on the SERVING side's
inputs for the aligned sequences:

- **baseline**: serving's ``target.aux_cat`` rows, serving's vocab map (its ``draft.d2t`` rows if
  it recorded them, else the checkpoint's) and serving's norm flags (where its contract records
  them, else the checkpoint's);
- **one substitution at a time** from the training side: ``target.aux_cat`` (training's aux
  rows), ``draft.d2t`` (training's vocab map), and, when the two contracts differ in norm flags,
  the training config's norm flags;
- **training**: every training input, i.e. the training estimate on the same positions.

Acceptance is the greedy chain acceptance ``record_train`` computes (``specdiff.eagle3.acceptance``,
the draft's top-1 taken as ``tracer.rows.draft_top_ids`` takes it): at depth k the mapped draft top-1
(``i + d2t[i]``) must equal the training trace's ``target.argmax`` label at position t+1+k,
cumulatively over depths; estimated accept length = 1 + sum of the per-depth cumulative rates. Positions: the leading run of positions where both sides hold aux rows, counted only at
generated positions (t >= prompt_len - 1) like ``replay.acceptance``.

Each substitution reports how much of the gap (training estimate - baseline) it recovers;
results come ranked by accept length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.eagle3.acceptance import AcceptTally, chain_accept
from specdiff.eagle3.norms import NORM_FLAGS as _NORMS
from specdiff.replay.diff.runner import RerunError, batch_inputs, prepare, sides, with_norm_flags
from specdiff.replay.diff.types import DiffInputs
from specdiff.tracer.contract import known

__all__ = ["GraftError", "GraftResult", "graft", "NORM_FLAGS"]

NORM_FLAGS = tuple(_NORMS)  # specdiff.eagle3.norms: the one list of norm flags
BATCH = 8
MIN_GAP = 0.005  # tokens per verify step: below this there is no gap to recover


class GraftError(RerunError):
    """The graft cannot run (no draft checkpoint, nothing to replay): one clear line."""


@dataclass(frozen=True)
class GraftResult:
    """One substitution into the serving-side replay.

    Attributes:
        name: what was substituted: ``target.aux_cat``, ``draft.d2t`` or ``norm flags``.
        substituted: the same in words (e.g. "training's target.aux_cat rows instead of serving's").
        mean_accept_length: estimated accept length with the substitution (1 + sum per_depth).
        per_depth: cumulative acceptance per depth with the substitution.
        recovered: fraction of the gap (training - baseline) recovered; None when there is no gap.
        baseline_accept_length: the serving-input replay without substitution.
        training_accept_length: the replay on every training input (same positions).
        samples: positions counted at depth 0.
    """

    name: str
    substituted: str
    mean_accept_length: float
    per_depth: tuple[float, ...]
    recovered: float | None
    baseline_accept_length: float
    training_accept_length: float
    samples: int

    def message(self) -> str:
        rec = ("no gap to recover" if self.recovered is None
               else f"recovers {self.recovered:.0%} of the gap")
        return (f"substituting training's {self.name} {rec}: accept length "
                f"{self.baseline_accept_length:.2f} -> {self.mean_accept_length:.2f}")


# ---- inputs ----------------------------------------------------------------------------------
# ---- the replay ------------------------------------------------------------------------------
def graft(inputs: DiffInputs, *, draft_path: str | None = None, target_path: str | None = None,
          steps: int | None = None) -> list:
    """Re-run the training-side reference forward on serving's inputs, one training input
    substituted at a time; ``GraftResult`` per substitution, ranked by accept length (best first).

    Args:
        inputs: the diff's (``DiffReport.inputs``; training and serving sides told apart by its labels;
            A = training when both traces are of the same side).
        draft_path: the draft checkpoint as trained (default: the training contract's draft_name).
        target_path: the target, needed only when the draft shares its embedding / lm_head
            (default: the training contract's model_name).
        steps: TTT depths (default: the training contract's spec_steps, else 3).

    Raises:
        GraftError: no draft checkpoint / target, or no positions with aux rows on both sides.
        CheckpointError: the checkpoint cannot be loaded.
    """
    import torch

    from specdiff.eagle3.vocab_map import hot_token_ids
    from specdiff.replay.model.draft_model import ttt_labels
    from specdiff.tracer.rows import draft_top_ids

    tr, _ = sides(inputs)
    if "target.argmax" not in getattr(inputs.traces, tr).names:
        raise GraftError(f"{getattr(inputs.traces, tr).path}: no target.argmax rows (the acceptance labels)")
    run = prepare(inputs, draft_path=draft_path, target_path=target_path, error=GraftError)
    ttrace, model, plan, d2t, flags = run.ttrace, run.model, run.plan, run.d2t, run.flags
    steps = int(steps or known(ttrace.contract, "spec_steps") or 3)

    variants = {"baseline": ("serve", "serve", "serve"), "target.aux_cat": ("train", "serve", "serve"),
                "draft.d2t": ("serve", "train", "serve")}
    if flags["train"] != flags["serve"]:
        variants["norm flags"] = ("serve", "serve", "train")
    variants["training"] = ("train", "train", "train")
    tallies = {k: AcceptTally(steps) for k in variants}

    am_keys = ttrace.keys("target.argmax")
    am_vals = ttrace.read("target.argmax").reshape(-1)
    dev = next(model.parameters()).device
    for b0 in range(0, len(plan), BATCH):
        seqs = plan[b0:b0 + BATCH]
        batch = batch_inputs(inputs, run, seqs)  # training's tokens: the acceptance labels are training's
        ids, aux, lengths = batch.ids["train"], batch.aux, batch.lengths
        B, T = ids.shape
        argmax = torch.full((B, T), -100, dtype=torch.int64)
        gen = torch.zeros(B, T, dtype=torch.bool)
        for r, s in enumerate(seqs):
            pos = am_keys["pos"].astype(np.int64) - s.start
            sel = (am_keys["seq"] == s.seq_train) & (am_keys["depth"] == 0) & (pos >= 0) & (pos < s.n)
            argmax[r, torch.as_tensor(pos[sel])] = torch.as_tensor(am_vals[sel])
            gen[r, max(s.prompt_len - 1, 0): s.n] = True
        labels = ttt_labels(argmax, steps, lengths)
        cache = {}
        for name, (a, d, f) in variants.items():
            key = (a, f)
            if key not in cache:
                with with_norm_flags(model, flags[f]), torch.no_grad():
                    out = model.ttt_forward(aux[a].to(dev), ids.to(dev), steps, lengths=lengths)
                cache[key] = ([draft_top_ids(lg, 1)[..., 0].cpu() for lg in out.logits],
                              [v.cpu() for v in out.valid])
            top, valid = cache[key]
            hot = hot_token_ids(d2t[d])
            cum = torch.ones(B, T, dtype=torch.bool)
            for k in range(steps):
                ok = valid[k] & (labels[k] != -100)
                _, cum = chain_accept(hot[top[k]], labels[k], cum & ok)
                tallies[name].add(k, cum, ok & gen)

    base = tallies["baseline"].mean_accept_length()
    full = tallies["training"].mean_accept_length()
    gap = full - base
    words = {"target.aux_cat": "training's target.aux_cat rows instead of serving's",
             "draft.d2t": "training's vocab map (draft.d2t) instead of serving's",
             "norm flags": "training's norm flags " + ", ".join(
                 f"{f}={flags['train'][f]}" for f in NORM_FLAGS if flags["train"][f] != flags["serve"][f])
             + " instead of serving's"}
    out = []
    for name in variants:
        if name in ("baseline", "training"):
            continue
        t = tallies[name]
        length = t.mean_accept_length()
        rec = (length - base) / gap if abs(gap) >= MIN_GAP else None
        out.append(GraftResult(name, words[name], length, t.per_depth(), rec, base, full,
                               int(t.count[0])))
    out.sort(key=lambda g: -g.mean_accept_length)
    return out
