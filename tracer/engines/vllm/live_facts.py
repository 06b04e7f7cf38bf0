"""The contract facts vLLM 0.32's live objects give whole (the SGLang recorder's sglang/live_facts.py, for the
V1 runner), read at start-up next to ``contract.contract_from_runner``:

- ``target_config`` / ``draft_config``: ``ModelConfig.hf_config.to_dict()`` of the target and of the
  speculative config's draft model (vLLM converts a speculators config into it);
- ``engine_options``: every field of the runner's ``VllmConfig`` (config/vllm.py:341: model, cache,
  parallel, scheduler, speculative, ... configs), JSON-safe. vLLM keeps no record of which options were
  given, so there is no ``engine_options_given``: against another engine or training they are not compared
  (replay/diff/contract/fact_diff.py says so);
- the structures as built, and the weight facts of the load path: ``plugin`` wraps
  ``DefaultModelLoader.load_weights`` (model_loader/default_loader.py:485), whose weight iterator
  (``get_all_weights``, :367) ``tracer.weight_facts.LoadWatch`` fingerprints;
- every buffer and each decoder layer's rope table of the live models (``tracer.state_facts.engine_state``),
  the config keys ``hf_overrides`` set (``hf_overrides``) and the vocabulary a draft step is fed in.
"""

from __future__ import annotations

import logging

from specdiff.tracer.config_facts import config_fact, json_safe, options_fact
from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.vllm.adapter import VLLMAdapter
from specdiff.tracer.state_facts import engine_state
from specdiff.tracer.weight_facts import (
    LoadWatch,
    layer_input_norms,
    not_provided,
    structure,
    unit_fingerprints,
)

logger = logging.getLogger("specdiff.tracer")


def watched_load(rec, orig, loader, model, model_config, *a, **kw):
    """``DefaultModelLoader.load_weights(loader, model, model_config)`` with its weight iterator
    fingerprinted (``LoadWatch``); the watch is kept on ``rec.loads`` by ``id(model)``. A watch that
    cannot start or finish leaves the load as vLLM does it (the weight facts unknown, one warning)."""
    try:
        watch = LoadWatch(model)
    except Exception as exc:  # noqa: BLE001
        logger.warning("specdiff: the load path of %s is not watched (%s: %s); its weight facts are unknown",
                       type(model).__name__, type(exc).__name__, exc)
        return orig(loader, model, model_config, *a, **kw)
    get_all = loader.get_all_weights
    loader.get_all_weights = lambda *x, **y: watch.wrap(get_all(*x, **y))
    try:
        with watch:
            out = orig(loader, model, model_config, *a, **kw)
    finally:
        del loader.get_all_weights  # the class's method again
    try:
        watch.finish()  # before vLLM's process_weights_after_loading repacks the weights (CPU: to [0])
        rec.loads[id(model)] = watch
    except Exception as exc:  # noqa: BLE001
        logger.warning("specdiff: the parameters %s's loading wrote could not be read (%s: %s)",
                       type(model).__name__, type(exc).__name__, exc)
    return out


def _facts(side: str, model, watch, *, per_unit: bool, shared_from=None) -> dict:
    out = {f"{side}_{k}": UNKNOWN for k in ("structure", "weights", "unloaded")}
    if model is MISSING or model is None:
        return out
    out[f"{side}_structure"] = structure(model, per_unit=per_unit, rows=getattr(watch, "rows", None))
    if watch is not None:
        out[f"{side}_weights"] = unit_fingerprints(watch.fingerprints) if per_unit else dict(watch.fingerprints)
        out[f"{side}_unloaded"] = UNKNOWN if watch.left is None else unloaded(watch.left, model, shared_from)
    return out


def unloaded(left: list[str], model, shared_from=None) -> list[str]:
    """The parameters of ``model`` its loading left as allocated (``left``: ``LoadWatch.finish`` read
    them before vLLM's post-load processing) that still are ``model``'s own, sorted.

    vLLM 0.32.0 hands the draft the target's modules after loading (v1/spec_decode/llm_base_proposer.py
    :1398-1399, e.g. ``del self.model.model.embed_tokens`` then the target's at :1498-1501): a
    parameter that now *is* one of ``shared_from``'s, or shares its storage, is the target's
    (``not_provided``). Before that, on a CPU, post-load processing (model_loader/base_loader.py:109) replaces each
    unquantized linear's weight by ``torch.empty(0)`` once it is packed for the kernel picked
    (layers/linear.py:206-216 -> layers/utils.py:470: AMX sgl-kernel ``weight_packed_linear`` :560-579,
    oneDNN :582-595; torch's linear, the fallback at :603, keeps it). Every
    such emptied weight, the target's included, has storage pointer 0: ``not_provided`` takes no empty
    tensor as shared storage (measured on an AMX Xeon: a draft whose ``layers.1.*`` the checkpoint lacks
    listed only layer 1's three norms before).

    Args:
        left: parameter names ``LoadWatch.unwritten`` gave when the loading ended.
        model: the live model (after vLLM's post-load processing).
        shared_from: the target model, for a draft; None for the target itself.
    """
    return sorted(not_provided(left, model, shared_from=shared_from))


