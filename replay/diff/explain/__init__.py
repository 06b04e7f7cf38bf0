"""Explain a divergence (pipeline stage 8): try the known EAGLE-3 mistakes at the first divergence and
keep those that close the gap.

Each transform check changes one side's recorded tensors the way a known mistake would, and reports
the mistake only when the transformed tensors agree with the other side within tolerance: a
transform that does not close the gap is never reported as the cause. ``CHECKS`` lists every check
in the order it runs, with the stages it looks at (pipeline.py runs it after compare); the modules:

- ``structure``: a layout difference (nothing to transform: the likely causes are named from the
  widths and the contract) and token formats (sequences paired only by content), decoded;
- ``aux``: aux slots permuted (concat order), and which HF layer each aux slot holds (layer shift,
  the engine's default layers, the embedding output), with the fix in the engine's own ids;
- ``row_owner``: aux rows that are another token's (shifted by a position) or another request's (swapped);
- ``vocab``: the served ids against d2t read as offsets, as direct ids, missing, arange;
- ``draft_inputs``: what a later draft step was fed against training's teacher token (the map skipped or
  applied twice);
- ``norms``: a norm before fc on one side only; ``halves``: the embedding vs hidden half of the
  attention input, the lm_head vs hidden_out; ``positions``: rope positions shifted, rows shifted by +-1;
- ``history``: the draft's KV history (stale, a cached prefix's missing, a re-ranked tree node's) and
  chunked-prefill boundaries, and a structural group a divergence concentrates in;
- ``row_structure``: where the failing rows sit (spared at position 0, or at depth 0), when nothing above
  named a cause;
- ``nonfinite``: where NaN/inf first appear and why; ``contract``: a contract difference acting
  inside the first stage (replay/diff/contract/ compares the contracts once per diff); ``differences``: when nothing above closes the gap, the recorded facts that differ and
  act at or before the stage (named, not proven: the narrowing still runs); ``shift``: a divergence
  called on a shift above the pair's noise floor, with its numbers;

The crash of a side's engine and the pre-flight findings that bear on a divergence are the contract
stage's (replay/diff/contract/crash.py, findings.py).
``sample`` reads the rows the checks share. Every cause id is a row of replay/diff/causes.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from specdiff.replay.diff.explain.aux import explain_aux, explain_aux_permutation
from specdiff.replay.diff.explain.contract import explain_contract
from specdiff.replay.diff.explain.differences import explain_differences
from specdiff.replay.diff.explain.draft_inputs import explain_draft_inputs
from specdiff.replay.diff.explain.halves import explain_halves
from specdiff.replay.diff.explain.history import explain_group, explain_history
from specdiff.replay.diff.explain.nonfinite import explain_nonfinite
from specdiff.replay.diff.explain.norms import explain_norm_before_fc
from specdiff.replay.diff.explain.positions import explain_position_shift, explain_positions
from specdiff.replay.diff.explain.row_owner import explain_row_owners
from specdiff.replay.diff.explain.row_structure import explain_row_structure
from specdiff.replay.diff.explain.sample import Memo
from specdiff.replay.diff.explain.shift import explain_shift
from specdiff.replay.diff.explain.stored_features import on_stored_features
from specdiff.replay.diff.explain.structure import explain_structure, explain_token_format
from specdiff.replay.diff.explain.vocab import explain_vocab_map
from specdiff.replay.diff.types import Alignment, DiffInputs, Explanation, Pair, TensorComparison, side_names


@dataclass
class Scene:
    """What every check reads: the two sides (each read through a ``sample.Memo``), the alignment,
    every comparison, the first divergence (a ``values`` finding) and the diff's contract mismatches
    (contract/check.py, checked once per diff)."""

    traces: Pair
    alignment: Alignment
    comps: dict[str, TensorComparison]
    first: TensorComparison
    contract: list  # of types.ContractMismatch

    @cached_property
    def nonfinite(self) -> list[Explanation]:
        """The non-finite values as a cause (nonfinite.py), read once for the two checks that split it."""
        return explain_nonfinite(self.traces, self.comps, self.first, side_names(self.traces))


@dataclass(frozen=True)
class Check:
    """One row of ``CHECKS``.

    Attributes:
        stages: whether the check looks at a first divergence at tensor ``name``.
        run: the check: its explanations (empty when its transform does not close the gap).
        fallback: run only when no check before it explained anything.
        lead: its explanations head the list (they are about the first divergence itself).
    """

    stages: Callable[[str], bool]
    run: Callable[[Scene], list[Explanation]]
    fallback: bool = False
    lead: bool = False


def _every(name: str) -> bool:
    return True


def _aux(s: Scene) -> list[Explanation]:
    """A permutation of the slots first: it says more than which layer each slot holds."""
    tol = s.first.tolerance.rel
    return explain_aux_permutation(s.traces, s.alignment, tol) or explain_aux(s.traces, s.alignment, tol)


#: The checks of a ``values`` first divergence, in order (``explain``).
CHECKS: tuple[Check, ...] = (
    Check(lambda n: n.startswith("target.aux"), _aux),
    # rows of other tokens or requests (a capture path's mistake: row_owner.py)
    Check(lambda n: n.startswith("target.aux"), lambda s: explain_row_owners(s.traces, s.alignment, s.first)),
    Check(lambda n: n in ("draft.topk_target", "draft.topk", "verify") or n.startswith("draft.logits"),
          lambda s: explain_vocab_map(s.traces, s.alignment, s.first.name)),
    # what a later draft step was fed, against training's teacher token, through the vocab map
    Check(lambda n: n == "draft.input_ids", lambda s: explain_draft_inputs(s.traces, s.first)),
    Check(lambda n: n in ("draft.fc_in", "draft.fc_out"),
          lambda s: explain_norm_before_fc(s.traces, s.alignment, s.first)),
    Check(lambda n: n == "draft.attn_in" or n.startswith("draft.logits"),
          lambda s: explain_halves(s.traces, s.comps, s.first)),
    Check(lambda n: n == "draft.positions", lambda s: explain_positions(s.traces, s.first)),
    # the draft's KV history after the attention, and a chunk boundary's token at any stage
    Check(_every, lambda s: explain_history(s.traces, s.alignment, s.comps, s.first)),
    Check(_every, lambda s: explain_position_shift(s.traces, s.alignment, s.first), fallback=True),
    # A contract difference acting inside the first stage explains it when no transform closed the gap
    # (a transform is the sharper proof of the same fact).
    Check(_every, lambda s: explain_contract(s.comps, s.first, s.contract), fallback=True),
    # Non-finite values lead when they appear at the first divergence itself (the tensor the cause
    # carries); appearing later, they are evidence after it, listed last.
    Check(_every, lambda s: [e for e in s.nonfinite if e.tensor == s.first.name], lead=True),
    # A divergence called in a structural group (judge/groups.py) names the group when nothing sharper did.
    Check(_every, lambda s: explain_group(s.first), fallback=True),
    # Nothing named closes the gap: the recorded facts that differ and act at or before the stage are named.
    Check(_every, lambda s: explain_differences(s.traces, s.comps, s.first, s.contract), fallback=True),
    # Nor does any recorded fact differ: where the failing rows sit, spared at position 0 or at depth 0
    Check(_every, lambda s: explain_row_structure(s.first), fallback=True),
    # A divergence called on a shift above the pair's noise floor (judge/shift.py): its numbers, after the
    # facts that may cause it.
    Check(_every, lambda s: explain_shift(s.first)),
    Check(_every, lambda s: [e for e in s.nonfinite if e.tensor != s.first.name]),
)


def explain(inputs: DiffInputs, comps: dict[str, TensorComparison],
            first: TensorComparison | None) -> list[Explanation]:
    """Every explanation whose transform closes the gap at the first divergence: a layout or token
    format finding by its own check, a ``values`` one by ``CHECKS`` in order (the ``lead`` ones first).
    ``inputs``: the diff's (types.DiffInputs); ``comps``: name -> TensorComparison."""
    if first is None:
        return []
    traces, alignment = inputs.traces.map(Memo), inputs.alignment
    if first.kind == "structure":
        return explain_structure(traces, first)
    if first.kind == "tokens":
        return explain_token_format(traces, alignment)
    scene = Scene(traces, alignment, comps, first, inputs.contract)
    lead: list[Explanation] = []
    rest: list[Explanation] = []
    for check in CHECKS:
        if not check.stages(first.name) or (check.fallback and (lead or rest)):
            continue
        (lead if check.lead else rest).extend(check.run(scene))
    # a cause in a trainer's stored features is fixed in those files (stored_features.py)
    return on_stored_features(traces, first.name, lead + rest)


__all__ = ["explain", "CHECKS", "Check", "Scene"]
