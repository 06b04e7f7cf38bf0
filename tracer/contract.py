"""Contract facts: the metadata every trace carries so two sides can be checked field by field.

A contract is a plain dict (msgpack/JSON-safe: str, int, float, bool, None, lists, dicts).
``CONTRACT_FIELDS`` names the known fields, their types and meaning; unknown extra fields are
kept (recorders may add more) but known ones are type-checked when a trace is written and
opened. DESIGN.md "The trace model" lists them.

A fact the recorder could not read from the live engine objects is the string ``UNKNOWN``
(``"unknown"``), accepted for every field, and the field ``unobservable`` says which engine
name was missing and what else it hid; readers use ``known`` so an unknown fact is never
mistaken for a value.
"""

from __future__ import annotations

import hashlib

import numpy as np

from specdiff.eagle3.aux_layers import AUX_CONCAT_ORDER
from specdiff.eagle3.engines import UnknownEngineError, engine_spec
from specdiff.eagle3.families import DENSE_RECORDED, EXPERTS, moe_keys
from specdiff.eagle3.norms import meaning as norm_meaning
from specdiff.tracer.errors import TraceError

#: The value of a fact that could not be read from the live engine objects.
UNKNOWN = "unknown"
#: serving contract field: rid -> {"cached_prefix": int | UNKNOWN, "chunks": [[start, length], ...]}
#: (written by tracer/engines/sglang/prefill.py, read by replay/diff/judge/groups.py; traces/FORMAT.md)
REQUEST_PREFILL = "request_prefill"

_num = (int, float)
_list = (list, tuple)

#: every value ``record train`` filled in for an option the user did not give: name -> {value, source}
DEFAULTS_USED = "defaults_used"

