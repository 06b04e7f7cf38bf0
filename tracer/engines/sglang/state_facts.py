"""SGLang 0.5.23's state facts (tracer/state_facts.py) and config overrides, read off the live target and
draft after loading, next to ``live_facts``:

- ``target_buffers`` / ``draft_buffers``: every registered buffer of each live model (SGLang's rotary
  ``cos_sin_cache`` is registered non-persistent, srt/layers/rotary_embedding/base.py:154: no checkpoint
  holds it, and a loss after loading shows nowhere else);
- ``target_rope`` / ``draft_rope``: each decoder layer's rope table, its rotary's ``cos_sin_cache``
  (``model.layers.{i}.self_attn.rotary_emb``, srt/models/llama.py:199-231 builds it with ``get_rope``);
- ``draft_rope_shared``: draft layers whose rotary is the target's own object (``get_rope`` caches one
  per rope setting, srt/layers/rotary_embedding/factory.py:158-170, :439);
- ``target_config_overrides`` / ``draft_config_overrides``: each config key an engine option set, with
  the value the engine built with and the option: ``json_model_override_args`` (parsed into
  ``ModelConfig.model_override_args``, srt/configs/model_config.py:612, applied by ``get_config`` to the
  hf_config of target and draft alike, srt/utils/hf_transformers/config.py:405-411; the draft's
  ModelConfig is built from the same ServerArgs, srt/managers/tp_worker.py:468-482) and
  ``context_length`` (``ModelConfig.context_len``, model_config.py:1291-1325);
- ``draft_input_ids_vocab``: ``"target"``: a draft step is fed its previous step's top-k after the
  ``hot_token_id`` map (srt/speculative/eagle_worker_v2.py:757-758, :897-898), target ids.

Every fact that cannot be read is ``unknown``.
"""

from __future__ import annotations

from specdiff.tracer.config_facts import json_safe
from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.reading import read_chain
from specdiff.tracer.state_facts import engine_state

__all__ = ["config_overrides", "state_facts"]


def config_overrides(A: SGLangAdapter, runner, sa) -> dict | str:
    """Config key -> ``{"value": as the engine built with, "source": the ServerArgs option}`` for one
    ``ModelRunner``'s model config ({} when no option overrode a key); ``unknown`` when unreadable.
    ``context_len`` (not a config key: SGLang's context length) is listed when ``--context-length`` gave it."""
    mc = read_chain(A, runner, "ModelRunner.model_config")
    if mc is MISSING:
        return UNKNOWN
    args = A.get(mc, "ModelConfig.model_override_args")
    hf = A.get(mc, "ModelConfig.hf_config")
    if args is MISSING or hf is MISSING or not isinstance(args, dict):
        return UNKNOWN
    out = {}
    for key in args:
        value = getattr(hf, key, MISSING)
        if value is MISSING and hasattr(hf, "to_dict"):
            value = hf.to_dict().get(key, MISSING)
        out[key] = {"value": UNKNOWN if value is MISSING else json_safe(value), "source": "json_model_override_args"}
    given = MISSING if sa is MISSING else A.get(sa, "ServerArgs.context_length")
    if given is MISSING:
        out["context_len"] = UNKNOWN
    elif isinstance(given, int) and not isinstance(given, bool):
        length = A.get(mc, "ModelConfig.context_len")
        out["context_len"] = {"value": UNKNOWN if length is MISSING else int(length), "source": "context_length"}
    return out


def state_facts(dw, A: SGLangAdapter) -> dict:
    """The facts of the module doc from a live ``EagleDraftWorker`` (after loading)."""
    trunner = read_chain(A, dw, "EagleDraftWorker.target_worker", "TpModelWorker.model_runner")
    drunner = read_chain(A, dw, "EagleDraftWorker.draft_runner")
    tmodel = read_chain(A, trunner, "ModelRunner.model")
    dmodel = read_chain(A, drunner, "ModelRunner.model")
    sa = A.get(dw, "EagleDraftWorker.server_args")
    facts = engine_state(None if tmodel is MISSING else tmodel, None if dmodel is MISSING else dmodel)
    facts["target_config_overrides"] = config_overrides(A, trunner, sa)
    facts["draft_config_overrides"] = config_overrides(A, drunner, sa)
    facts["draft_input_ids_vocab"] = "target"
    return facts