def _config(cfg, what: str):
    if cfg is MISSING or cfg is None:
        return UNKNOWN
    try:
        return config_fact(cfg)
    except Exception as exc:  # noqa: BLE001
        logger.warning("specdiff: the %s config vLLM built cannot be written (%s: %s); contract fact %s_config is "
                       "unknown", what, type(exc).__name__, exc, what)
        return UNKNOWN


def _draft_config(cfg):
    """The draft's config as vLLM built the draft with it: vLLM wraps an EAGLE draft's config in an
    ``EAGLEConfig`` (transformers_utils/configs/eagle.py: ``model`` the inner config, which the keys it
    also has were set on; the outer one keeps the others, e.g. ``eagle_aux_hidden_state_layer_ids``): the
    outer keys, then the inner config's over them, flat like the draft's config.json."""
    inner = getattr(cfg, "model", None)
    outer = _config(cfg, "draft")
    if not callable(getattr(inner, "to_dict", None)) or not isinstance(outer, dict):
        return outer
    merged = {k: v for k, v in outer.items() if k != "model"}
    inner_fact = _config(inner, "draft")
    return {**merged, **inner_fact} if isinstance(inner_fact, dict) else UNKNOWN


def live_facts(runner, A: VLLMAdapter, loads: dict, *, tmodel, dmodel) -> dict:
    """The facts of the module doc from the live V1 runner, its target and draft models (``tmodel`` /
    ``dmodel``, unwrapped) and the load watches the plugin kept (``loads``)."""
    mc = A.get(runner, "GPUModelRunner.model_config")
    sc = A.get(runner, "GPUModelRunner.speculative_config")
    dmc = getattr(sc, "draft_model_config", None) if sc not in (MISSING, None) else None
    facts = {"target_config": _config(getattr(mc, "hf_config", None) if mc is not MISSING else None, "target"),
             "draft_config": _draft_config(getattr(dmc, "hf_config", None))}
    vc = A.get(runner, "GPUModelRunner.vllm_config")
    try:
        facts["engine_options"] = UNKNOWN if vc is MISSING else options_fact(vc)
    except Exception as exc:  # noqa: BLE001
        logger.warning("specdiff: vLLM's VllmConfig could not be read (%s: %s); contract fact engine_options is "
                       "unknown", type(exc).__name__, exc)
        facts["engine_options"] = UNKNOWN
    tw = None if tmodel in (MISSING, None) else loads.get(id(tmodel))
    dw = None if dmodel in (MISSING, None) else loads.get(id(dmodel))
    facts.update(_facts("target", tmodel, tw, per_unit=True))
    facts.update(_facts("draft", dmodel, dw, per_unit=False, shared_from=None if tmodel is MISSING else tmodel))
    layers = getattr(getattr(dmodel, "model", None), "layers", None)
    # a later draft layer normalises its input with input_layernorm (model_executor/models/llama_eagle3.py:136-138)
    facts["draft_layer_input_norms"] = UNKNOWN if layers is None else layer_input_norms(layers, "input_layernorm")
    facts.update(engine_state(None if tmodel is MISSING else tmodel, None if dmodel is MISSING else dmodel))
    facts["target_config_overrides"] = hf_overrides(mc)
    facts["draft_config_overrides"] = hf_overrides(dmc)
    # a draft step is fed the previous step's argmax over the logits compute_logits scattered into the
    # target vocab (model_executor/models/llama_eagle3.py:378-395): target ids
    facts["draft_input_ids_vocab"] = "target"
    return facts


def hf_overrides(mc) -> dict | str:
    """Config key -> ``{"value": as vLLM built the config, "source": "hf_overrides"}`` of one ModelConfig's
    ``hf_overrides`` (config/model.py:344, applied at :605-619) ({} when none); ``unknown`` when the
    config is unreadable or the overrides are a function (what it changed is not listed)."""
    if mc is MISSING or mc is None:
        return UNKNOWN
    over, hf = getattr(mc, "hf_overrides", None), getattr(mc, "hf_config", None)
    if getattr(over, "__qualname__", None) == "SpeculativeConfig.hf_config_override":
        # the draft's: vLLM's own EAGLE config conversion (already in draft_config); an operator's dict
        # --hf-overrides stays target-only (config/speculative.py:1084-1106, :1283-1287)
        return {}
    if not isinstance(over, dict) or hf is None:
        return UNKNOWN
    out = {}
    for key in over:
        value = getattr(hf, key, MISSING)
        out[key] = {"value": UNKNOWN if value is MISSING else json_safe(value), "source": "hf_overrides"}
    return out


__all__ = ["hf_overrides", "live_facts", "unloaded", "watched_load"]
