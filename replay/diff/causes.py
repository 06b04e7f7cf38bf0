"""Every cause the diff can name, one row each: what kind of cause it is, where it acts, its fix and
its meaning. The ids are what ``types.Cause.cause`` says (an ``Explanation``'s ``cause``, a
legitimate difference's ``cause``, a crash cause's ``kind``); tests/replay/diff/test_causes.py holds the code and
the demo scenarios against this table.

Kinds:

- ``bug``: a mistake in how a side was set up or computed; an explanation check (explain/) names it
  only when its transform closes the gap, or when the rows' structure shows it (explain/history.py);
- ``legitimate``: a difference the engines may have by design; a judge (judge/) names the rows it
  explains and they do not count against the tensor;
- ``contract``: a contract fact that differs between the sides (explain/contract.py, contract/fact_diff.py),
  one id per field: ``contract.<field>``, its fix the fact's own (replay/diff/contract/facts.py ``FACTS``);
  ``unlisted_difference`` for a recorded fact no table lists;
- ``crash``: what predicts a side's crash when no contract fact does (contract/crash.py).

A row whose id ends in ``.`` is a family: ``contract.<field>`` for every field of
tracer/contract.py ``CONTRACT_FIELDS``, ``preflight.<finding kind>`` for every pre-flight finding.
Adding a cause: its check, its row here, and its test.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdiff.tracer.contract_fields import CONTRACT_FIELDS

KINDS = ("bug", "legitimate", "contract", "crash")


@dataclass(frozen=True)
class CauseRow:
    """One cause.

    Attributes:
        cause: its id (``Cause.cause``), or a family's prefix ending in ``.``.
        kind: one of ``KINDS``.
        stages: the stages (tracer/schema.py ``STAGE_ORDER``) whose first divergence it can explain;
            ``("*",)``: any.
        meaning: what it means, in one line.
        fix: what to change, when one sentence fits every case (the check's explanation uses it);
            empty where the fix is worded per case (the engine's aux-id key and convention, the
            contract field's own fix, a dtype).
        no_fix: why ``specdiff fix`` writes no mechanical fix for it, in words (replay/fix/plan.py; empty:
            the kind and meaning say why, or a planner fixes it).
        graft_input: the input ``specdiff diff --graft`` substitutes that stands for its fix
            (replay/diff/rerun/graft.py ``GraftResult.name``): its accept length is the fix's estimate
            before a re-run (demo/verify_fix.py); empty: none does.
    """

    cause: str
    kind: str
    stages: tuple[str, ...]
    meaning: str
    fix: str = ""
    no_fix: str = ""
    graft_input: str = ""


_AUX = ("target.aux", "target.aux_cat")
_IDS = ("draft.logits", "draft.topk", "draft.topk_target", "verify")
#: the draft stages after its attention (judge/context.py ``consumes_context``)
_AFTER_ATTN = ("draft.hidden_out", "draft.logits", "draft.topk", "draft.topk_target")
_ANY = ("*",)
#: why ``specdiff fix`` has nothing to write for a mistake in the engine's own draft loop
_ENGINE_CODE = ("the engine's draft loop computes it: no draft config key or server option changes it (update the "
                "engine, or report it with this diff)")
#: where the draft's rope positions come from, for both position kinds
_POSITIONS_FIX = ("the draft attends at position t + k (SGLang draft extend: the token's own position; draft "
                  "step k: seq_len + k - 1); check the position offset the draft is given")

CAUSES: tuple[CauseRow, ...] = (
    CauseRow("aux_layer_shift", "bug", _AUX,
             ("the aux slots hold other HF layers than the other side's: ids written in one engine's "
              "convention and read in another"),
             graft_input="target.aux_cat"),
    CauseRow("aux_ids_default", "bug", _AUX,
             "the engine read no aux ids from the draft config and captured its default layers",
             graft_input="target.aux_cat"),
    CauseRow("aux_capture_differs", "bug", _AUX,
             "two serving engines captured different aux layers; the side that accepts less is blamed"),
    CauseRow("aux_slot_permutation", "bug", _AUX,
             "the same aux layers, concatenated in another order",
             graft_input="target.aux_cat"),
    CauseRow("d2t_direct_ids", "bug", _IDS,
             "d2t holds direct target ids but is read as offsets",
             "save d2t as offsets (target_id - draft_id), as SpecForge and speculators export it",
             graft_input="draft.d2t"),
    CauseRow("d2t_missing", "bug", _IDS,
             "no usable d2t (all zeros): draft id i is served as target id i",
             "ship the draft's d2t buffer in the checkpoint",
             graft_input="draft.d2t"),
    CauseRow("d2t_arange", "bug", _IDS,
             "d2t is arange: draft id i becomes target id 2i",
             "save d2t as offsets",
             graft_input="draft.d2t"),
    CauseRow("d2t_other_map", "bug", ("draft.topk_target", "verify"),
             "both sides read d2t as offsets but hold different vocab maps (another draft's, or one rebuilt "
             "from other data): the same draft ids become other target tokens",
             "serve the d2t saved with this draft's checkpoint, the vocab map its lm_head rows were trained "
             "on; do not rebuild it from another token count",
             graft_input="draft.d2t"),
    CauseRow("draft_input_unmapped", "bug", ("tokens",),
             "a later draft step was fed the previous pick's draft-vocab id, not mapped to the target vocabulary "
             "(the class of vllm-ascend PR 16166): its embedding reads another token",
             "feed each later draft step hot_token_id[previous pick] (= id + d2t[id]), the target id training feeds",
             no_fix=_ENGINE_CODE),
    CauseRow("draft_input_mapped_twice", "bug", ("tokens",),
             "a later draft step was fed the previous pick mapped to the target vocabulary twice",
             "map the previous pick to the target vocabulary once (hot_token_id[draft id])", no_fix=_ENGINE_CODE),
    CauseRow("draft_input_stale", "bug", ("tokens",),
             "a later draft step was fed the id the step before it was fed at that position (an input-ids buffer "
             "not refreshed between draft steps)",
             "write each draft step's input ids from the previous step's selection before the step runs (a "
             "captured graph's static input buffer too)", no_fix=_ENGINE_CODE),
    CauseRow("draft_input_not_selected", "bug", ("tokens",),
             "a later draft step was fed another id than the one its previous step selected (the id the verify "
             "tree holds)",
             "feed each later draft step the previous step's selected id (hot_token_id[pick]); find where the "
             "fed ids part from the selection (select_top_k_tokens' output in SGLang, propose's draft token in "
             "vLLM)", no_fix=_ENGINE_CODE),
    CauseRow("position_dependent", "bug", _ANY,
             "the rows agree at every sequence's position 0 and differ after it: a position-dependent computation "
             "differs (the rope table, attention over earlier positions); read from the rows, no fact proves it",
             "compare the sides' rope tables (target_rope / draft_rope: a rotary cache lost or rebuilt after load, "
             "another rope scaling) and the KV the attention reads over earlier positions"),
    CauseRow("depth_dependent", "bug", _ANY,
             "the rows agree at draft depth 0 and differ from depth 1: what later draft steps are fed, or their KV, "
             "differs; read from the rows, no fact proves it",
             "check what later draft steps are fed (draft.input_ids, draft.positions) and the draft KV they attend to"),
    CauseRow("norm_before_fc", "bug", ("draft.fc_in", "draft.fc_out"),
             "a norm before fc (norm_before_fc / fc_norm) on one side only",
             "make norm_before_fc / fc_norm agree between the draft config and the trainer",
             graft_input="norm flags"),
    CauseRow("embed_source", "bug", ("draft.attn_in",),
             "the embedding half of the draft's attention input differs: another token embedding",
             ("serve the draft with the embedding it was trained with (SGLang always shares the target's "
              "and ignores a checkpoint embed_tokens)"),
             no_fix="the draft needs the embedding it was trained with, which is another model's weights"),
    CauseRow("hidden_half", "bug", ("draft.attn_in",),
             ("the hidden half of the draft's attention input differs: hidden_norm or the hidden fed in"),
             "compare draft.hidden_in and the hidden_norm weight on both sides",
             no_fix="the hidden half of the attention input differs: no config key or buffer says how"),
    CauseRow("lm_head_source", "bug", ("draft.logits",),
             "the draft's hidden states agree but its logits do not: another lm_head",
             "load the draft's trained lm_head (not a random or target one)",
             no_fix="the draft needs its trained lm_head, which the served checkpoint does not hold"),
    CauseRow("position_offset", "bug", ("draft.positions",),
             "the draft's rope positions are the other side's plus a constant",
             _POSITIONS_FIX),
    CauseRow("position_offset_depth", "bug", ("draft.positions",),
             "the draft's rope positions go wrong from a draft depth on, or drift per depth",
             _POSITIONS_FIX),
    CauseRow("aux_rows_swapped", "bug", _AUX,
             "each diverging aux row is another request's row: rows exchanged between requests "
             "(replay/diff/explain/row_owner.py)",
             "regenerate the hidden states one request per capture or with a capture that keeps each request's "
             "rows (SGLang before PR 28496 mixed rows of neighbouring requests at batch > 1, issue 26163)"),
    CauseRow("position_shift", "bug", _ANY,
             "rows at position t on one side equal rows at t +- 1 on the other",
             "check the EAGLE-3 position pairing: row t consumes (h_t, x_{t+1})"),
    CauseRow("stale_draft_kv", "bug", _AFTER_ATTN,
             ("the draft attends to KV of accepted positions not rewritten from the target's hidden states"),
             ("after verify, re-run the draft extend over the accepted tokens with the target's hidden "
              "states and overwrite their draft KV (SGLang 0.5.23 eagle_worker_v2.py:1110 "
              "_draft_extend_for_decode)")),
    CauseRow("cached_prefix_draft_kv", "bug", _AFTER_ATTN,
             "the draft KV of a radix-cached prefix was never written",
             ("write the draft's KV for a cached prefix too (or keep the draft's KV in the radix cache "
              "with the target's): a request whose prefix hits the cache must find the draft KV of those "
              "positions")),
    CauseRow("tree_rerank_kv", "bug", _AFTER_ATTN,
             "a re-ranked draft-tree node attends to another branch's KV",
             ("index each tree node's draft KV by its parent path, not its column (upstream SGLang multi-"
              "step draft attention; serve with --speculative-eagle-topk 1 to avoid it)")),
    CauseRow("chunk_boundary_token", "bug", _ANY,
             "the draft's input token at the last row of a non-final prefill chunk is wrong",
             ("feed the next chunk's first prompt token as the draft's input at the last row of a non-"
              "final chunk (SGLang 0.5.23 eagle_utils.py:81 _eagle_prefill_tail_tokens, PR #26329), or "
              "serve without chunked prefill (--chunked-prefill-size larger than the prompts)")),
    CauseRow("concentrated_rows", "bug", _ANY,
             "the failures concentrate in one structural group of the rows (judge/groups.py)",
             "the failing rows share this structure: look at what the engine does differently there"),
    CauseRow("systematic_shift", "bug", _ANY,
             "most rows sit well above the pair's measured noise floor, though inside the tolerance (judge/shift.py)",
             ("the two sides compute this stage from different weights, options or code: compare what they were "
              "built from (the contract); a correct pair differs here only by rounding")),
    CauseRow("speculative_algorithm", "bug", _AUX + ("draft.fc_in",),
             "one side fed the EAGLE-3 draft one hidden state: run as EAGLE, not EAGLE3",
             ("serve the EAGLE-3 draft with --speculative-algorithm EAGLE3 (SGLang then captures the draft"
              " config's eagle_aux_hidden_state_layer_ids)")),
    CauseRow("aux_layer_count", "bug", _AUX + ("draft.fc_in",),
             "the sides captured a different number of aux layers",
             ("capture exactly the layers the draft's fc was trained on (fc.weight is [H, K*H]): set "
              "eagle_aux_hidden_state_layer_ids to those K ids"),
             graft_input="target.aux_cat"),
    CauseRow("draft_vocab_size", "bug", ("draft.logits", "draft.topk"),
             "the draft vocab sizes differ: another draft, or a target-vocab lm_head",
             "serve and replay the same draft checkpoint; keep draft_vocab_size and d2t in its config"),
    CauseRow("logits_topk", "bug", ("draft.logits",),
             "another logits top-k was captured",
             "record both sides with the same --logits-topk (record serve) and capture level",
             no_fix="it is a recording option, not the draft"),
    CauseRow("spec_topk", "bug", ("draft.topk",),
             "another speculative top-k (--speculative-eagle-topk)",
             ("record the training side with the serving trace's topk (record train --replay reads "
              "spec_topk from it, or pass --topk)"),
             no_fix="it is a recording option (record train --topk), not the draft"),
    CauseRow("dtype_family", "bug", _ANY,
             "the sides stored a tensor as different kinds of values",
             "record both sides with the same specdiff version"),
    CauseRow("structure", "bug", _ANY,
             "the layouts differ (hidden sizes, tree size, step counts)",
             "make both sides run the same target, draft and speculative settings"),
    CauseRow("token_format", "bug", ("tokens",),
             "the sides tokenized the same text in different formats",
             ("record the training side in the serving token format (the same BOS and chat template: train"
              " on what serving sends), or serve with the training format; `specdiff record train --replay"
              " SERVE_TRACE` replays exactly what serving saw"),
             no_fix="it is how the prompts were tokenized, not the draft"),
    CauseRow("nonfinite", "bug", _ANY,
             "NaN/inf appear and nothing recorded explains them",
             ("find the first op that produces inf/NaN on that side (run it in float32; check the draft "
              "checkpoint's tensors are finite)")),
    CauseRow("nonfinite_weights", "bug", _ANY,
             "NaN/inf appear: the served draft checkpoint holds non-finite weights",
             "re-export the draft checkpoint from the trained weights (every tensor finite)",
             no_fix="the trained weights are needed to replace the non-finite ones"),
    CauseRow("unloaded_params", "bug", _ANY,
             "the engine built parameters its checkpoint did not provide: they hold what was allocated (NaN or "
             "garbage)",
             "make the draft config describe the checkpoint (num_hidden_layers = the decoder layers it holds, the "
             "norm flags and dims it was trained with) or ship the missing tensors: an engine leaves a parameter its checkpoint does not hold "
             "as allocated",
             no_fix="the missing tensors are trained weights the served checkpoint does not hold"),
    CauseRow("fp16_overflow", "bug", _ANY,
             "NaN/inf appear: one side ran in float16 where the other did not, and overflowed"),
    CauseRow("moe_routing_near_tie", "legitimate", ("target.aux",),
             "an MoE router's bf16 near tie sent tokens to other experts on each side"),
    CauseRow("draft_attention_context", "legitimate", _AFTER_ATTN,
             "rows differ only after an earlier cached row of their sequence differed upstream"),
    CauseRow("topk_boundary_near_tie", "legitimate", ("draft.logits", "draft.topk"),
             "top-k id sets differ only by a near tie at the last rank"),
    CauseRow("target_greedy_near_tie", "legitimate", ("verify",),
             "the target's greedy token differs only where its own two best logits tie"),
    CauseRow("contract.", "contract", _ANY,
             ("a contract fact (tracer/contract.py CONTRACT_FIELDS) differs and acts inside the first "
              "diverging stage (contract/facts.py STAGE_CAUSES), or predicts a crash")),
    CauseRow("unlisted_difference", "contract", _ANY,
             ("a recorded fact no table lists (replay/diff/contract/facts.py FACTS) differs between the sides; named with both "
              "values, stage unknown")),
    CauseRow("preflight.", "crash", ("target.aux", "draft.fc_in", "draft.attn_in", "verify"),
             "a pre-flight finding (replay/preflight) predicts a side's crash"),
)

_BY_ID = {r.cause: r for r in CAUSES}


def cause_row(cause_id: str) -> CauseRow:
    """The row of ``cause_id``: its own, or its family's (``contract.<field>`` for a contract field,
    ``preflight.<kind>``).

    Raises:
        KeyError: an id no row lists (a new cause needs its row).
    """
    if cause_id in _BY_ID:
        return _BY_ID[cause_id]
    family, _, rest = cause_id.partition(".")
    if rest and (family != "contract" or rest in CONTRACT_FIELDS) and f"{family}." in _BY_ID:
        return _BY_ID[f"{family}."]
    raise KeyError(f"cause {cause_id!r} is not a row of replay/diff/causes.py CAUSES")


def fix_of(cause_id: str) -> str:
    """The fix text of ``cause_id``'s row (``CauseRow.fix``)."""
    return cause_row(cause_id).fix


__all__ = ["CAUSES", "KINDS", "CauseRow", "cause_row", "fix_of"]
