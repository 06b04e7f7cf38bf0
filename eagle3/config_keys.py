"""Where each serving engine reads the aux ids in a draft config.json: the keys, their precedence per
engine and model runner, and what an engine does when none holds ids. Plain data, keyed by engine
name; ``config_ids.config_aux_ids`` applies it to a config.
"""

from __future__ import annotations

#: Every draft-config key some engine or runner reads aux ids from, as explanations name it
#: ('top-level X' = config.json's own key X; 'a.b' = key b of the nested dict a).
KEY_TOP = "top-level eagle_aux_hidden_state_layer_ids"
KEY_NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"
KEY_DFLASH = "dflash_config.target_layer_ids"
KEY_DSPARK = "top-level dspark_target_layer_ids"
KEY_TARGET_IDS = "top-level target_layer_ids"
KEY_DFLASH_LAYERS = "dflash_config.layer_ids"
KEY_EAGLE_LAYERS = "eagle_config.layer_ids"
ID_KEYS = (KEY_TOP, KEY_NESTED, KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS, KEY_DFLASH_LAYERS, KEY_EAGLE_LAYERS)
#: keys whose ids the engine shifts by +1 before use (DFlash / DSpark number "capture after layer i")
PLUS_ONE_KEYS = (KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS)

#: engine -> its model runners whose key precedence differs, the one specdiff's recorder was verified on
#: first (vLLM 0.32.0: V1 on the CPU build, which has no Triton; V2 is the GPU default,
#: config/vllm.py:722-738 ``use_v2_model_runner``)
ENGINE_RUNNERS: dict[str, tuple[str | None, ...]] = {"sglang": (None,), "vllm": ("v1", "v2")}

#: (engine, runner) -> the keys it reads aux ids from, in precedence (first holding ids wins), and the
#: source of the rule. Nothing holding ids -> the engine's default layers (``aux_layers.default_hf_indices``).
ENGINE_ID_KEYS: dict[tuple[str, str | None], tuple[str, ...]] = {
    # srt/model_executor/model_runner_components/spec_aux_hidden_state.py:188-196:
    # eagle_config["eagle_aux_hidden_state_layer_ids"] as given (even []); any exception -> None (default)
    ("sglang", None): (KEY_NESTED,),
    # vllm/v1/worker/gpu_model_runner.py:5268-5283 _get_eagle3_aux_layers_from_config: the top-level key when
    # non-empty; else dflash_config.target_layer_ids (+1), replaced by eagle_config's ids whenever
    # eagle_config is a non-empty dict (even one without them: then no ids, the default)
    ("vllm", "v1"): (KEY_TOP, KEY_NESTED, KEY_DFLASH),
    # vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:100-137 get_eagle3_aux_layers_from_config: never
    # reads eagle_config.eagle_aux_hidden_state_layer_ids; logs its fallback at info level (:25-30)
    ("vllm", "v2"): (KEY_TOP, KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS, KEY_DFLASH_LAYERS, KEY_EAGLE_LAYERS),
}
ENGINE_ID_SOURCES = {
    ("sglang", None): "SGLang 0.5.23 srt/model_executor/model_runner_components/spec_aux_hidden_state.py:188-196",
    ("vllm", "v1"): "vLLM 0.32.0 v1/worker/gpu_model_runner.py:5268-5283 (V1 runner)",
    ("vllm", "v2"): "vLLM 0.32.0 v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:100-137 (V2 runner)",
}
#: what each engine does when no key it reads holds ids (sources in ``aux_layers.RULES``)
ENGINE_FALLBACK = {
    ("sglang", None): "SGLang captures its default (set_eagle3_layers_to_capture(None), srt/models/llama.py:929-941)",
    ("vllm", "v1"): ("vLLM V1 falls back to get_eagle3_default_aux_hidden_state_layers (interfaces.py:1712-1733) "
                     "and logs nothing (gpu_model_runner.py:5241-5247)"),
    ("vllm", "v2"): ("vLLM V2 falls back to get_eagle3_default_aux_hidden_state_layers (interfaces.py:1712-1733), "
                     "logged at info level only (eagle3_utils.py:25-30)"),
}


def config_value(raw: dict, key: str):
    """The value of one of ``ID_KEYS`` in a draft config.json dict (None when absent)."""
    path = key.removeprefix("top-level ").split(".")
    v = raw
    for p in path:
        if not isinstance(v, dict):
            return None
        v = v.get(p)
    return v


def set_config_value(raw: dict, key: str, value) -> None:
    """Write ``value`` at one of ``ID_KEYS`` in a draft config.json dict (nested dicts made as
    needed); ``value`` None removes the key."""
    *parents, last = key.removeprefix("top-level ").split(".")
    d = raw
    for p in parents:
        if not isinstance(d.get(p), dict):
            if value is None:
                return
            d[p] = {}
        d = d[p]
    if value is None:
        d.pop(last, None)
    else:
        d[last] = value
