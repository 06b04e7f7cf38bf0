"""The serving contract, read from vLLM's live objects at start-up (vLLM 0.32.0, V1 model runner).

Read once, after ``GPUModelRunner._setup_eagle3_aux_hidden_state_outputs`` (end of ``load_model``:
the target's aux layers are set, the draft is built, no request has run). Every vLLM name goes
through the adapter; a fact that cannot be read is ``unknown`` (never filled in from a config file
or a default). Besides the common facts (tracer/contract.py) it writes vLLM's own:

- ``engine_runner``: which model runner ran ('v1 vllm.v1.worker.cpu_model_runner.CPUModelRunner');
- ``aux_ids_source``: where the runner took the aux ids from, in the runner's own precedence
  (v1/worker/gpu_model_runner.py:5268-5280): the top-level ``eagle_aux_hidden_state_layer_ids``,
  else ``dflash_config.target_layer_ids`` (+1), overridden by ``eagle_config`` when it is a dict
  holding ids; none of them -> the model's default ``(2, L//2, L-3)`` (interfaces.py:1712-1733,
  logged by vLLM at info level only);
- ``draft_class`` (the class vLLM built for the draft), ``draft_num_aux`` (how many aux states
  its fc takes: llama_eagle3.py:210-216 reads ``num_aux_hidden_states``, else the nested ids'
  count, else 3: a width that disagrees with the captured count crashes the first request);
- ``aux_id_rule`` / ``d2t_rule``: vLLM's conventions in words (id k = HF hidden_states[k],
  ascending, deduplicated; d2t scattered into the full vocab).
"""

from __future__ import annotations

import logging

import torch

from specdiff.eagle3.aux_layers import ConventionError
from specdiff.eagle3.config_ids import config_aux_ids
from specdiff.eagle3.config_keys import KEY_DFLASH, KEY_NESTED, KEY_TOP
from specdiff.tracer.contract import AUX_CONCAT_ORDER, AUX_IDS_DEFAULT_PREFIX, UNKNOWN, sha256_array
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.vllm.adapter import VLLMAdapter, runner_version
from specdiff.tracer.paths import recorded_path
from specdiff.tracer.schema import layer_out_name

logger = logging.getLogger("specdiff.tracer")

AUX_ID_RULE = ("vLLM id k = HF hidden_states[k]: id 0 is the embedding output, id k >= 1 the residual stream "
               "after layer k-1 (model_executor/models/llama.py:429-441, interfaces.py:1601-1611); ids are "
               "deduplicated and sorted (interfaces.py:1577-1578) and concatenated ascending; an id outside "
               "0..L never matches and is dropped")
D2T_RULE = ("draft logits [N, Vd] scattered into the full target vocab at arange(Vd) + d2t, -inf elsewhere "
            "(model_executor/models/llama_eagle3.py:373-395); 'd2t' is renamed draft_id_to_target_id at load (:428-429)")

SOURCE_TOP = "top-level eagle_aux_hidden_state_layer_ids"
SOURCE_NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"
SOURCE_DFLASH = "dflash_config.target_layer_ids (+1)"
SOURCE_DEFAULT = f"{AUX_IDS_DEFAULT_PREFIX} fallback get_eagle3_default_aux_hidden_state_layers (2, L//2, L-3)"


def read_chain(adapter: VLLMAdapter, obj, *keys: str):
    """Follow ``keys`` from ``obj`` through the adapter; MISSING as soon as one step is absent."""
    for key in keys:
        if obj is MISSING or obj is None:
            return MISSING
        obj = adapter.get(obj, key)
    return obj


def aux_ids_source(draft_hf_config, ids) -> str:
    """Which key of the draft config the V1 runner's ids came from, given ``ids``, what
    ``_get_eagle3_aux_layers_from_config()`` returned (None -> the default fallback). The key is
    found by specdiff's one reading of the runner's precedence (``eagle3.config_ids.config_aux_ids``,
    v1/worker/gpu_model_runner.py:5268-5283), the rule ``specdiff check --engine vllm`` applies;
    ``unknown`` when that rule finds no key for ids the runner did return."""
    if not ids:
        return SOURCE_DEFAULT
    raw = {k: getattr(draft_hf_config, k) for k in ("eagle_aux_hidden_state_layer_ids", "eagle_config", "dflash_config")
           if getattr(draft_hf_config, k, None) is not None}
    try:
        key = config_aux_ids("vllm", raw, runner="v1").key
    except ConventionError:
        return UNKNOWN
    return {KEY_TOP: SOURCE_TOP, KEY_NESTED: SOURCE_NESTED, KEY_DFLASH: SOURCE_DFLASH}.get(key, UNKNOWN)


