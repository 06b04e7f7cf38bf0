"""The contract facts of a training trace that come from outside the replayed rows: the draft's
computation as the reference forward runs it (``draft_computation_facts``), the whole configs,
options, structures and weight fingerprints read off the live models (``live_facts``), the
pre-flight findings on the pair as recorded (``preflight_facts``) and a note where serving's and
training's last slot differ in pre-norm vs post-norm (``prenorm_notes``).
``train_side.TrainSide.contract`` gathers them with the rest.
"""

from __future__ import annotations

from specdiff.eagle3.attention_window import window_fact
from specdiff.tracer.contract import bos_added_fact, known, rope_scaling_fact, tokenizer_hashes, weight_sha256
from specdiff.tracer.errors import SpecdiffError

__all__ = ["draft_computation_facts", "live_facts", "preflight_facts", "prenorm_notes"]

#: fields of the reference draft's config (``Eagle3DraftConfig``) that mean what the same key of a
#: transformers LlamaConfig means: in ``draft_config`` the value the reference computes with replaces the
#: file's (``rope_theta`` sits in transformers 5's ``rope_parameters``)
_SAME_MEANING = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "vocab_size", "draft_vocab_size", "rms_norm_eps", "hidden_act", "max_position_embeddings",
                 "tie_word_embeddings", "target_hidden_size")


def draft_config_fact(loaded) -> dict:
    """``draft_config``: the draft's config.json as transformers builds it (the class an engine builds
    the config with: every key, defaults filled in; the file itself when transformers cannot read it, e.g.
    a speculators config), with the values the reference draft computes with where a key means the same
    (``_SAME_MEANING``), ``rope_parameters.rope_theta`` and ``num_hidden_layers`` (the layers the reference
    builds)."""
    from specdiff.tracer.config_facts import config_fact

    try:
        from transformers import AutoConfig

        out = config_fact(AutoConfig.from_pretrained(loaded.path, local_files_only=True))
    except Exception:  # noqa: BLE001 - a format transformers does not know: the file, every key as written
        out = config_fact(dict(loaded.raw_config))
    cfg = loaded.config
    for key in _SAME_MEANING:
        if key in out:
            out[key] = getattr(cfg, key)
    if isinstance(out.get("rope_parameters"), dict) and "rope_theta" in out["rope_parameters"]:
        out["rope_parameters"]["rope_theta"] = float(cfg.rope_theta)
    if "num_hidden_layers" in out:
        out["num_hidden_layers"] = cfg.num_hidden_layers
    return out


def live_facts(target, loaded, options: dict, target_dir) -> dict:
    """The facts read whole off the training side's live objects (tracer/contract.py: ``target_config``,
    ``draft_config``, ``engine_options``, the structures, the checkpoints' fingerprints on the load path,
    the parameters the checkpoints did not provide, the buffers and rope tables: ``train_state``).

    Args:
        target: the HF target as loaded (``replay.model.target_capture.load_target``).
        loaded: the ``LoadedDraft``.
        options: record train's options, filled in (``TrainSide.options``).
        target_dir: the target's directory (its checkpoint files are what ``from_pretrained`` loaded).
    """
    from specdiff.replay.record.train_state import train_state_facts
    from specdiff.tracer.config_facts import config_fact, json_safe
    from specdiff.tracer.weight_facts import (
        checkpoint_fingerprints,
        layer_input_norms,
        structure,
        unit_fingerprints,
    )

    m = loaded.model
    return {
        "target_config": config_fact(target.config), "draft_config": draft_config_fact(loaded),
        "engine_options": json_safe(dict(options)),
        "target_structure": structure(target, per_unit=True), "draft_structure": structure(m, per_unit=False),
        "target_weights": unit_fingerprints(checkpoint_fingerprints(target_dir)),
        "draft_weights": dict(loaded.weight_fingerprints),
        # the reference's later layers normalise with hidden_norm, as SGLang does (replay/model/draft_model.py)
        "draft_layer_input_norms": layer_input_norms(m.decoder_layers(), "hidden_norm"),
        "target_unloaded": list(getattr(target, "specdiff_missing_keys", [])),
        # load_draft refuses a checkpoint without a weight the forward needs; the embedding alone may come
        # from neither the checkpoint nor the target (then random: draft_notes says so)
        "draft_unloaded": ["embed_tokens.weight"] if getattr(m, "embed_source", None) == "random" else [],
        **train_state_facts(target, loaded),  # buffers, rope tables, config overrides (none)
    }


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
        "draft_attention_window": window_fact(config.attention_windows, config.window_distance,
                                              config.num_hidden_layers),
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
