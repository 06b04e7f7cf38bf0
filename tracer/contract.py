"""Contract facts: the metadata every trace carries so two sides can be checked field by field.

A contract is a plain dict (msgpack/JSON-safe: str, int, float, bool, None, lists, dicts).
``CONTRACT_FIELDS`` (tracer/contract_fields.py) names the known fields, their types and meaning; unknown extra fields are
kept (recorders may add more) but known ones are type-checked when a trace is written and
opened.

A fact the recorder could not read from the live engine objects is the string ``UNKNOWN``
(``"unknown"``), accepted for every field, and the field ``unobservable`` says which engine
name was missing and what else it hid; readers use ``known`` so an unknown fact is never
mistaken for a value.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from specdiff.eagle3.aux_layers import AUX_CONCAT_ORDER
from specdiff.eagle3.engines import UnknownEngineError, engine_spec
from specdiff.eagle3.families import DENSE_RECORDED, EXPERTS, moe_keys
from specdiff.tracer.contract_fields import CONTRACT_FIELDS
from specdiff.tracer.errors import TraceError

#: The value of a fact that could not be read from the live engine objects.
UNKNOWN = "unknown"
#: serving contract field: rid -> {"cached_prefix": int | UNKNOWN, "chunks": [[start, length], ...]}
#: (written by tracer/engines/sglang/prefill.py, read by replay/diff/judge/groups.py; traces/FORMAT.md)
REQUEST_PREFILL = "request_prefill"



def validate_contract(contract, *, where: str) -> dict:
    """Check a contract dict's known fields; returns it.

    Raises:
        TraceError: not a dict, or a known field of the wrong type (message names ``where``).
    """
    if not isinstance(contract, dict):
        raise TraceError(f"{where}: contract facts are a {type(contract).__name__}, expected a mapping")
    for key, value in contract.items():
        if value == UNKNOWN:
            continue
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


#: ``aux_ids_source`` values starting with this say the engine read no ids and used its default layers
AUX_IDS_DEFAULT_PREFIX = "default"


def unobservable_engine(entry: dict) -> tuple[str, str] | None:
    """(engine, version) of one ``unobservable`` entry, whichever engine wrote it: the entry holds
    ``<engine>_version`` next to ``<engine>`` (tracer/engines/names.py); None when it holds neither."""
    for key, value in entry.items():
        if key.endswith("_version") and key[: -len("_version")] in entry:
            return key[: -len("_version")], str(value)
    return None


def known(contract: dict, field: str, default=None):
    """``contract[field]``, or ``default`` when it is absent or ``UNKNOWN``."""
    v = contract.get(field, default)
    return default if isinstance(v, str) and v == UNKNOWN else v


def unknown_fields(contract: dict) -> list[str]:
    """Names of the contract fields recorded as ``UNKNOWN``, sorted."""
    return sorted(k for k, v in contract.items() if isinstance(v, str) and v == UNKNOWN)


def _engine_title(name: str) -> str:
    try:
        return engine_spec(name).title
    except UnknownEngineError:
        return name


def unknown_facts(contract: dict) -> dict[str, str]:
    """Field -> why it is unknown: the recorder's own reason (``unknown_reasons``), else the engine
    name the recorder could not find (from the contract's ``unobservable`` list, whichever engine
    wrote it: ``unobservable_engine``), for every field recorded as ``"unknown"``."""
    why = {f: r["why"] for f, r in (contract.get("unknown_reasons") or {}).items() if "why" in (r or {})}
    for u in contract.get("unobservable") or []:
        if isinstance(u, dict):
            eng = unobservable_engine(u)
            who = (f"{_engine_title(eng[0])} {eng[1]} has no {u.get('name')}" if eng
                   else f"the engine has no {u.get('name')}")
            for f in u.get("facts") or []:
                why.setdefault(f, who)
    # no ``unobservable`` list at all: a recorder from before specdiff said why a fact is unknown
    silent = ("the recorder could not read it" if "unobservable" in contract else
              "written as unknown by an older specdiff recorder, which did not say why")
    return {f: why.get(f, silent) for f in unknown_fields(contract)}


def weight_sha256(weight, *, rows: int | None = None) -> str:
    """sha256 of a weight's first ``rows`` rows as float32 C-order bytes (torch, any device/dtype).

    float32 so a bf16 serving weight and the same values held in fp32 by training hash alike;
    ``rows`` cuts an engine's vocab padding. Used for ``embed_sha256`` / ``lm_head_sha256``.

    Hashed a block of rows at a time (the same digest: sha256 over consecutive pieces of the bytes): a
    whole float32 copy plus its bytes doubled the peak memory of ``record train`` on a 128,256-row
    embedding (measured at 2048 wide: 2.99 -> 4.00 GiB RSS while the contract was built).
    """
    w = weight.detach()
    if rows is not None:
        w = w[:rows]
    h = hashlib.sha256()
    if w.dim() == 0:
        h.update(np.ascontiguousarray(w.float().cpu().numpy()).tobytes())
        return h.hexdigest()
    per_row = max(1, math.prod(w.shape[1:]) * 4)
    step = max(1, HASH_BLOCK_BYTES // per_row)
    for i in range(0, w.shape[0], step):
        h.update(np.ascontiguousarray(w[i:i + step].float().cpu().numpy()).data)
    return h.hexdigest()


#: bytes of float32 rows ``weight_sha256`` converts at a time
HASH_BLOCK_BYTES = 32 << 20


#: Keys of a config's to_dict() left out of config_sha256 (at every depth), so the engine's copy and
#: training's copy of one checkpoint hash alike: where / how it was loaded, and the attributes SGLang
#: 0.5.23 writes into the hf_config it loaded (configs/model_config.py:908-913 encoder_only /
#: language_only / language_model_only, :1329 context_len, :1352-1365 v_head_dim / swa_head_dim /
#: swa_v_head_dim filled in when absent; update_config.py:233-242 original_num_attention_heads /
#: original_total_num_kv_heads). So a change of v_head_dim alone does not change the hash; a CPU
#: tensor-parallel run whose head count SGLang pads (update_config.py:244) hashes its padded config.
CONFIG_UNHASHED_KEYS = frozenset({
    "_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation",
    "_attn_implementation_autoset", "attn_implementation", "torch_dtype", "dtype", "use_cache",
    "original_num_attention_heads", "original_total_num_kv_heads",
    "context_len", "encoder_only", "language_only", "language_model_only", "v_head_dim", "swa_head_dim",
    "swa_v_head_dim"})


#: rope_type spellings an engine writes into the loaded config for the rope the checkpoint names:
#: SGLang 0.5.23 renames DeepSeek's "yarn" in place when it builds the attention (deepseek_v2.py:2066).
_ROPE_TYPE_ALIASES = {"deepseek_yarn": "yarn"}


def _canonical(value):
    """JSON-safe form of a config value: nested configs as dicts, tuples as lists, keys as str; in a
    rope dict, ``rope_type`` spelled by ``_ROPE_TYPE_ALIASES`` and the legacy ``type`` alias of
    ``rope_type`` dropped (SGLang adds it, utils/hf_transformers_patches.py:113)."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        value = value.to_dict()
    if isinstance(value, dict):
        value = dict(value)
        if isinstance(value.get("rope_type"), str):
            value["rope_type"] = _ROPE_TYPE_ALIASES.get(value["rope_type"], value["rope_type"])
            if isinstance(value.get("type"), str):
                value["type"] = _ROPE_TYPE_ALIASES.get(value["type"], value["type"])
        alias = "type" in value and "rope_type" in value and value["type"] == value["rope_type"]
        return {str(k): _canonical(v) for k, v in value.items()
                if str(k) not in CONFIG_UNHASHED_KEYS and not (alias and k == "type")}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # e.g. a torch.dtype left in a sub-config


