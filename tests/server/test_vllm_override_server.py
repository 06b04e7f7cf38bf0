"""A served config override on a real vLLM 0.32.0 CPU server: ``--hf-overrides '{"rms_norm_eps": 0.1}'`` (the
checkpoint's is 1e-6), found as a user would (traced server, ``record train --replay``, ``diff``).

vLLM applies ``hf_overrides`` to the target's ModelConfig (config/model.py:344, applied at :605-619); the
draft's config replaces it with its own override function (config/speculative.py:1084-1106, :1283-1287), so the
draft keeps the checkpoint's eps. The recorder reads the override off the live ModelConfig
(tracer/engines/vllm/live_facts.py ``hf_overrides``); the weights agree, so the pair is one target whose config
differs, named key by key with the option that set it, and the target's first captured layer differs from
position 0 on. Served ``--enforce-eager`` (the load path and the config are the same compiled or not).
"""

from __future__ import annotations

import json

import pytest
from support.bug_server import NEW_TOKENS, diff_both, specdiff
from support.vllm_draft import vllm_draft
from support.vllm_server import NEEDS_VLLM, vllm_server

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.tracer.store import open_trace

pytestmark = [pytest.mark.server, pytest.mark.slow,
              NEEDS_VLLM,
              pytest.mark.skipif(not (REPO_MODELS / "draft" / "config.json").exists(),
                                 reason="the demo models are not built")]


def test_a_vllm_hf_overrides_eps_is_one_target_whose_config_differs(tmp_path, server_env):
    draft = vllm_draft(tmp_path / "draft")
    serve = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread")
    with vllm_server(tmp_path, draft, env, ["--hf-overrides", json.dumps({"rms_norm_eps": 0.1})]) as srv:
        srv.generate(input_ids=demo_prompts(REPO_MODELS, 1), max_new_tokens=NEW_TOKENS)
    c = open_trace(str(serve)).contract
    assert c["target_config_overrides"] == {"rms_norm_eps": {"value": 0.1, "source": "hf_overrides"}}, c
    assert c["draft_config_overrides"] == {} and c["draft_config"]["rms_norm_eps"] == 1e-06  # target-only
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", draft, "--replay", serve,
                   "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    assert c["target_weights_fingerprint"] == open_trace(str(train)).contract["target_weights_fingerprint"]
    proc, report, text = diff_both(train, serve)
    assert proc.returncode == 1, text  # compared, not refused as another model (exit 2)
    first = report["first_divergence"]
    # aux slot 0 is the embeddings (vLLM id 0): the first captured layer is the first the eps changes
    assert (first["tensor"], first["pos"], first["depth"]) == ("target.aux.1", 0, 0), first
    cause = report["explanations"][0]
    assert cause["cause"] == "contract.target_config", cause
    assert "contract target_config.rms_norm_eps: 1e-06 vs 0.1" in cause["evidence"], cause["evidence"]
    # fixed at the option that set it, not in the config file (which holds training's value)
    assert cause["fix"].startswith("set on serving by hf_overrides, not by the config file: serve without the "
                                   "override"), cause["fix"]
    warned = {m["field"]: m for m in report["contract_mismatches"] if m["severity"] == "warn"}
    m = warned["target_config_overrides.rms_norm_eps"]
    assert "serving 0.1 (set by hf_overrides)" in m["message"] and "(acts from target.aux)" in m["message"], m
    assert "draft_config_overrides.rms_norm_eps" not in warned and "draft_config.rms_norm_eps" not in warned