def _cfg(cfg, attr: str, fact: str, what: str):
    if cfg is MISSING or cfg is None:
        return UNKNOWN
    if not hasattr(cfg, attr):
        logger.warning("specdiff: the %s config vLLM loaded has no %s; contract fact %s is unknown", what, attr, fact)
        return UNKNOWN
    return getattr(cfg, attr)


def _aux_holder(model):
    """The module that holds ``aux_hidden_state_layers`` (SupportsEagle3.set_aux_hidden_state_layers,
    interfaces.py:1689-1710: the language model's ``.model``, or the model itself)."""
    parent = model
    if hasattr(model, "get_language_model"):
        parent = model.get_language_model()
    elif hasattr(model, "language_model"):
        parent = model.language_model
    return getattr(parent, "model", parent)


def aux_facts(A: VLLMAdapter, runner, L) -> dict:
    """aux_native_ids / aux_ids_source / aux_hf_indices / aux_dropped_ids / aux_concat_order, live."""
    out: dict = {"aux_convention": "vllm", "aux_id_rule": AUX_ID_RULE}
    dcfg = read_chain(A, runner, "GPUModelRunner.speculative_config")
    dcfg = MISSING if dcfg is MISSING else getattr(getattr(dcfg, "draft_model_config", None), "hf_config", MISSING)
    try:
        ids = runner._get_eagle3_aux_layers_from_config()
    except AttributeError:
        A.mark_missing("GPUModelRunner._get_eagle3_aux_layers_from_config", "the runner has no such method")
        ids = UNKNOWN
    if ids == UNKNOWN:
        out.update(aux_native_ids=UNKNOWN, aux_ids_source=UNKNOWN)
    else:
        out["aux_native_ids"] = None if not ids else [int(i) for i in ids]
        out["aux_ids_source"] = UNKNOWN if dcfg is MISSING else aux_ids_source(dcfg, ids)
    if out.get("aux_ids_source") == SOURCE_DEFAULT:
        logger.warning("specdiff: vLLM took the target's default aux layers (no aux ids in the draft config "
                       "keys the V1 runner reads); vLLM logs this at info level only")
    model = read_chain(A, runner, "GPUModelRunner.model")
    holder = MISSING if model is MISSING else _aux_holder(model)
    layers = MISSING if holder is MISSING else A.get(holder, "EagleModelMixin.aux_hidden_state_layers")
    if layers is MISSING or not isinstance(L, int):
        out.update(aux_hf_indices=UNKNOWN, aux_dropped_ids=UNKNOWN, **{AUX_CONCAT_ORDER: UNKNOWN})
        return out
    layers = [int(i) for i in layers]
    kept = [i for i in layers if 0 <= i <= L]
    out.update(aux_hf_indices=kept, aux_dropped_ids=[i for i in layers if not 0 <= i <= L],
               **{AUX_CONCAT_ORDER: kept})
    return out


#: why the window of a draft whose layers hold one is unknown, and what to do (``unknown_reasons``)
_WINDOW_UNKNOWN = {
    "why": "a draft layer holds a window, and vLLM 0.32.0's CPU backend applies one window per KV-cache group and "
           "none where the group's layers disagree (v1/attention/backends/cpu_attn.py:178-195): what the layer holds "
           "is not what was computed",
    "fix": "compare a windowed draft on SGLang (--speculative-draft-window-size), or serve it on vLLM without "
           "layer_types / sliding_window in its config",
}


def _window_fact(dinner, A: VLLMAdapter) -> tuple:
    """(``draft_attention_window``, why it is unknown or None) where the live draft layers settle it: every
    layer's ``Attention.sliding_window`` None (model_executor/layers/attention/attention.py:339) is full
    attention, certainly. A layer holding a window S (the config's ``layer_types`` / ``sliding_window``,
    model_executor/models/llama.py:185-219) makes the fact UNKNOWN, with ``_WINDOW_UNKNOWN``; a name the
    running vLLM lacks makes it UNKNOWN through the adapter's ``unobservable`` list."""
    layers = read_chain(A, dinner, "LlamaModel.layers")
    if layers is MISSING:
        return UNKNOWN, None
    held = [read_chain(A, layer, "LlamaDecoderLayer.self_attn", "LlamaAttention.attn", "Attention.sliding_window")
            for layer in layers]
    if any(w is MISSING for w in held):
        return UNKNOWN, None
    return ([None] * len(held), None) if held and all(w is None for w in held) else (UNKNOWN, _WINDOW_UNKNOWN)


