"""The serving contract, read from SGLang's live objects at start-up (SGLang 0.5.23, worker v2).

Every fact is read through the adapter (``adapter``); a fact that cannot be read is
recorded as ``unknown`` with the reason, never filled in from a config file or a default.
Beside it: ``reading`` (``read_chain``, ``target_language_model``), ``weight_facts`` (the draft's
embedding and lm_head), ``rope_facts`` (its rotary embedding).
"""

from __future__ import annotations

import logging
import multiprocessing

import torch

from specdiff.eagle3.attention_window import KV
from specdiff.tracer.contract import AUX_CONCAT_ORDER, UNKNOWN
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.draft_stages import graph_hidden
from specdiff.tracer.engines.sglang.reading import read_chain, target_language_model
from specdiff.tracer.engines.sglang.rope_facts import rope_facts
from specdiff.tracer.engines.sglang.weight_facts import weights_facts
from specdiff.tracer.paths import recorded_path

logger = logging.getLogger("specdiff.tracer")


# ---- contract -------------------------------------------------------------------------------
def _cfg(cfg, attr: str, fact: str, what: str):
    """A Hugging Face config attribute the engine built its model from, or UNKNOWN (one warning)."""
    if cfg is MISSING:
        return UNKNOWN
    if not hasattr(cfg, attr):
        logger.warning("specdiff: the %s config SGLang loaded has no %s; contract fact %s is unknown",
                       what, attr, fact)
        return UNKNOWN
    return getattr(cfg, attr)


def hot_token_id(dw, adapter: SGLangAdapter):
    """The draft->target id map SGLang applies (int64 [Vd] on the host), None (identity: no d2t),
    or MISSING (SGLang has no name for it here; logged by the adapter).

    SGLang 0.5.23 llama_eagle3.py:350-352: ``hot_token_id = d2t + arange``; copied to the draft
    worker by ``EagleDraftWorker.init_lm_head``. Read once at startup, never on the hot path.
    """
    hot = read_chain(adapter, dw, "EagleDraftWorker.hot_token_id")
    if hot is None:  # the worker's copy is made in init_lm_head; the model holds the loaded one
        hot = read_chain(adapter, dw, "EagleDraftWorker.draft_runner", "ModelRunner.model",
                     "LlamaForCausalLMEagle3.hot_token_id")
    if hot is None or hot is MISSING:
        return hot
    return hot.detach().to("cpu", torch.int64)


