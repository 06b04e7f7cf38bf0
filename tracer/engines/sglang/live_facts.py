"""The contract facts SGLang's live objects give whole, read at start-up next to ``contract.contract_from_worker``:

- ``draft_config`` / ``target_config``: every key of the hf_config each ``ModelRunner`` built its model
  with (``ModelConfig.hf_config.to_dict()``: transformers' defaults and SGLang's overrides applied);
- ``engine_options``: every ``ServerArgs`` field as resolved (``ServerArgs.resolved_dict()``, SGLang
  0.5.23 server_args.py:316), and ``engine_options_given``: the raw fields the operator gave (a raw
  ``ServerArgs`` field holds the operator's input: resolution never writes it, server_args.py:231-243),
  each with its default (the msgspec field default);
- ``draft_structure`` / ``target_structure``: the parameters of each model as built;
- ``draft_weights`` / ``target_weights`` / ``draft_unloaded`` / ``target_unloaded``: from the load
  path (``plugin._around_load_weights`` watches ``DefaultModelLoader.load_weights_only``);
- the buffers, rope tables and config overrides of ``state_facts``.

Every fact that cannot be read is ``unknown``, with one warning line.
"""

from __future__ import annotations

import logging

from specdiff.tracer.config_facts import config_fact, given_options, options_fact
from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.reading import read_chain
from specdiff.tracer.engines.sglang.state_facts import state_facts
from specdiff.tracer.weight_facts import layer_input_norms, not_provided, structure, unit_fingerprints

logger = logging.getLogger("specdiff.tracer")

_WEIGHTS = ("weights", "unloaded")


def _config(cfg, what: str):
    if cfg is MISSING:
        return UNKNOWN
    try:
        return config_fact(cfg)
    except Exception as exc:  # noqa: BLE001 - a config SGLang built that to_dict cannot write
        logger.warning("specdiff: the %s config SGLang built cannot be written (%s: %s); contract fact "
                       "%s_config is unknown", what, type(exc).__name__, exc, what)
        return UNKNOWN


def server_options(A: SGLangAdapter, sa) -> dict:
    """``engine_options`` (every field, resolved) and ``engine_options_given`` (the fields the operator
    set: raw value != the field's default) of a live ``ServerArgs``."""
    out = {"engine_options": UNKNOWN, "engine_options_given": UNKNOWN}
    if sa is MISSING:
        return out
    resolved = A.get(sa, "ServerArgs.resolved_dict")
    try:
        out["engine_options"] = options_fact(sa, resolved=None if resolved is MISSING else resolved())
    except Exception as exc:  # noqa: BLE001
        logger.warning("specdiff: SGLang's ServerArgs could not be read (%s: %s); contract fact engine_options "
                       "is unknown", type(exc).__name__, exc)
    try:
        import msgspec

        defaults = {}
        for f in msgspec.structs.fields(type(sa)):
            if f.default is not msgspec.NODEFAULT:
                defaults[f.name] = f.default
            elif f.default_factory is not msgspec.NODEFAULT:
                defaults[f.name] = f.default_factory()
            else:
                defaults[f.name] = None  # a required field (model_path): always given
        out["engine_options_given"] = given_options(sa, defaults)
    except Exception as exc:  # noqa: BLE001 - not a msgspec Struct (another SGLang): which were given is unknown
        logger.warning("specdiff: the ServerArgs defaults could not be read (%s: %s); contract fact "
                       "engine_options_given is unknown", type(exc).__name__, exc)
    return out


def _model_facts(side: str, model, watch, *, per_unit: bool, shared_from=None) -> dict:
    """``<side>_structure`` / ``_weights`` / ``_unloaded`` of one live model and its ``LoadWatch``."""
    out = {f"{side}_{k}": UNKNOWN for k in ("structure", *_WEIGHTS)}
    if model is MISSING or model is None:
        return out
    out[f"{side}_structure"] = structure(model, per_unit=per_unit, rows=getattr(watch, "rows", None))
    if watch is None:
        return out
    fps = dict(watch.fingerprints)
    out[f"{side}_weights"] = unit_fingerprints(fps) if per_unit else fps
    left = getattr(watch, "left", None)
    if left is not None:
        out[f"{side}_unloaded"] = not_provided(left, model, shared_from=shared_from)
    return out


def live_facts(dw, A: SGLangAdapter, loads: dict, *, weights: bool = True) -> dict:
    """The facts of the module doc from a live ``EagleDraftWorker`` and the load watches the plugin
    kept (``loads``: ``id(model)`` -> ``LoadWatch``). ``weights`` False (``SPECDIFF_WEIGHT_FACTS=0``):
    the weight facts are unknown, said once."""
    trunner = read_chain(A, dw, "EagleDraftWorker.target_worker", "TpModelWorker.model_runner")
    drunner = read_chain(A, dw, "EagleDraftWorker.draft_runner")
    tcfg = read_chain(A, trunner, "ModelRunner.model_config", "ModelConfig.hf_config")
    dcfg = read_chain(A, drunner, "ModelRunner.model_config", "ModelConfig.hf_config")
    facts = {"target_config": _config(tcfg, "target"), "draft_config": _config(dcfg, "draft")}
    facts.update(server_options(A, A.get(dw, "EagleDraftWorker.server_args")))
    tmodel = read_chain(A, trunner, "ModelRunner.model")
    dmodel = read_chain(A, drunner, "ModelRunner.model")
    tw = None if tmodel is MISSING else loads.get(id(tmodel))
    dw_ = None if dmodel is MISSING else loads.get(id(dmodel))
    facts.update(_model_facts("target", tmodel, tw, per_unit=True))
    facts.update(_model_facts("draft", dmodel, dw_, per_unit=False,
                              shared_from=None if tmodel is MISSING else tmodel))
    layers = getattr(getattr(dmodel, "model", None), "layers", None)
    # a later draft layer normalises its input with hidden_norm (srt/models/llama_eagle3.py:103-105)
    facts["draft_layer_input_norms"] = UNKNOWN if layers is None else layer_input_norms(layers, "hidden_norm")
    facts.update(state_facts(dw, A))  # buffers, rope tables, config overrides (state_facts.py)
    if not weights:
        logger.info("specdiff: SPECDIFF_WEIGHT_FACTS=0: the checkpoints are not fingerprinted; contract weight "
                    "facts are unknown")
    elif tw is None or dw_ is None:
        logger.warning("specdiff: SGLang loaded the %s without DefaultModelLoader.load_weights_only (another load "
                       "format?); its contract weight facts are unknown",
                       " and ".join(w for w, x in (("target", tw), ("draft", dw_)) if x is None))
    return facts


__all__ = ["live_facts", "server_options"]
