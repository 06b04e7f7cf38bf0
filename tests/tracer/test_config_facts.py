"""Whole configs and option objects as contract facts (tracer/config_facts.py): every key kept, JSON-safe,
nothing that differs between two runs of one setting (a memory address), and the options an operator gave
told from the defaults."""

from __future__ import annotations

import dataclasses
import enum
import json

import msgspec
import torch
from transformers import LlamaConfig

from specdiff.tracer.config_facts import config_fact, given_options, json_safe, options_fact
from specdiff.tracer.contract import validate_contract


class Mode(enum.Enum):
    EXTEND = 1


class Args(msgspec.Struct):
    """A stand-in for SGLang 0.5.23's ServerArgs (a msgspec Struct)."""

    model_path: str
    port: int = 30000
    speculative_draft_window_size: int | None = None
    lora_paths: list = msgspec.field(default_factory=list)


@dataclasses.dataclass
class Inner:
    dtype: torch.dtype = torch.bfloat16
    mode: Mode = Mode.EXTEND
    handle: object = dataclasses.field(default_factory=object)


def test_a_config_keeps_every_key_with_defaults_filled_in():
    fact = config_fact(LlamaConfig(hidden_size=64, num_hidden_layers=2))
    assert fact["hidden_size"] == 64 and fact["num_hidden_layers"] == 2
    assert "rms_norm_eps" in fact and "attention_bias" in fact  # defaults the file never named
    json.dumps(fact)
    validate_contract({"draft_config": fact}, where="test")


def test_values_are_json_safe_and_the_same_for_the_same_setting():
    a, b = json_safe(Inner()), json_safe(Inner())
    assert a == b == {"dtype": "bfloat16", "mode": "EXTEND", "handle": "<object>"}
    assert json_safe({"x": (1, 2), "s": {3, 1}, "f": float("nan")}) == {"x": [1, 2], "s": [1, 3], "f": "nan"}
    assert json_safe(list(range(1000))) == "<list of 1000>"


def test_every_option_field_is_recorded_and_the_given_ones_are_told_apart():
    args = Args(model_path="/m", speculative_draft_window_size=4)
    assert options_fact(args) == {"model_path": "/m", "port": 30000, "speculative_draft_window_size": 4,
                                  "lora_paths": []}
    assert options_fact(args, resolved={"port": 1, "x": Mode.EXTEND}) == {"port": 1, "x": "EXTEND"}
    defaults = {"model_path": None, "port": 30000, "speculative_draft_window_size": None, "lora_paths": []}
    assert given_options(args, defaults) == {"model_path": {"value": "/m", "default": None},
                                             "speculative_draft_window_size": {"value": 4, "default": None}}
