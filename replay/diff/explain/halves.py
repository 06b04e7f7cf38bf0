"""Halves of a stage: the embedding vs the hidden half of the draft's attention input, and the lm_head
when the draft's hidden states agree but its logits do not."""

from __future__ import annotations

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.contract.check import same_weights
from specdiff.replay.diff.explain.sample import at_depth, sample_rows
from specdiff.replay.diff.measure import metrics
from specdiff.replay.diff.types import Explanation, Pair, TensorComparison, side_names


def explain_halves(traces: Pair, comps: dict[str, TensorComparison], first: TensorComparison) -> list[Explanation]:
    """attn_in: embedding half vs hidden half; logits with hidden_out inside its tolerance: the lm_head,
    unless both contracts prove it the same (``same_weights``)."""
    labels = side_names(traces)
    cx, cy = traces.x.contract, traces.y.contract
    if first.name == "draft.attn_in" and len(first.match.pair):
        # Deeper rows inherit the mismatch through the carried hidden: judge the halves where it begins.
        m = at_depth(first.match, first.divergence_depth)
        rx, ry = sample_rows(m)
        x, y = traces.x.take_float(first.name, rx), traces.y.take_float(first.name, ry)
        h = x.shape[1] // 2
        emb = float(metrics.relative_error(x[:, :h], y[:, :h]).mean())
        hid = float(metrics.relative_error(x[:, h:], y[:, h:]).mean())
        if hid <= first.tolerance.rel < emb:
            src = f" ({labels.x}: {cx.get('embed_source', '?')}, {labels.y}: {cy.get('embed_source', '?')})"
            return [Explanation("embed_source", "the embedding half of the draft's attention input differs, the "
                                "hidden half agrees: the token embedding (or the input_layernorm over it) differs"
                                + src,
                                (f"embedding half rel err {emb:.2e}; hidden half rel err {hid:.2e}",),
                                fix_of("embed_source"))]
        if emb <= first.tolerance.rel < hid:
            return [Explanation("hidden_half", "the hidden half of the draft's attention input differs, the "
                                "embedding half agrees: hidden_norm, or the hidden the midlayer is fed "
                                "(draft.hidden_in), differs",
                                (f"embedding half rel err {emb:.2e}; hidden half rel err {hid:.2e}",),
                                fix_of("hidden_half"))]
    if (first.name.startswith("draft.logits") and "draft.hidden_out" in comps and not comps["draft.hidden_out"].diverged
            # hidden_out inside its tolerance is not proof that it agrees: an lm_head both sides recorded
            # the same leaves the hidden states (a shift below the tolerance) as the difference, for the
            # recorded facts that act before the logits to name (explain/differences.py)
            and not same_weights(cx, cy, "lm_head_sha256")):
        src = f" ({labels.x}: {cx.get('lm_head_source', '?')}, {labels.y}: {cy.get('lm_head_source', '?')})"
        return [Explanation("lm_head_source", "draft hidden states agree but logits do not: the lm_head differs" + src,
                            (f"draft.hidden_out max rel err {comps['draft.hidden_out'].stats.get('max_rel', 0):.2e}",),
                            fix_of("lm_head_source"))]
    return []
