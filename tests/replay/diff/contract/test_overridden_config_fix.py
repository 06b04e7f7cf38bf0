"""A config key an engine option set (contract ``<side>_config_overrides``) is fixed where it was set: SGLang's
``--json-model-override-args`` sets the draft's config too, and the draft config's own row said "set rms_norm_eps in
the draft config to training's" for a draft whose config file holds training's value. Synthetic pairs
(tests/builders.py) whose rows agree: only the contract facts differ."""

from __future__ import annotations

from builders import dataflow_pair

from specdiff.replay.diff.contract.check import check_contracts
from specdiff.replay.diff.types import Pair
from specdiff.tracer.store import open_trace

BASE = {"hidden_size": 16, "draft_hidden_size": 16, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16"}


def _found(tmp_path, serve: dict) -> dict:
    train = {"engine": "specdiff-reference", "draft_config": {"rms_norm_eps": 1e-6}, "target_config": {"rms_norm_eps": 1e-6},
             "draft_config_overrides": {}, "target_config_overrides": {}}
    a, b = dataflow_pair(tmp_path, contract=BASE, train=train, serve={"engine": "sglang", **serve})
    return {m.field: m for m in check_contracts(Pair(open_trace(a), open_trace(b)))}


def test_a_config_key_an_option_set_is_fixed_at_the_option(tmp_path):
    over = {"rms_norm_eps": {"value": 0.1, "source": "json_model_override_args"}}
    found = _found(tmp_path, {"draft_config": {"rms_norm_eps": 0.1}, "target_config": {"rms_norm_eps": 0.1},
                              "draft_config_overrides": over, "target_config_overrides": over})
    for side in ("draft", "target"):
        m = found[f"{side}_config.rms_norm_eps"]
        assert m.fix.startswith("set on serving by json_model_override_args, not by the config file: serve "), m.fix
        assert m.fix.endswith(found[f"{side}_config_overrides.rms_norm_eps"].fix), m.fix
        assert "draft config to training's" not in m.fix


def test_a_config_key_no_option_set_keeps_its_own_fix(tmp_path):
    found = _found(tmp_path, {"draft_config": {"rms_norm_eps": 0.1}, "draft_config_overrides": {}})
    assert found["draft_config.rms_norm_eps"].fix == "set rms_norm_eps in the draft config to training's"
