"""Contract facts: the metadata every trace carries so two sides can be checked field by field.

A contract is a plain dict (msgpack/JSON-safe: str, int, float, bool, None, lists, dicts).
``CONTRACT_FIELDS`` names the known fields, their types and meaning; unknown extra fields are
kept (recorders may add more) but known ones are type-checked when a trace is written and
opened. DESIGN.md "The trace model" lists them.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .errors import TraceError

_num = (int, float)
_list = (list, tuple)

#: HF index of each aux slot in concat order (slot j = ``target.aux.{j}``); both sides record it.
AUX_CONCAT_ORDER = "aux_concat_order"
#: every value ``record train`` filled in for an option the user did not give: name -> {value, source}
DEFAULTS_USED = "defaults_used"

#: name -> (accepted python types, meaning)
CONTRACT_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "side": ((str,), "'serve' or 'train'"),
    "engine": ((str,), "who recorded: 'sglang', 'specdiff-reference', 'specforge', 'speculators', ..."),
    "engine_version": ((str,), "version string of the engine"),
    "num_layers": ((int,), "target decoder layers L"),
    "hidden_size": ((int,), "target hidden size H"),
    "draft_hidden_size": ((int,), "draft hidden size Hd"),
    "vocab_size": ((int,), "target vocab V"),
    "draft_vocab_size": ((int,), "draft vocab Vd"),
    "aux_hf_indices": (_list, "the aux layers captured, as HF hidden_states indices, ascending"),
    AUX_CONCAT_ORDER: (_list + (str,), "HF index of each aux slot in concat order (slot j = "
                       "target.aux.{j}): SGLang ascending, record train as the user listed; 'unknown' "
                       "when the engine's capture could not be read"),
    "aux_native_ids": (_list + (type(None),), "the ids as configured (None = tool default)"),
    "aux_convention": ((str,), "convention of aux_native_ids (tracer.conventions)"),
    "aux_dropped_ids": (_list, "native ids the engine silently drops"),
    "norm_before_fc": ((bool,), "per-slot norm applied before fc"),
    "fc_norm": ((bool,), "norm applied to fc input"),
    "d2t_sha256": ((str, type(None)), "sha256 of d2t int64 bytes (None = no d2t: identity)"),
    "t2d_sha256": ((str, type(None)), "sha256 of t2d bool bytes"),
    "hot_token_id_sha256": ((str, type(None)), "sha256 of hot_token_id = d2t + arange (int64)"),
    "draft_weights_sha256": ((str, type(None)), "sha256 over the draft state dict"),
    "embed_source": ((str,), "'draft', 'target' or 'random'"),
    "lm_head_source": ((str,), "'draft', 'target' or 'random'"),
    "spec_steps": ((int,), "--speculative-num-steps / TTT steps"),
    "spec_topk": ((int,), "--speculative-eagle-topk"),
    "spec_draft_tokens": ((int,), "--speculative-num-draft-tokens"),
    "dtype": ((str,), "compute dtype of the recorded tensors"),
    "logits_topk": ((int,), "k of draft.logits_topk.* at the capture level"),
    "capture_level": ((str,), "'default' or 'full'"),
    "tokenizer_sha256": ((str, type(None)), "sha256 of tokenizer.json"),
    "chat_template_sha256": ((str, type(None)), "sha256 of the chat template"),
    "graph_hidden_stages": (_list, "stages that CUDA graphs hid from the recorder"),
    "dropped_records": ((int,), "records the recorder dropped because the writer fell behind"),
    "findings": (_list, "pre-flight contract findings (specdiff check)"),
    "model_name": ((str,), "target model path or name"),
    DEFAULTS_USED: ((dict,), "options the recorder filled in: name -> {'value': ..., 'source': where "
                    "the value came from}"),
    "draft_name": ((str,), "draft model path or name"),
}


def validate_contract(contract, *, where: str) -> dict:
    """Check a contract dict's known fields; returns it.

    Raises:
        TraceError: not a dict, or a known field of the wrong type (message names ``where``).
    """
    if not isinstance(contract, dict):
        raise TraceError(f"{where}: contract facts are a {type(contract).__name__}, expected a mapping")
    for key, value in contract.items():
        if key in CONTRACT_FIELDS:
            types, meaning = CONTRACT_FIELDS[key]
            if isinstance(value, bool) and bool not in types:
                ok = False
            else:
                ok = isinstance(value, types)
            if not ok:
                raise TraceError(f"{where}: contract field {key!r} ({meaning}) has type "
                                 f"{type(value).__name__}")
    return contract


def aux_slot_layers(contract) -> list[int] | None:
    """HF index of each aux slot j (``target.aux.{j}``) from a contract: ``aux_concat_order``,
    else ``aux_hf_indices`` (traces written before the concat order was recorded were always
    ascending); None when neither is a list (e.g. ``'unknown'``)."""
    for key in (AUX_CONCAT_ORDER, "aux_hf_indices"):
        value = contract.get(key)
        if isinstance(value, (list, tuple)):
            return [int(i) for i in value]
    return None


def sha256_array(array) -> str | None:
    """sha256 hex of an array's C-order bytes (numpy or torch, moved to host); None for None.

    Used for d2t (int64) / t2d (bool) / hot_token_id (int64) so both sides hash the same bytes.
    """
    if array is None:
        return None
    if hasattr(array, "detach"):
        array = array.detach().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
