"""Serving-engine recorders, one subpackage each, behind the boundary of ``base``.

``sglang/``: the SGLang plugin, hooks, live-contract reader and its CPU recipe (``sglang/cpu``).
``vllm/``: the vLLM plugin (V1 model runner), its live-contract reader and CPU launcher (``vllm/cpu.py``).
``writer/``: the trace writers both recorders (and ``record train``) feed.
What an engine is (name, title, tested versions, entry point) is ``specdiff.eagle3.engines``;
importing this package imports no engine.
"""