def _rope_facts(A: VLLMAdapter, dinner) -> dict:
    from specdiff.tracer.contract import rope_scaling_fact

    layers = read_chain(A, dinner, "LlamaModel.layers")
    rot = None
    if layers is not MISSING and len(layers):
        rot = getattr(getattr(layers[0], "self_attn", None), "rotary_emb", None)
    if rot is None:
        return {"rope_theta": UNKNOWN, "rope_style": UNKNOWN, "rope_scaling": UNKNOWN}
    base, neox = getattr(rot, "base", None), getattr(rot, "is_neox_style", None)
    cls = type(rot).__name__
    return {"rope_theta": UNKNOWN if base is None else float(base),
            "rope_style": UNKNOWN if neox is None else ("neox" if neox else "gptj"),
            "rope_scaling": rope_scaling_fact(None) if cls == "RotaryEmbedding" else {"type": f"vllm {cls}"}}


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.data_ptr() == b.data_ptr()


def contract_from_runner(runner, opts: Options, A: VLLMAdapter) -> dict:
    """Contract facts from the live V1 ``GPUModelRunner`` (or ``CPUModelRunner``) after load_model.

    Returns the facts dict (msgpack-safe); ``bos_token_id`` is popped by the recorder.
    """
    from specdiff.tracer.contract import target_identity_facts, tokenizer_hashes, weight_sha256

    facts: dict = {"engine": "vllm", "engine_version": A.version, "capture_level": opts.capture,
                   "logits_topk": int(opts.logits_topk), "dropped_records": 0,
                   "engine_runner": f"{runner_version(runner)} {type(runner).__module__}.{type(runner).__name__}",
                   "d2t_rule": D2T_RULE, "graph_hidden_stages": [] if not getattr(runner, "use_cuda_graph", True)
                   else UNKNOWN}
    A.check_instance(runner, *(n.key for n in A.names if n.kind == "instance" and n.key.startswith("GPUModelRunner.")))
    mc = read_chain(A, runner, "GPUModelRunner.model_config")
    tcfg = MISSING if mc is MISSING else mc.hf_config
    sc = read_chain(A, runner, "GPUModelRunner.speculative_config")
    dmc = MISSING if sc is MISSING or sc is None else sc.draft_model_config
    dcfg = MISSING if dmc is MISSING else dmc.hf_config
    L = _cfg(tcfg, "num_hidden_layers", "num_layers", "target")
    facts.update(num_layers=L, hidden_size=_cfg(tcfg, "hidden_size", "hidden_size", "target"),
                 vocab_size=_cfg(tcfg, "vocab_size", "vocab_size", "target"),
                 draft_hidden_size=_cfg(dcfg, "hidden_size", "draft_hidden_size", "draft"))
    facts["dtype"] = UNKNOWN if mc is MISSING else str(mc.dtype).replace("torch.", "")
    facts["bos_token_id"] = UNKNOWN if tcfg is MISSING else getattr(tcfg, "bos_token_id", None)
    facts["model_name"] = UNKNOWN if mc is MISSING else recorded_path(mc.model)  # local dirs absolute: tracer.paths
    facts["draft_name"] = UNKNOWN if dmc is MISSING else recorded_path(dmc.model)
    k = UNKNOWN if sc is MISSING or sc is None else int(sc.num_speculative_tokens)
    # V1 EAGLE drafts a chain (llm_base_proposer.py:512-775: one token per request and step).
    facts.update(spec_steps=k, spec_topk=1, spec_draft_tokens=k + 1 if isinstance(k, int) else UNKNOWN,
                 spec_algorithm=UNKNOWN if sc is MISSING or sc is None else str(sc.method).upper())
    facts.update(aux_facts(A, runner, L))
    drafter = read_chain(A, runner, "GPUModelRunner.drafter")
    dmodel = read_chain(A, drafter, "SpecDecodeBaseProposer.model")
    if hasattr(dmodel, "unwrap"):
        dmodel = dmodel.unwrap()
    facts["draft_class"] = UNKNOWN if dmodel is MISSING else f"{type(dmodel).__module__}.{type(dmodel).__name__}"
    dinner = read_chain(A, dmodel, "Eagle3LlamaForCausalLM.model")
    for fact, key, conv in (("norm_before_fc", "LlamaModel.norm_before_fc", bool),
                            ("fc_norm", "LlamaModel.fc_norm", lambda v: v is not None),
                            ("norm_output", "LlamaModel.norm_output", bool),
                            ("draft_num_aux", "LlamaModel.num_aux_hidden_states", int)):
        v = read_chain(A, dinner, key)
        facts[fact] = UNKNOWN if v is MISSING else conv(v)
    nbr = _cfg(dcfg, "norm_before_residual", "norm_before_residual", "draft") if hasattr(dcfg, "norm_before_residual") \
        else False  # llama_eagle3.py:97: getattr(config, "norm_before_residual", False)
    facts["norm_before_residual"] = nbr if nbr == UNKNOWN else bool(nbr)
    d2t = read_chain(A, dmodel, "Eagle3LlamaForCausalLM.draft_id_to_target_id")
    if d2t is MISSING:
        facts.update(d2t_sha256=UNKNOWN, hot_token_id_sha256=UNKNOWN, draft_vocab_size=UNKNOWN)
    elif d2t is None:
        facts.update(d2t_sha256=None, hot_token_id_sha256=None,
                     draft_vocab_size=_cfg(dcfg, "draft_vocab_size", "draft_vocab_size", "draft"))
    else:
        d = d2t.detach().to("cpu", torch.int64)
        facts.update(d2t_sha256=sha256_array(d), hot_token_id_sha256=sha256_array(d + torch.arange(d.numel())),
                     draft_vocab_size=int(d.numel()))
    # embedding / lm_head the draft multiplies by; 'target' when it is the target's very tensor
    # (llm_base_proposer.py:1416 _maybe_share_embeddings, :1508 _maybe_share_lm_head).
    tmodel = read_chain(A, runner, "GPUModelRunner.model")
    tinner = MISSING if tmodel is MISSING else getattr(tmodel, "model", MISSING)
    tembed = getattr(getattr(tinner, "embed_tokens", None), "weight", None)
    thead = getattr(getattr(tmodel, "lm_head", None), "weight", None)
    dembed = getattr(read_chain(A, dinner, "LlamaModel.embed_tokens"), "weight", None)
    dhead = getattr(read_chain(A, dmodel, "Eagle3LlamaForCausalLM.lm_head"), "weight", None)
    V, Vd = facts["vocab_size"], facts["draft_vocab_size"]
    facts["embed_sha256"] = weight_sha256(dembed, rows=V) if dembed is not None and isinstance(V, int) else UNKNOWN
    facts["lm_head_sha256"] = weight_sha256(dhead, rows=Vd) if dhead is not None and isinstance(Vd, int) else UNKNOWN
    facts["embed_source"] = UNKNOWN if dembed is None else "target" if _same(dembed, tembed) else "draft"
    facts["lm_head_source"] = UNKNOWN if dhead is None else "target" if _same(dhead, thead) else "draft"
    facts.update(_rope_facts(A, dinner))
    facts["draft_attention_window"], why = _window_fact(dinner, A)
    if why is not None:
        facts["unknown_reasons"] = {"draft_attention_window": why}
    if tmodel is not MISSING and tcfg is not MISSING:
        facts.update(target_identity_facts(tcfg, tembed, architecture=type(tmodel).__name__))
    tok = None if mc is MISSING else getattr(mc, "tokenizer", None)
    import os

    if isinstance(tok, str) and os.path.isdir(tok):
        facts["tokenizer_sha256"], facts["chat_template_sha256"] = tokenizer_hashes(tok)
    else:
        facts["tokenizer_sha256"] = facts["chat_template_sha256"] = UNKNOWN
    facts["depth_coverage"] = ("vLLM V1 drafts depths >= 1 only from the last accepted position of each step "
                               "(llm_base_proposer.py:630-770, one chain per request); every other position has "
                               "depth-0 rows only")
    return facts