def _configured_aux_ids(dcfg):
    """The draft's ``eagle_config.eagle_aux_hidden_state_layer_ids`` as SGLang reads it (a list or
    None: llama_eagle3.py:169 ``getattr(config, "eagle_config", None) or {}``), or UNKNOWN."""
    if dcfg is MISSING:
        return UNKNOWN
    eagle_config = getattr(dcfg, "eagle_config", None)
    if isinstance(eagle_config, str):
        return UNKNOWN
    ids = dict(eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else [int(i) for i in ids]


def aux_capture_facts(adapter: SGLangAdapter, dw) -> dict:
    """``aux_hf_indices`` / ``aux_dropped_ids`` / ``aux_concat_order`` as the target really captures.

    Read from the live ``layers_to_capture`` of the model that holds it (``target_language_model``:
    wrappers followed) and its layer range, never derived from the configured ids through a rule.
    In every family SGLang 0.5.23 serves EAGLE-3 on, layer i in ``layers_to_capture`` captures its
    input (HF hidden_states[i]) when it runs, ``start_layer <= i < end_layer``; GPT-OSS also
    captures index ``end_layer`` at the final norm (``TargetLayout.final_capture``, gpt_oss.py:731):
    the last layer's output *before* the norm, which HF's hidden_states[L] (after the norm) is not;
    it keeps its place L in ``aux_hf_indices`` (the slot arrives) and is listed in
    ``aux_prenorm_indices``. Captures are appended in the layer loop: the concat is ascending. An
    index never reached is dropped silently by SGLang: ``aux_dropped_ids`` names the configured id
    it came from (every family's set_eagle3_layers_to_capture maps the ids one by one, in order),
    UNKNOWN when the ids cannot be paired. ``capture_aux_hidden_states`` off: the draft gets no aux states.
    ``layers_to_capture`` is set by the target's ``ModelRunner.init_attention_backends``
    (model_runner.py:1105), after ``alloc_memory_pool``: read it from ``_capture_cuda_graphs`` on.
    """
    A = adapter
    unknown = {"aux_hf_indices": UNKNOWN, "aux_dropped_ids": UNKNOWN, AUX_CONCAT_ORDER: UNKNOWN,
               "aux_prenorm_indices": UNKNOWN}
    tmodel = read_chain(A, dw, "EagleDraftWorker.target_worker", "TpModelWorker.model_runner", "ModelRunner.model")
    lm, lay, _via, _ = target_language_model(A, tmodel)
    on = read_chain(A, lm, lay.key("capture_aux_hidden_states"))
    inner = read_chain(A, lm, lay.key("model"))
    ltc, start, end = (read_chain(A, inner, lay.key(a)) for a in ("layers_to_capture", "start_layer", "end_layer"))
    if any(v is MISSING for v in (on, ltc, start, end)):
        return unknown
    raw = [int(i) for i in ltc] if on else []  # capture off: the draft gets the final hidden only

    def reached(i: int) -> bool:
        return start <= i < end or (lay.final_capture is not None and i == end)

    captured = sorted({i for i in raw if reached(i)})
    unreached = [k for k, i in enumerate(raw) if not reached(i)]
    dropped = []
    if unreached:
        ids = _configured_aux_ids(read_chain(A, dw, "EagleDraftWorker.draft_runner", "ModelRunner.model_config",
                                             "ModelConfig.hf_config"))
        dropped = [ids[k] for k in unreached] if isinstance(ids, list) and len(ids) == len(raw) else UNKNOWN
    # GPT-OSS's index end_layer is the last layer's output before the final norm: no HF index holds it
    prenorm = [i for i in captured if lay.final_capture is not None and i == end]
    return {"aux_hf_indices": captured, "aux_dropped_ids": dropped, "aux_prenorm_indices": prenorm,
            AUX_CONCAT_ORDER: list(captured)}  # slot j of the concat = HF captured[j]


def capture_rule(lm, tmodel, via) -> str:
    """``aux_capture_rule``: the ``set_eagle3_layers_to_capture`` SGLang ran on this target, found on
    the live class (MRO) of the language model, else of the wrapper: ``"sglang srt/models/<file>.py:
    <line> <Class>.set_eagle3_layers_to_capture"`` plus ``" via <Wrapper>.language_model"``;
    ``"none"`` when neither defines it (SGLang refuses EAGLE-3 then, attention_backend_setup.py:55)."""
    import inspect

    for obj in (lm, tmodel):
        if obj is MISSING or obj is None:
            continue
        for klass in type(obj).__mro__:
            fn = vars(klass).get("set_eagle3_layers_to_capture")
            if fn is None:
                continue
            path = klass.__module__.removeprefix("sglang.").replace(".", "/") + ".py"
            try:
                path += f":{inspect.getsourcelines(fn)[1]}"
            except (OSError, TypeError):  # no source on disk: the file alone still names the rule
                pass
            hops = f" via {', '.join(via)}" if via and obj is lm else ""
            return f"sglang {path} {klass.__name__}.set_eagle3_layers_to_capture{hops}"
    return "none"


def target_identity_facts(A: SGLangAdapter, target_runner, tcfg) -> dict:
    """target_architecture, target_config_sha256, target_num_experts / target_experts_per_token,
    aux_capture_rule and target_weights_fingerprint, read from the live target (tracer/contract.py
    defines each; ``tracer.contract.target_identity_facts`` computes the same on the training side).

    The architecture is the class SGLang instantiated; MoE routing comes from the config the
    language model was built with (a wrapper's inner one); the fingerprint from the embedding the
    target's get_embed_and_head returns (UNKNOWN on a tensor-parallel shard, one warning).
    """
    from specdiff.tracer.contract import config_sha256, moe_routing_facts, weights_fingerprint

    tmodel = read_chain(A, target_runner, "ModelRunner.model")
    lm, lay, via, declared = target_language_model(A, tmodel)
    out = {"target_architecture": UNKNOWN if tmodel is MISSING else type(tmodel).__name__,
           "target_config_sha256": UNKNOWN if tcfg is MISSING else config_sha256(tcfg)}
    cfg = read_chain(A, lm, lay.key("config"))
    if cfg is MISSING or not declared:
        out.update(target_num_experts=UNKNOWN, target_experts_per_token=UNKNOWN)
    else:
        routing = moe_routing_facts(cfg, type(lm).__name__)
        for fact, value in routing.items():
            if value == UNKNOWN:
                logger.warning("specdiff: the target config SGLang loaded for %s has no %s; contract fact %s "
                               "is unknown", type(lm).__name__, fact, fact)
        out.update(routing)
    out["aux_capture_rule"] = UNKNOWN if tmodel is MISSING else capture_rule(lm, tmodel, via)
    embed = read_chain(A, lm, lay.key("model"), lay.key("embed_tokens"), "VocabParallelEmbedding.weight")
    vocab = getattr(cfg, "vocab_size", None) if cfg is not MISSING else None
    if embed is MISSING or not isinstance(vocab, int):
        out["target_weights_fingerprint"] = UNKNOWN
    elif embed.shape[0] < vocab:
        logger.warning("specdiff: the target's embedding holds %d of %d rows on this rank (tensor parallel); "
                       "contract fact target_weights_fingerprint is unknown", embed.shape[0], vocab)
        out["target_weights_fingerprint"] = UNKNOWN
    else:
        out["target_weights_fingerprint"] = weights_fingerprint(embed, vocab)
    return out


#: tensors SGLang's prefill draft extend produces for each request's last prompt row only
PREFILL_LAST_ONLY = ("draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp",
                     "draft.topk", "draft.topk_target")


def unrecorded_stages(dw, adapter: SGLangAdapter, missing: dict, *, with_graphs: bool = True,
                      layer_outs=()) -> dict:
    """Tensor -> why the recorder cannot observe (some of) its rows: a midlayer module SGLang's
    draft lacks (``missing``, from ``DraftStageTaps.attach``), a CUDA graph replay, and the logits
    a prefill draft extend prunes to each request's last row (capture LAST).

    ``layer_outs``: the later layers' ``draft.layer_out.{i}`` the hooks record (a graph hides them too).
    ``with_graphs=False`` at start-up: the draft's graph runners exist only after
    ``_capture_cuda_graphs`` (``Recorder.refresh`` adds them), and reading them earlier would
    report them as missing SGLang names."""
    out = dict(missing)
    if with_graphs:
        graph = read_chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner")
        graph_extend = read_chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner_for_draft_extend")
        for name, why in graph_hidden(draft_decode_graph=graph not in (None, MISSING),
                                      draft_extend_graph=graph_extend not in (None, MISSING),
                                      layer_outs=layer_outs).items():
            out[name] = f"{out[name]}; {why}" if name in out else why
    why = ("a prefill draft extend keeps logits only for each request's last prompt row (SGLang "
           "eagle_worker_v2.py _draft_extend_for_prefill, capture LAST): earlier prompt positions "
           "have no draft logits / top-k on serving")
    for name in PREFILL_LAST_ONLY:
        out[name] = f"{out[name]}; {why}" if name in out else why
    return out


def graph_hidden_stages(dw, adapter: SGLangAdapter):
    """Stages the draft's captured CUDA graphs hide from the recorder (sorted), or UNKNOWN.

    Target graphs return their outputs, so nothing the recorder reads from the target is hidden.
    """
    graph = read_chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner")
    graph_extend = read_chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner_for_draft_extend")
    if MISSING in (graph, graph_extend):
        return UNKNOWN
    hidden = []
    if graph is not None:
        hidden += ["tokens", "draft.hidden_out", "draft.logits", "draft.topk", "draft.topk_target"]
    if graph_extend is not None:
        hidden += ["draft.fc_out", "draft.hidden_out", "draft.logits", "draft.topk"]
    return sorted(set(hidden))


def _window_fact(A: SGLangAdapter, dinner):
    """``draft_attention_window`` as each live draft layer's attention holds it
    (``RadixAttention.sliding_window_size``: -1 none, else the farthest key distance seen, counted over the
    KV sequence: eagle3/attention_window.py ``KV``); UNKNOWN where a layer cannot be read."""
    layers = read_chain(A, dinner, "Eagle3LlamaModel.layers")
    if layers is MISSING:
        return UNKNOWN
    out = []
    for layer in layers:
        w = read_chain(A, layer, "LlamaDecoderLayer.self_attn", "LlamaAttention.attn", "RadixAttention.sliding_window_size")
        if w is MISSING:
            return UNKNOWN
        out.append(None if w is None or int(w) < 0 else {"window": int(w), "distance": KV})
    return out


def serving_config(adapter: SGLangAdapter):
    """SGLang's resolved serving config (``runtime_context.get_serving()``), or MISSING."""
    try:
        from sglang.srt import runtime_context

        return runtime_context.get_serving()
    except Exception as exc:  # noqa: BLE001 - an SGLang without it: the facts it feeds are unknown
        adapter.mark_missing("runtime_context.get_serving", f"{type(exc).__name__}: {exc}")
        return MISSING


def _tokenizer_facts(A: SGLangAdapter, serving) -> dict:
    """tokenizer / chat-template hashes of what SGLang's tokenizer process loads.

    Tokenizing happens in SGLang's main process, which the recorder (scheduler) does not see:
    the facts are the files at the resolved tokenizer path; a ``--chat-template`` override makes the
    template hash unknown (one warning) rather than the file's.
    """
    import os

    from specdiff.tracer.contract import tokenizer_hashes

    path = read_chain(A, serving, "serving.tokenizer_path")
    override = read_chain(A, serving, "serving.chat_template")
    if path is MISSING or not isinstance(path, str) or not os.path.isdir(path):
        if path is not MISSING:
            logger.warning("specdiff: tokenizer %r is not a local directory; contract facts tokenizer_sha256 "
                           "and chat_template_sha256 are unknown", path)
        return {"tokenizer_sha256": UNKNOWN, "chat_template_sha256": UNKNOWN}
    tok, tmpl = tokenizer_hashes(path)
    if override is MISSING or override:
        if override:
            logger.warning("specdiff: --chat-template %s is applied in SGLang's tokenizer process, which the "
                           "recorder does not see; contract fact chat_template_sha256 is unknown", override)
        tmpl = UNKNOWN
    return {"tokenizer_sha256": tok, "chat_template_sha256": tmpl}


def contract_from_worker(dw, opts: Options, adapter: SGLangAdapter, *, serving=None) -> dict:
    """Contract facts from a live ``EagleDraftWorker`` (called once, at start-up).

    ``serving``: SGLang's resolved serving config (default ``serving_config(adapter)``).

    Every fact is read from the engine's objects through the adapter; one it cannot read is
    ``UNKNOWN`` and the missing SGLang names are listed in ``unobservable`` (never filled in
    from a config file or a default).
    """
    from specdiff.tracer.contract import sha256_array

    A = adapter
    facts: dict = {"engine": "sglang", "engine_version": A.version, "capture_level": opts.capture,
                   "logits_topk": int(opts.logits_topk), "dropped_records": 0,
                   "engine_process_start": multiprocessing.get_start_method(allow_none=True) or UNKNOWN}
    # The CUDA graph runners exist only once _capture_cuda_graphs ran (after this): checked there.
    A.check_instance(dw, *(n.key for n in A.names if n.kind == "instance" and n.key.startswith("EagleDraftWorker.")
                           and "cuda_graph" not in n.key))
    target_runner = read_chain(A, dw, "EagleDraftWorker.target_worker", "TpModelWorker.model_runner")
    draft_runner = read_chain(A, dw, "EagleDraftWorker.draft_runner")
    tmc = read_chain(A, target_runner, "ModelRunner.model_config")
    tcfg = read_chain(A, tmc, "ModelConfig.hf_config")
    dcfg = read_chain(A, draft_runner, "ModelRunner.model_config", "ModelConfig.hf_config")
    L = _cfg(tcfg, "num_hidden_layers", "num_layers", "target")
    facts.update(num_layers=L, hidden_size=_cfg(tcfg, "hidden_size", "hidden_size", "target"),
                 vocab_size=_cfg(tcfg, "vocab_size", "vocab_size", "target"),
                 draft_hidden_size=_cfg(dcfg, "hidden_size", "draft_hidden_size", "draft"))
    dtype = read_chain(A, tmc, "ModelConfig.dtype")
    facts["dtype"] = UNKNOWN if dtype is MISSING else str(dtype).replace("torch.", "")
    # BOS id of the target config SGLang loaded: Recorder.close turns it into bos_added.
    facts["bos_token_id"] = getattr(tcfg, "bos_token_id", None) if tcfg is not MISSING else UNKNOWN
    # The ids as configured (SGLang reads them from the draft's hf_config.eagle_config) ...
    # No eagle_config attribute means "no ids" to SGLang too (llama_eagle3.py:169: getattr(config,
    # "eagle_config", None) or {}), so None is the fact here, not a fallback.
    # Kept as configured: what the target makes of them is its family's rule, read live below.
    facts.update(aux_native_ids=_configured_aux_ids(dcfg), aux_convention="sglang")
    # ... and what the target really captures (never the configured ids in its place): SGLang sets
    # it after this point (init_attention_backends); Recorder.refresh fills it in.
    facts.update({"aux_hf_indices": UNKNOWN, "aux_dropped_ids": UNKNOWN, AUX_CONCAT_ORDER: UNKNOWN,
                  "aux_prenorm_indices": UNKNOWN})
    dmodel = read_chain(A, draft_runner, "ModelRunner.model")
    dinner = read_chain(A, dmodel, "LlamaForCausalLMEagle3.model")
    nbf = read_chain(A, dinner, "Eagle3LlamaModel.norm_before_fc")
    facts["norm_before_fc"] = UNKNOWN if nbf is MISSING else bool(nbf)
    fcn = read_chain(A, dinner, "Eagle3LlamaModel.fc_norm")
    facts["fc_norm"] = UNKNOWN if fcn is MISSING else fcn is not None
    hot = hot_token_id(dw, A)
    if hot is MISSING:
        facts.update(hot_token_id_sha256=UNKNOWN, d2t_sha256=UNKNOWN, draft_vocab_size=UNKNOWN)
    elif hot is not None:
        facts["hot_token_id_sha256"] = sha256_array(hot)
        facts["d2t_sha256"] = sha256_array(hot - torch.arange(hot.numel(), dtype=torch.int64))
        facts["draft_vocab_size"] = int(hot.numel())
    else:
        facts["hot_token_id_sha256"] = None
        facts["d2t_sha256"] = None
        facts["draft_vocab_size"] = _cfg(dcfg, "draft_vocab_size", "draft_vocab_size", "draft")
        if facts["draft_vocab_size"] is None:  # SGLang sets it to vocab_size when absent (llama_eagle3.py:306)
            facts["draft_vocab_size"] = _cfg(dcfg, "vocab_size", "draft_vocab_size", "draft")
    for fact, key in (("spec_steps", "EagleDraftWorker.speculative_num_steps"), ("spec_topk", "EagleDraftWorker.topk"),
                      ("spec_draft_tokens", "EagleDraftWorker.speculative_num_draft_tokens")):
        facts[fact] = A.fact(dw, key, int)
    sa = A.get(dw, "EagleDraftWorker.server_args")
    # a local directory absolute (the server's working directory resolves it), a hub id as given: tracer.paths
    facts["model_name"] = UNKNOWN if sa is MISSING else A.fact(sa, "ServerArgs.model_path", recorded_path)
    facts["draft_name"] = UNKNOWN if sa is MISSING else A.fact(
        sa, "ServerArgs.speculative_draft_model_path", recorded_path)
    # Set after EagleDraftWorker._capture_cuda_graphs (start-up, before any request); unknown until then.
    facts["graph_hidden_stages"] = UNKNOWN
    algo = read_chain(A, dw, "EagleDraftWorker.speculative_algorithm")
    facts["spec_algorithm"] = UNKNOWN if algo is MISSING else str(getattr(algo, "name", algo))
    nout = read_chain(A, dinner, "Eagle3LlamaModel.norm_output")
    facts["norm_output"] = UNKNOWN if nout is MISSING else bool(nout)
    facts.update(target_identity_facts(A, target_runner, tcfg))
    facts.update(weights_facts(A, target_runner=target_runner, dmodel=dmodel, dinner=dinner,
                               vocab=facts["vocab_size"], draft_vocab=facts["draft_vocab_size"]))
    facts.update(rope_facts(A, dinner))
    facts["draft_attention_window"] = _window_fact(A, dinner)
    facts.update(_tokenizer_facts(A, serving_config(A) if serving is None else serving))
    facts["depth_coverage"] = ("SGLang drafts depths >= 1 only from the last accepted position of each decode "
                               "step (t = L-1, eagle_worker_v2.py draft); every other position has depth-0 "
                               "rows only")
    facts["unobservable"] = A.unobservable()
    return facts


