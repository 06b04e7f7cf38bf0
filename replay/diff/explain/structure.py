"""Findings no transform can close: a layout difference (replay/diff/align/structure.py), named from
the widths and the contract, and sequences tokenized in different formats, decoded side by side."""

from __future__ import annotations

from specdiff.replay.diff.align.structure import contract_value
from specdiff.replay.diff.align.token_format import decoder, describe, load_tokenizer, special_ids
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.types import Alignment, Explanation, Pair, TensorComparison, side_names
from specdiff.tracer.schema import aux_slot


def _fields_lines(fields: dict, labels: Pair) -> tuple[str, ...]:
    return tuple(f"contract {f}: {labels.x} {vx if vx is not None else 'not recorded'}, "
                 f"{labels.y} {vy if vy is not None else 'not recorded'}" for f, (vx, vy) in fields.items())


def _aux_widths(traces: Pair) -> Pair:
    """Per side: (aux concat width, hidden size) where recorded, else None."""
    def one(t):
        h = t.contract.get("hidden_size")
        w = t.info("target.aux_cat").shape[0] if "target.aux_cat" in t.names and t.info("target.aux_cat").shape else None
        if w is None:
            slots = [n for n in t.names if aux_slot(n) is not None]
            w = sum(t.info(n).shape[0] for n in slots) if slots else None
        return w, h
    return traces.map(one)


def explain_structure(traces: Pair, first: TensorComparison) -> list[Explanation]:
    """Name the likely causes of a layout difference (a ``structure`` finding) and the contract
    fields that show it. Nothing is transformed: shapes cannot be closed, only read."""
    m = first.structure
    labels = side_names(traces)
    ev = (m.message, *_fields_lines(m.fields, labels))
    fc = traces.map(lambda t: "draft.fc_out" in t.names or "draft.fc_in" in t.names)
    if fc.x != fc.y:
        ev += (f"{labels.y if fc.x else labels.x} recorded no draft.fc_in / draft.fc_out rows: its draft never "
               "ran fc",)
    algo = traces.map(lambda t: contract_value(t.contract, "speculative_algorithm"))
    algo_words = "; ".join(f"{lab} ran {a}" for lab, a in ((labels.x, algo.x), (labels.y, algo.y)) if a)
    if m.kind in ("slot_count", "width") and (m.name.startswith("target.aux") or m.name == "draft.fc_in"):
        (wx, hx), (wy, hy) = _aux_widths(traces).x, _aux_widths(traces).y
        h = hx or hy
        if h and wx and wy and wx != wy and h in (wx, wy):
            one, many = (labels.x, labels.y) if wx == h else (labels.y, labels.x)
            k = max(wx, wy) // h
            msg = (f"{one} fed the draft ONE hidden state {h} wide where {many} fed {k} aux hidden states "
                   f"{max(wx, wy)} wide ({k} x {h}): the EAGLE-3 draft was likely run with "
                   f"--speculative-algorithm EAGLE (SGLang's EAGLE passes the target's final hidden state, "
                   f"and the EAGLE-3 draft skips its fc because the width already equals its hidden size)"
                   + (f" [{algo_words}]" if algo_words else "")
                   + "; or aux capture was switched off on that side")
            return [Explanation("speculative_algorithm", msg, ev,
                                fix_of("speculative_algorithm"))]
        kx = wx // hx if wx and hx else None
        ky = wy // hy if wy and hy else None
        if kx and ky and kx != ky:
            hfx, hfy = (traces.x.contract.get("aux_hf_indices"), traces.y.contract.get("aux_hf_indices"))
            msg = (f"a different number of aux layers captured: {labels.x} {kx} (HF {hfx or '?'}), "
                   f"{labels.y} {ky} (HF {hfy or '?'})" + (f" [{algo_words}]" if algo_words else ""))
            return [Explanation("aux_layer_count", msg, ev,
                                fix_of("aux_layer_count"))]
    if m.kind == "vocab":
        sizes = Pair(*(v[0] if isinstance(v, tuple) else v for v in (m.x, m.y)))
        v = traces.x.contract.get("vocab_size") or traces.y.contract.get("vocab_size")
        full = [lab for lab, n in ((labels.x, sizes.x), (labels.y, sizes.y)) if v and n == v]
        if full:
            msg = (f"{full[0]}'s draft scores the whole target vocab ({v}) where the other side's has "
                   f"{sizes.y if full[0] == labels.x else sizes.x} ids: draft vs target vocab — the draft config "
                   "lacks draft_vocab_size (and d2t), so the engine built a target-vocab lm_head")
        else:
            msg = (f"the draft vocab sizes differ ({m.message}): another draft checkpoint, or one side maps "
                   "through the target vocab (no draft_vocab_size / d2t in the served config)")
        return [Explanation("draft_vocab_size", msg, ev,
                            fix_of("draft_vocab_size"))]
    if m.kind == "topk_width":
        if m.dim == "logits_topk":
            return [Explanation("logits_topk", f"another logits top-k was captured ({m.message})", ev,
                                fix_of("logits_topk"))]
        return [Explanation("spec_topk", f"another draft top-k ({m.message}): --speculative-eagle-topk differs", ev,
                            fix_of("spec_topk"))]
    if m.kind == "dtype_family":
        return [Explanation("dtype_family", f"{m.message}: the sides stored this tensor as different kinds of "
                            "values (a trace from another recorder or format version?)", ev,
                            fix_of("dtype_family"))]
    why = {"draft_hidden": "the drafts have different hidden sizes (different checkpoints)",
           "attn_in": "the drafts' attention inputs differ in width (different draft hidden sizes)",
           "draft_tokens": "the verify trees differ in size (--speculative-num-draft-tokens)",
           "accept_slots": "the draft step counts differ (--speculative-num-steps)",
           "hidden": "the targets have different hidden sizes (different target models)",
           "aux_hidden": "the aux concat widths differ (another number of aux layers, or another target)"}
    return [Explanation("structure", f"{m.message}: {why.get(m.dim, 'the layouts differ')}"
                        + (f" [{algo_words}]" if algo_words else ""), ev,
                        fix_of("structure"))]


def explain_token_format(traces: Pair, alignment: Alignment) -> list[Explanation]:
    """The sides tokenized the same text in different formats: say how, decoded side by side."""
    labels = side_names(traces)
    decode = decoder(load_tokenizer(traces))
    specials = special_ids(traces)
    pairs = alignment.token_formats
    words, lines = describe(pairs[0], labels, decode=decode, specials=specials)
    msg = (f"the token formats differ: {len(pairs)} of {len(alignment.seq_pairs)} sequence pairs share "
           f"only a run of tokens, not a prefix" + (f" — {'; '.join(words)}" if words else ""))
    first = pairs[0]
    ev = (f"seq {first.index}: first differing token at position {first.format.first_diff}", *lines)
    return [Explanation("token_format", msg, ev,
                        fix_of("token_format"))]