#: name -> (accepted python types, meaning)
CONTRACT_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "side": ((str,), "'serve' or 'train'"),
    "engine": ((str,), "who recorded: a serving engine registered in tracer/engines ('sglang', 'vllm'), or a "
                       "training side ('specdiff-reference', 'specforge', 'speculators', ...)"),
    "engine_version": ((str,), "version string of the engine"),
    "trainer": ((str,), "training side: the trainer whose own draft class and TTT loop computed the forward "
                        "('specforge', 'speculators'; absent: specdiff's reference, replay/trainers)"),
    "trainer_version": ((str,), "training side: the installed version of that trainer's package"),
    "trainer_class": ((str,), "training side: the trainer's draft class (module.qualname)"),
    "trainer_variants": ((dict,), "training side: fact -> value where the trainer computes what the reference's "
                                  "default does not (e.g. rope_position_offset 1); {} when it agrees"),
    "specforge_contract": ((dict,), "training side: what SpecForge recorded of the run, as read (checkpoint provenance, capture contract), and each disagreement with this recording (replay/record/specforge_contract.py)"),
    "trainer_config": ((dict,), "training side: what the trainer's own config of the draft says (speculators: "
                                "algorithm, speculative_tokens, verifier, aux ids, norm flags, layer_types)"),
    "num_layers": ((int,), "target decoder layers L"),
    "hidden_size": ((int,), "target hidden size H"),
    "draft_hidden_size": ((int,), "draft hidden size Hd"),
    "vocab_size": ((int,), "target vocab V"),
    "draft_vocab_size": ((int,), "draft vocab Vd"),
    "spec_algorithm": ((str,), "speculative algorithm the draft runs under: 'EAGLE3', 'EAGLE', ..."),
    "aux_hf_indices": (_list, "the aux layers captured, as HF hidden_states indices, ascending"),
    AUX_CONCAT_ORDER: (_list + (str,), "HF index of each aux slot in concat order (slot j = "
                       "target.aux.{j}): SGLang ascending, record train as the user listed; 'unknown' "
                       "when the engine's capture could not be read"),
    "aux_native_ids": (_list + (type(None),), "the ids as configured (None = tool default)"),
    "aux_convention": ((str,), "convention of aux_native_ids (tracer.conventions)"),
    "aux_dropped_ids": (_list, "native ids the engine silently drops"),
    "aux_prenorm_indices": (_list, "entries L of aux_hf_indices whose slot holds the last decoder layer's "
                                   "output before the final norm (SGLang GPT-OSS capture index L, gpt_oss.py:731), "
                                   "which HF hidden_states[L] (after the norm) is not; [] when none"),
    # the norm flags' meanings are written once, in specdiff.eagle3.norms
    "norm_before_fc": ((bool,), norm_meaning("norm_before_fc")),
    "fc_norm": ((bool,), norm_meaning("fc_norm")),
    "norm_output": ((bool,), norm_meaning("norm_output")),
    "norm_before_residual": ((bool,), norm_meaning("norm_before_residual")),
    "d2t_sha256": ((str, type(None)), "sha256 of d2t int64 bytes (None = no d2t: identity)"),
    "t2d_sha256": ((str, type(None)), "sha256 of t2d bool bytes"),
    "hot_token_id_sha256": ((str, type(None)), "sha256 of hot_token_id = d2t + arange (int64)"),
    "draft_weights_sha256": ((str, type(None)), "sha256 over the draft state dict"),
    "embed_source": ((str,), "'draft', 'target' or 'random'"),
    "lm_head_source": ((str,), "'draft', 'target' or 'random'"),
    "embed_sha256": ((str,), "sha256 of the embedding the draft multiplies by (weight_sha256)"),
    "lm_head_sha256": ((str,), "sha256 of the lm_head the draft multiplies by (weight_sha256)"),
    "rope_theta": (_num, "rope base of the draft's attention"),
    "rope_scaling": ((dict, type(None)), "rope scaling of the draft's attention (rope_scaling_fact)"),
    "rope_style": ((str,), "'neox' (rotate halves) or 'gptj' (rotate interleaved pairs)"),
    "draft_attention_window": ((list,), "per draft decoder layer: null (full attention) or {window W: the farthest key "
                               "seen, distance: 'kv' | 'prefix', how it is counted} (eagle3/attention_window.py)"),
    "partial_rotary_factor": (_num, "fraction of each head's dims the draft's rope rotates (SGLang: rotary_dim / "
                                    "head_size of its rotary_emb, srt/models/llama.py:199-200)"),
    "embed_fingerprint": ((str,), "dtype-independent hash of the embedding the draft multiplies by (values rounded "
                                  "through float16 then bfloat16): equal for one checkpoint held in bf16, fp16 or "
                                  "fp32 (replay/diff/explain/contract_check.py WEIGHT_HASHES)"),
    "lm_head_fingerprint": ((str,), "dtype-independent hash of the draft's lm_head (as embed_fingerprint)"),
    "bos_added": ((bool, str, type(None)), "every prompt starts with BOS (False: none does; 'mixed'; None: "
                                          "no prompt) - bos_added_fact"),
    "spec_steps": ((int,), "--speculative-num-steps / TTT steps"),
    "spec_topk": ((int,), "--speculative-eagle-topk"),
    "spec_draft_tokens": ((int,), "--speculative-num-draft-tokens"),
    "dtype": ((str,), "compute dtype of the recorded tensors"),
    "logits_topk": ((int,), "k of draft.logits_topk.* at the capture level"),
    "capture_level": ((str,), "'default' or 'full'"),
    "tokenizer_sha256": ((str, type(None)), "sha256 of tokenizer.json"),
    "chat_template_sha256": ((str, type(None)), "sha256 of the chat template"),
    "graph_hidden_stages": (_list, "stages that CUDA graphs hid from the recorder"),
    "unrecorded_stages": ((dict,), "tensor -> why this recorder could not observe it (a CUDA graph, "
                                   "a module the engine's draft lacks); the app shows the reason"),
    "depth_coverage": ((str,), "which positions have draft rows at depth >= 1, in words (serving drafts "
                               "only from the last accepted position of each step)"),
    "dropped_records": ((int,), "records the recorder dropped because the writer fell behind"),
    "recorder_hook_s": (_num, "seconds the serving recorder's hooks ran inside the engine's iterations "
                              "(its cost on the serving path; benchmarks/recorder_overhead.py)"),
    "recorder_iter_s": (_num, "seconds the recorded iterations took, hooks included"),
    "recorder_writer_s": (_num, "seconds the background writer (thread, or process: tracer/engines/writer/child.py) "
                                "spent writing the store"),
    "recorder_writer_cpu_s": (_num, "CPU seconds the recorder's writer process spent after start-up (off the server's process)"),
    "recorder_caught_up_at": (_num + (type(None),), "unclosed traces only: a moment (the writer's Unix seconds) before "
                                                    "which the writer process had written every capture handed to it, "
                                                    "from its last journal 'progress' entry; None: it has written all "
                                                    "it will (replay/watch/follow.py settles requests on it)"),
    "engine_process_start": ((str,), "how the engine process the recorder ran in was started, read there: "
                                     "multiprocessing's start method ('spawn': SGLang 0.5.23's own, "
                                     "srt/entrypoints/engine.py:1995; 'fork': specdiff's CPU launcher with "
                                     "SPECDIFF_SGLANG_START=fork, tracer/engines/sglang/cpu/serve.py)"),
    "recorder_writer": ((dict,), "which writer the serving recorder ran, read off the live writer: {'kind': "
                                 "'process' (rows built in a writer process fed through a shared-memory ring) or "
                                 "'thread' (in the server's process), 'ring_bytes' (the ring's size; None for the "
                                 "thread), 'why' (why the thread ran: 'SPECDIFF_WRITER=thread' or 'no shared-memory "
                                 "ring: <error>'; None for the process), 'queue_bytes' (the thread's queue bound; None for the process or a lossless queue), "
                                 "'nice' and 'autogroup_nice' (the writer's niceness and its session's, read back "
                                 "after setting: None where unreadable or no autogroup), 'nice_why' (why it is not "
                                 "the writer process's nice 19, None when it is)} (tracer/engines/writer/thread.py facts())"),
    "sampling": ((dict,), "how requests were chosen for recording: {'fraction', 'marker', 'rids'} "
                          "(tracer/engines/requests.py RequestSampler)"),
    "sampled_requests": ((dict,), "rid -> why it was recorded: 'all', 'fraction' (blake2b draw < fraction) "
                                  "or 'marked' (the client's custom_params.specdiff_record)"),
    "dropped_requests": (_list, "rids the recorder dropped whole because its writer fell behind (rows "
                                "written before the drop stay; later ones are not recorded)"),
    "findings": (_list, "pre-flight contract findings (specdiff check)"),
    "model_name": ((str,), "target model path or name"),
    DEFAULTS_USED: ((dict,), "options the recorder filled in: name -> {'value': ..., 'source': where "
                    "the value came from}"),
    "draft_name": ((str,), "draft model path or name"),
    "unknown_reasons": ((dict,), "facts read but not settled: {field: {why, fix}} (vLLM's draft_attention_window)"),
    "unobservable": (_list, "engine names the recorder could not find: [{name, <engine>, source, tensors, facts, "
                            "why, <engine>_version}], <engine> being the trace's engine fact ('sglang': "
                            "{..., sglang: dotted path, sglang_version}; 'vllm': {..., vllm, vllm_version}) "
                            "(tracer/engines/names.py EngineAdapter.unobservable; read back: unobservable_engine)"),
    # ---- facts only some engines record (vLLM 0.32: tracer/engines/vllm/contract.py) ----------------
    "engine_runner": ((str,), "the engine's model runner that ran, '<runner> <module>.<Class>' (vLLM: 'v1 "
                              "vllm.v1.worker.cpu_model_runner.CPUModelRunner'; only V1 is hooked: a 'v2 ...' "
                              "runner means nothing per step was recorded)"),
    "aux_ids_source": ((str,), "where the engine took the aux ids from, in its own key precedence: a config key "
                               "('top-level eagle_aux_hidden_state_layer_ids', 'eagle_config."
                               "eagle_aux_hidden_state_layer_ids', ...) or, starting with 'default', the "
                               "engine's fallback when no key it reads held ids (AUX_IDS_DEFAULT_PREFIX)"),
    "aux_id_rule": ((str,), "the engine's aux-id convention in words, with its source lines (vLLM: id k = HF "
                            "hidden_states[k], deduplicated, ascending)"),
    "d2t_rule": ((str,), "how the engine maps draft-vocab logits to target ids, with its source lines (vLLM: "
                         "scattered into the full vocab at arange(Vd) + d2t)"),
    "draft_class": ((str,), "dotted class of the draft model the engine built (vLLM: 'vllm.model_executor."
                            "models.llama_eagle3.Eagle3LlamaForCausalLM')"),
    "draft_num_aux": ((int,), "aux hidden states the draft's fc takes (its input width / hidden size); a count "
                              "that differs from the captured slots crashes the first request"),
    "target_architecture": ((str,), "the target model class the engine instantiated, named after the HF "
                                    "architecture it serves (SGLang: type(ModelRunner.model).__name__, "
                                    "e.g. 'DeepseekV3ForCausalLM'; training: config.architectures[0])"),
    "target_config_sha256": ((str,), "config_sha256 of the target's config as the engine loaded it: canonical "
                                     "JSON of its to_dict() without CONFIG_UNHASHED_KEYS (provenance and what "
                                     "SGLang adds)"),
    "target_num_experts": ((int, type(None)), "routed experts per MoE layer of the target (None: dense)"),
    "target_experts_per_token": ((int, type(None)), "experts each token is routed to (top-k; None: dense)"),
    "aux_capture_rule": ((str,), "whose set_eagle3_layers_to_capture turned the draft's aux ids into the "
                                 "captured layers: 'sglang srt/models/<file>.py:<line> <Class>.<method>' "
                                 "(plus the wrapper it was reached through); 'none' when the target has none"),
    "target_weights_fingerprint": ((str,), "weights_fingerprint of the target's input embedding: the same "
                                           "checkpoint in bf16 or fp32 gives the same value"),
    "crash": ((dict,), "the exception that stopped the engine: {type, message, forward, shapes, "
                       "traceback} (written before the process died)"),
    # ---- read whole from the live objects (tracer/config_facts.py, tracer/weight_facts.py): every key ----
    "draft_config": ((dict,), "every key of the draft's config as the engine or trainer built it (its to_dict(), "
                              "defaults filled in), JSON-safe"),
    "target_config": ((dict,), "every key of the target's config as the engine or trainer built it"),
    "engine_options": ((dict,), "every field of the engine's argument object as resolved (SGLang: ServerArgs."
                                "resolved_dict(); vLLM: its VllmConfig's configs; record train: its options)"),
    "engine_options_given": ((dict,), "the options the operator gave: field -> {'value', 'default'} (raw "
                                      "ServerArgs fields that differ from their defaults)"),
    "draft_structure": ((dict,), "the draft as built: parameter name -> '<shape> <dtype>' (the engine's names)"),
    "target_structure": ((dict,), "the target as built, per unit (decoder layer): unit -> '<n> params sha <digest>'"),
    "draft_weights": ((dict,), "checkpoint tensor name -> tensor_fingerprint of the draft's checkpoint, read on the "
                               "load path (tracer/weight_facts.py)"),
    "target_weights": ((dict,), "unit (decoder layer, or module) -> fingerprint of the target checkpoint's tensors "
                                "in it, read on the load path (weight_facts.unit_fingerprints)"),
    "draft_unloaded": (_list, "draft parameters the model built that its checkpoint did not provide: their values "
                              "left as allocated"),
    "target_unloaded": (_list, "target parameters the model built that its checkpoint did not provide"),
}


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
    """
    w = weight.detach()
    if rows is not None:
        w = w[:rows]
    return hashlib.sha256(np.ascontiguousarray(w.float().cpu().numpy()).tobytes()).hexdigest()


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
