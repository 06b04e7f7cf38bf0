"""The demo draft as a vLLM server is given it: its aux ids in vLLM's key and numbering (top-level
``eagle_aux_hidden_state_layer_ids``, vLLM id k = HF k; vLLM 0.32.0 model_executor/models/llama.py:427-441)."""

from __future__ import annotations

import json
from pathlib import Path

from specdiff.demo.run import REPO_MODELS


def vllm_draft(out: Path) -> Path:
    """A copy of the demo draft under ``out`` (config rewritten, weights linked) with vLLM's aux ids. Returns ``out``."""
    from specdiff.demo.scenarios import scenario_ids
    from specdiff.eagle3.config_keys import set_config_value

    out.mkdir(parents=True)
    (out / "model.safetensors").symlink_to(REPO_MODELS / "draft" / "model.safetensors")
    cfg = json.loads((REPO_MODELS / "draft" / "config.json").read_text())
    ids = scenario_ids(engine="vllm")
    set_config_value(cfg, ids.key, list(ids.correct))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