def config_sha256(config) -> str:
    """``target_config_sha256``: sha256 of a model config as canonical JSON.

    Args:
        config: a transformers ``PretrainedConfig`` (hashed through its ``to_dict()``) or a mapping
            (e.g. the parsed ``config.json``).

    Raises:
        TypeError: ``config`` is neither.

    The dict is taken without ``CONFIG_UNHASHED_KEYS`` (at every depth), nested configs as
    dicts, then ``json.dumps(sort_keys=True, separators=(",", ":"), allow_nan=True)`` UTF-8.
    ``to_dict()`` writes every attribute, defaults included, so a config.json that omits a default
    and one that spells it out hash alike once both are loaded by the same transformers version.
    """
    import json
    from collections.abc import Mapping

    if not (isinstance(config, Mapping) or callable(getattr(config, "to_dict", None))):
        raise TypeError(f"config_sha256 needs a transformers config or a mapping, got {type(config).__name__}")
    body = json.dumps(_canonical(config), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(body.encode()).hexdigest()


#: rows of the embedding ``weights_fingerprint`` reads
FINGERPRINT_ROWS = 16


def weights_fingerprint(embedding, vocab_size: int, *, rows: int = FINGERPRINT_ROWS) -> str:
    """``target_weights_fingerprint``: which checkpoint a target is, cheaply and dtype-independently.

    Args:
        embedding: the target's input embedding weight [>= vocab_size, H] (torch, any device and
            float dtype; engine padding rows past ``vocab_size`` are ignored).
        vocab_size: the target's vocab V (config ``vocab_size``).
        rows: how many rows to read (default ``FINGERPRINT_ROWS``).

    Returns:
        sha256 hex of ``b"<V>x<H>;"`` followed by rows ``k * V // rows`` (k = 0..rows-1, so the
        rows spread over the vocab) cast to float32 and then to bfloat16 (round to nearest even),
        as little-endian bf16 bytes. A bf16 checkpoint read in bf16 or fp32 and an fp32 checkpoint
        served in bf16 give the same value; an fp16 copy can differ (a second rounding).

    Raises:
        ValueError: the weight holds fewer than ``vocab_size`` rows (a tensor-parallel shard).
    """
    import torch

    w = embedding.detach()
    if w.dim() != 2 or w.shape[0] < vocab_size:
        raise ValueError(f"weights_fingerprint needs the whole embedding [{vocab_size}, H], got "
                         f"{list(w.shape)} (a tensor-parallel shard?)")
    n = max(1, min(int(rows), int(vocab_size)))
    idx = torch.arange(n, dtype=torch.int64) * int(vocab_size) // n
    picked = w[idx.to(w.device)].float().to(torch.bfloat16).cpu().contiguous()
    h = hashlib.sha256(f"{int(vocab_size)}x{int(w.shape[1])};".encode())
    h.update(picked.view(torch.int16).numpy().astype("<i2").tobytes())
    return h.hexdigest()


#: HF architecture -> (config attribute of the routed-expert count, of experts per token), None for
#: a dense architecture. Both sides read MoE routing through it (moe_routing_facts); derived from
#: the target-family table (``specdiff.eagle3.families``: ``moe_keys``, ``DENSE_RECORDED``).
MOE_CONFIG_KEYS: dict[str, tuple[str, str] | None] = {
    **{a: None for a in sorted(DENSE_RECORDED)},
    **{a: moe_keys(a) for a in EXPERTS if moe_keys(a) is not None},
}


def moe_routing_facts(config, architecture: str) -> dict:
    """``target_num_experts`` / ``target_experts_per_token`` of a (language-model) config.

    None / None for a dense architecture; ``UNKNOWN`` for an architecture ``MOE_CONFIG_KEYS`` does
    not list, or a config without the attribute (never a guess from similar names).
    """
    keys = MOE_CONFIG_KEYS.get(architecture, UNKNOWN)
    if keys is None:
        return {"target_num_experts": None, "target_experts_per_token": None}
    if keys == UNKNOWN:
        return {"target_num_experts": UNKNOWN, "target_experts_per_token": UNKNOWN}
    vals = [getattr(config, k, None) for k in keys]
    return {f: int(v) if isinstance(v, int) else UNKNOWN
            for f, v in zip(("target_num_experts", "target_experts_per_token"), vals)}


def target_identity_facts(config, embedding=None, *, architecture: str | None = None) -> dict:
    """The target identity facts a training-side recorder writes (the serving side reads the same
    from SGLang's live objects, tracer/engines/sglang/contract.py ``target_identity_facts``).

    Args:
        config: the target's transformers config as loaded (``AutoConfig.from_pretrained``).
        embedding: the target's input embedding weight [V, H] (any dtype), or None (fingerprint
            ``UNKNOWN``).
        architecture: default ``config.architectures[0]``.

    Returns:
        {target_architecture, target_config_sha256, target_num_experts, target_experts_per_token,
        target_weights_fingerprint}; facts it cannot compute are ``UNKNOWN``.
    """
    if architecture is None:
        archs = getattr(config, "architectures", None) or []
        architecture = str(archs[0]) if archs else UNKNOWN
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    out = {"target_architecture": architecture, "target_config_sha256": config_sha256(config),
           **moe_routing_facts(text, architecture)}
    vocab = getattr(text, "vocab_size", None)
    out["target_weights_fingerprint"] = (weights_fingerprint(embedding, vocab)
                                         if embedding is not None and isinstance(vocab, int) else UNKNOWN)
    return out


def rope_scaling_fact(kind: str | None, **params) -> dict | None:
    """The ``rope_scaling`` fact: None for plain rope, else ``{"type": kind, **params}`` with
    float params (None ones dropped), so both sides write the same dict for the same rope."""
    if kind in (None, "default"):
        return None
    return {"type": str(kind), **{k: float(v) for k, v in sorted(params.items()) if v is not None}}


def bos_added_fact(first_tokens, bos_token_id) -> bool | str | None:
    """``bos_added`` from the first token of each prompt: True (all BOS), False (none), None (no
    prompt), ``UNKNOWN`` (no BOS id known) or ``"mixed"`` (some)."""
    firsts = list(first_tokens)
    if not firsts:
        return None
    if bos_token_id is None:
        return UNKNOWN
    hits = sum(int(t) == int(bos_token_id) for t in firsts)
    return True if hits == len(firsts) else False if hits == 0 else "mixed"


def tokenizer_hashes(model_dir) -> tuple[str | None, str | None]:
    """(sha256 of tokenizer.json, sha256 of the chat template) of a Hugging Face model directory:
    the files a tokenizer loaded from it reads (``chat_template.jinja`` first, then
    ``tokenizer_config.json``'s ``chat_template``; a list of named templates is hashed as JSON)."""
    import json
    from pathlib import Path

    p = Path(model_dir)
    tok = p / "tokenizer.json"
    tok_sha = hashlib.sha256(tok.read_bytes()).hexdigest() if tok.is_file() else None
    template = None
    jinja = p / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
    else:
        tc = p / "tokenizer_config.json"
        if tc.is_file():
            try:
                template = json.loads(tc.read_text()).get("chat_template")
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                template = None
            if isinstance(template, list):  # named templates
                template = json.dumps(template, sort_keys=True)
    tmpl_sha = hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) else None
    return tok_sha, tmpl_sha
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
