"""The training-side trace the re-run tests (test_narrow.py, test_reexec.py) replay their "serving"
sides against: one demo prompt, 12 greedy tokens, recorded by ``record_train`` on the committed demo
target and draft."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def training_trace(tmp_path_factory):
    """``(root, train)``: a fresh folder for the module's other traces and the training trace in it."""
    from specdiff.demo.run import REPO_MODELS, demo_prompts
    from specdiff.replay.record.record_train import record_train

    root = tmp_path_factory.mktemp("rerun")
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": demo_prompts(REPO_MODELS, 1)[0]}) + "\n")
    out = root / "train.trace"
    record_train(REPO_MODELS / "target", REPO_MODELS / "draft", str(out), prompts=prompts, max_new_tokens=12,
                 probe_positions=0)
    return root, out