def unrecorded_stages(opts: Options, facts: dict) -> dict:
    """tensor -> why this recorder does not observe it on vLLM's V1 runner."""
    out = {"draft.attn_in": "inside the torch.compiled draft LlamaModel.forward (model_executor/models/"
                            "llama_eagle3.py:154 support_torch_compile): module hooks inside it do not fire, and "
                            "the recorder does not wrap compiled code",
           "verify.retrieve_index": "vLLM V1 EAGLE drafts a chain (no tree): the verify order is the draft order",
           "verify.parents": "vLLM V1 EAGLE drafts a chain (no tree): node k's parent is node k-1"}
    if opts.capture != "full":
        out["draft.logits"] = "capture level 'default' records top-k + logsumexp (SPECDIFF_CAPTURE=full for all)"
    # vLLM 0.32.0 builds num_hidden_layers decoder layers from the draft config it holds (llama_eagle3.py:198-208),
    # all inside the compiled LlamaModel: a multi-layer draft's earlier layer outputs are not observable
    cfg = facts.get("draft_config")
    layers = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
    for i in range(int(layers) - 1 if isinstance(layers, int) else 0):
        out[layer_out_name(i)] = out["draft.attn_in"]
    if facts.get("norm_output") is True:
        out["draft.hidden_out"] = ("norm_output: the draft returns the post-norm hidden only (llama_eagle3.py:286); "
                                   "the pre-norm midlayer output is not returned")
    return out
