"""The contract facts of a training trace that come from outside the replayed rows: the draft's
computation as the reference forward runs it (``draft_computation_facts``), the pre-flight
findings on the pair as recorded (``preflight_facts``) and a note where serving's and training's
last slot differ in pre-norm vs post-norm (``prenorm_notes``). ``record_train.TrainSide.contract``
gathers them with the rest.
"""

from __future__ import annotations

from specdiff.tracer.contract import bos_added_fact, known, rope_scaling_fact, tokenizer_hashes, weight_sha256
from specdiff.tracer.errors import SpecdiffError

__all__ = ["draft_computation_facts", "preflight_facts", "prenorm_notes"]


def draft_computation_facts(draft, config, *, vocab: int, seqs, bos_token_id, tokenizer_dir) -> dict:
    """The contract fields that decide the draft's computation, from the training side's live
    draft module and sequences (the same field names and hashing as the SGLang recorder,
    tracer/contract.py): algorithm, embedding / lm_head sha256, rope as the reference attention
    applies it (rotate_half = neox), BOS and chat template. The aux layers and their concat
    order come from ``AuxResolution.as_facts``.
    """
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    params = {k: scaling.get(k) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings") if scaling.get(k) is not None}
    return {
        "spec_algorithm": "EAGLE3",  # the reference forward is EAGLE-3's (fc over the aux concat)
        "embed_sha256": weight_sha256(draft.embed_tokens.weight, rows=vocab),
        "lm_head_sha256": weight_sha256(draft.lm_head.weight, rows=config.draft_vocab_size),
        "rope_theta": float(config.rope_theta),
        "rope_scaling": rope_scaling_fact(kind, **params),
        "rope_style": "neox" if config.rope_is_neox_style else "gptj",  # as draft_model.apply_rope rotates
        "partial_rotary_factor": float(config.partial_rotary_factor),
        "bos_added": bos_added_fact([int(s.tokens[0]) for s in seqs if len(s.tokens)], bos_token_id),
        "chat_template_sha256": tokenizer_hashes(tokenizer_dir)[1],
    }


def prenorm_notes(served: dict, aux, num_layers: int) -> list[str]:
    """A note when serving's slot L is the last layer's pre-norm output (its contract's
    ``aux_prenorm_indices``) but training's slot L is HF hidden_states[L] (after the norm), or the
    reverse: the replay keeps what the caller's ids say, and ``diff`` compares the two."""
    served_pre = known(served, "aux_prenorm_indices") or []
    train_pre = list(getattr(aux, "prenorm", ()))
    L = num_layers
    if L in served_pre and L in aux.hf_indices and L not in train_pre:
        return [f"serving's slot L{L} is the last layer's output before the final norm (aux_prenorm_indices "
                f"{list(served_pre)}); training's HF {L} is after the norm, as the {aux.convention} ids say. If "
                f"training fed the pre-norm output, give the ids in the convention that names it (e.g. the draft's "
                f"SGLang ids with --aux-convention sglang)"]
    if train_pre and known(served, "aux_prenorm_indices") is not None and L not in served_pre:
        return [f"training's slot L{L} is the last layer's output before the final norm; serving captured no "
                f"pre-norm slot (aux_prenorm_indices {served.get('aux_prenorm_indices')})"]
    return []


def preflight_facts(target_dir, draft_dir, training_hf) -> list[dict]:
    """``specdiff check`` on the pair as recorded (error/warn only), for the contract ``findings``;
    ``training_hf`` None: without the training-layers comparison."""
    from specdiff.replay.preflight.check import findings_as_facts, run_preflight

    try:
        report = run_preflight(target_dir, draft_dir, training_convention="hf",
                               training_layers=None if training_hf is None else list(training_hf))
    except SpecdiffError:
        return []
    return [f for f in findings_as_facts(report.findings) if f["severity"] in ("error", "warn")]
