"""Serving-engine recorders, one subpackage each, behind the boundary of ``base``.

``sglang/``: the SGLang plugin, hooks, live-contract reader and its CPU recipe (``sglang/cpu``).
``vllm/``: the vLLM plugin (V1 model runner), its live-contract reader and CPU launcher (``vllm/cpu.py``).
Importing this package only registers each engine's ``EngineSpec``; it imports no engine.
"""

from specdiff.eagle3.aux_layers import ENGINE_ID_KEYS
from specdiff.tracer.engines.base import EngineSpec, engine_names, engine_spec, register

SGLANG = register(EngineSpec(
    name="sglang", title="SGLang", plugin_group="sglang.srt.plugins",
    plugin="specdiff.tracer.engines.sglang.plugin:load",
    aux_convention="sglang", aux_concat="ascending",
    tested_range=("0.5.19", "0.5.23"),  # = sglang.adapter.TESTED_RANGE (tests/test_architecture.py)
    cpu_launcher="specdiff.tracer.engines.sglang.cpu.launch",
    # srt/model_executor/model_runner_components/spec_aux_hidden_state.py:188-196 (only the nested key)
    aux_ids_key="eagle_config.eagle_aux_hidden_state_layer_ids",
    aux_ids_read=ENGINE_ID_KEYS[("sglang", None)],
    aux_id_words="SGLang id k captures HF k+1",
    serve_args_hint="at least --model-path and --speculative-draft-model-path",
))

VLLM = register(EngineSpec(
    name="vllm", title="vLLM", plugin_group="vllm.general_plugins",
    plugin="specdiff.tracer.engines.vllm.plugin:load",
    aux_convention="vllm", aux_concat="ascending",  # interfaces.py:1577-1578 sorted(set(layers))
    tested_range=("0.32.0", "0.32.0"),  # = vllm.adapter.TESTED_RANGE (tests/test_vllm_recorder.py)
    cpu_launcher="specdiff.tracer.engines.vllm.cpu",
    # V1 runner, v1/worker/gpu_model_runner.py:5268-5280: the top-level key; if empty, eagle_config's
    # nested ids, else dflash_config's (+1). V2's eagle3_utils reads no nested eagle ids.
    aux_ids_key="top-level eagle_aux_hidden_state_layer_ids",
    aux_ids_read=ENGINE_ID_KEYS[("vllm", "v1")], runners=("v1", "v2"),
    aux_id_words="vLLM id k = HF k",
    serve_args_hint="the target model first and --speculative-config",
))

__all__ = ["SGLANG", "VLLM", "EngineSpec", "engine_names", "engine_spec", "register"]
