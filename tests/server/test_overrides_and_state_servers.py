"""A served config override and state no checkpoint holds, on a real SGLang 0.5.23 CPU server, found as a user
would: the server traced (``SPECDIFF_TRACE``), ``record train --replay``, ``diff``.

- ``--json-model-override-args '{"rms_norm_eps": 0.1}'`` (the checkpoint's is 1e-6): SGLang applies it to the
  target's and the draft's config (srt/utils/hf_transformers/config.py:405-411). The weights agree, so the pair
  is one target with a config difference, named key by key with the option that set it, not "traces of
  different targets"; the target's first captured layer differs from position 0 on.
- the draft's rotary cos/sin cache (non-persistent: no checkpoint holds it) zeroed from position 20 on right
  after the draft loads (bug plugin kind ``draft_rope_rows_zeroed``): the draft differs at depth 0 from
  position 20, and the rope table the recorder read off the live draft names it.
- every rotary's angles negated at the server's first forward, after the recorder read the live models (kind
  ``rope_angles_negated``; target and draft share the object): no recorded fact can see it, the rows can: the
  target's captured layers agree at position 0 of every sequence and nowhere after.

One server per setting: each needs its own trace (one prompt, two where the rows' structure needs two
sequences). The plugin is tests/server/bug_plugins/specdiff_state_bugs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.bug_server import PLUGIN_DIR, diff_both, injected, serve_traced

from specdiff.demo.run import REPO_MODELS
from specdiff.demo.scenarios import write_served_draft
from specdiff.tracer.store import open_trace

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


def _plugin_constant(name: str):
    """A constant of the state bug plugin, read from its file (the server imports it from ``PLUGIN_DIR``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("specdiff_state_bugs", PLUGIN_DIR / "specdiff_state_bugs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


ZEROED_FROM = _plugin_constant("ZEROED_FROM")


@pytest.fixture(scope="module")
def served_draft(tmp_path_factory) -> Path:
    return write_served_draft("correct", REPO_MODELS / "draft", tmp_path_factory.mktemp("draft") / "draft")


def _warned(report: dict) -> dict:
    return {m["field"]: m for m in report["contract_mismatches"] if m["severity"] == "warn"}


def test_a_served_rms_norm_eps_override_is_one_target_whose_config_differs(tmp_path, served_draft, server_env):
    over = ["--json-model-override-args", json.dumps({"rms_norm_eps": 0.1})]
    train, serve = serve_traced(tmp_path, served_draft, server_env, None, prompts=1, repeats=1, extra_args=over)
    c = open_trace(str(serve)).contract
    for side in ("target", "draft"):  # what the recorder read off each live ModelConfig
        assert c[f"{side}_config_overrides"] == {"rms_norm_eps": {"value": 0.1, "source": "json_model_override_args"}}
    assert c["target_weights_fingerprint"] == open_trace(str(train)).contract["target_weights_fingerprint"]
    proc, report, text = diff_both(train, serve)
    assert proc.returncode == 1, text  # compared (not refused as another model: exit 2)
    assert "traces of different targets" not in text + proc.stderr
    first = report["first_divergence"]
    # aux slot 0 is the embeddings (SGLang id -1): the first captured layer is the first the eps changes
    assert (first["tensor"], first["pos"], first["depth"]) == ("target.aux.1", 0, 0), first
    cause = report["explanations"][0]
    assert cause["cause"] == "contract.target_config", cause
    assert "contract target_config.rms_norm_eps: 1e-06 vs 0.1" in cause["evidence"], cause["evidence"]
    # fixed at the option that set it, not in the config file (which holds training's value)
    assert cause["fix"].startswith("set on serving by json_model_override_args, not by the config file: serve without the "
                                   "override"), cause["fix"]
    warned = _warned(report)
    for side, stage in (("target", "target.aux"), ("draft", "draft.hidden_out")):
        m = warned[f"{side}_config_overrides.rms_norm_eps"]
        assert "serving 0.1 (set by json_model_override_args)" in m["message"], m
        assert f"(acts from {stage})" in m["message"], m
    assert "--json-model-override-args" in warned["engine_options.json_model_override_args"]["fix"]
    # the draft's config file holds training's eps: the option set it there too
    assert warned["draft_config.rms_norm_eps"]["fix"].startswith(
        "set on serving by json_model_override_args, not by the config file: serve the draft without the override")


def test_the_drafts_rotary_cache_zeroed_after_load_is_named_by_its_rope_table(tmp_path, served_draft, server_env):
    train, serve = serve_traced(tmp_path, served_draft, server_env, "draft_rope_rows_zeroed", prompts=1, repeats=1)
    assert injected(tmp_path, "draft_rope_rows_zeroed")
    c = open_trace(str(serve)).contract
    assert c["draft_rope_shared"] == {}  # the draft's own rotary now, read as live after load
    cache = "model.layers.0.self_attn.rotary_emb.cos_sin_cache"
    assert c["draft_buffers"][cache] != c["target_buffers"][cache]
    proc, report, text = diff_both(train, serve)
    assert proc.returncode == 1, text
    first = report["first_divergence"]
    # the target's stages and the draft's input all agree; its attention output differs from the first zero row
    assert (first["tensor"], first["pos"], first["depth"]) == ("draft.hidden_out", ZEROED_FROM, 0), first
    assert not any(report["tensors"][n]["diverged"] for n in report["tensors"] if n.startswith("target.aux")), text
    cause = report["explanations"][0]
    assert cause["cause"] == "contract.draft_rope", cause
    assert "draft_rope.layers.0" in cause["message"] and "rotary cos/sin cache as built at load" in cause["fix"]
    m = _warned(report)["draft_rope.layers.0"]
    assert "(acts from draft.hidden_out)" in m["message"] and m["stages"][0] == "draft.hidden_out", m
    assert text.startswith("first divergence: draft.hidden_out at seq 0 pos 20 — draft_rope.layers.0: ")


def test_rope_angles_negated_after_the_recorder_read_them_is_named_by_the_rows_structure(tmp_path, served_draft,
                                                                                        server_env):
    train, serve = serve_traced(tmp_path, served_draft, server_env, "rope_angles_negated", prompts=2, repeats=1)
    assert injected(tmp_path, "rope_angles_negated")
    tc, sc = open_trace(str(train)).contract, open_trace(str(serve)).contract
    assert sc["target_rope"] == tc["target_rope"] and sc["draft_rope"] == tc["draft_rope"]  # read before the bug
    proc, report, text = diff_both(train, serve)
    assert proc.returncode == 1, text
    first = report["first_divergence"]
    assert first["tensor"] == "target.aux.1" and first["pos"] > 0, first  # the embeddings (aux.0) agree
    assert not report["tensors"]["target.aux.0"]["diverged"]
    cause = report["explanations"][0]
    assert cause["cause"] == "position_dependent", cause
    assert cause["message"].startswith("target.aux.1 agrees at position 0 of every sequence and differs from every "
                                       "later position: a position-dependent computation differs"), cause["message"]
    assert cause["evidence"][0].startswith("2 rows at position 0 of every sequence agree; "), cause["evidence"]
    assert "target_rope / draft_rope" in cause["fix"], cause["fix"]
    assert not [f for f in _warned(report) if "rope" in f or "buffers" in f]  # no recorded fact sees it
