"""`fix --verify` serves the fixed draft and records its training side as the broken pair was: the
server options that change the computation (demo/verify_fix.py ``served_options``) and the training
side's window rule (``training_options``), read from the two contracts."""

from __future__ import annotations

from specdiff.demo.verify_fix import served_options, training_options
from specdiff.tracer.contract import UNKNOWN


def test_only_the_given_options_that_change_the_computation_are_served_again():
    given = {
        "speculative_draft_window_size": {"value": 8, "default": None},
        "enable_fp32_lm_head": {"value": True, "default": False},
        "kv_cache_dtype": {"value": "auto", "default": "auto"},
        "json_model_override_args": {"value": {"rope_theta": 5e5}, "default": "{}"},
        "quantization": {"value": None, "default": None},
        "port": {"value": 30000, "default": 30000},  # not the computation (facts.NOT_COMPARED)
        "attention_backend": {"value": "intel_amx", "default": None},  # the CPU recipe's own, no fact row
    }
    assert served_options({"engine_options_given": given}) == [
        "--enable-fp32-lm-head", "--json-model-override-args", '{"rope_theta": 500000.0}', "--kv-cache-dtype", "auto",
        "--speculative-draft-window-size", "8"]
    assert served_options({"engine_options_given": UNKNOWN}) == [] == served_options({})


def test_the_training_window_is_recorded_again_only_when_it_is_sglangs_rule():
    assert training_options({"draft_attention_window": [{"window": 8, "distance": "kv"}]}) == ["--draft-window", "8"]
    assert training_options({"draft_attention_window": [{"window": 8, "distance": "prefix"}]}) == []
    assert training_options({"draft_attention_window": [None]}) == [] == training_options({})
