"""A two-layer EAGLE-3 draft (``traces/models/draft2l``, ``num_hidden_layers: 2``) served by a real
SGLang 0.5.23 CPU server against its training side recorded by the reference forward (the multi-layer drafts users train).

SGLang builds and chains both layers (srt/models/llama_eagle3.py:198-204, :253-268); the reference
chains them the same way (``replay.model.draft_model``). The served trace and ``record train
--replay`` must agree: diff exit 0, and the draft really drafts (accepted tokens beyond the bonus); so
must the training side computed by speculators 0.9.0's own two-layer model (``--trainer speculators``).
Layer 0's own output (``draft.layer_out.0``) is recorded on both sides and agrees. The same serving
trace against a training side cut to layer 0 diverges at ``draft.hidden_out`` (exit 1): the test sees
the second layer; against a training side whose layer 0 differs, at ``draft.layer_out.0``. One server
start.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from builders import draft_copy, first_layer_only, serve_demo_prompts, train_and_diff

from specdiff.demo.run import REPO_MODELS

pytestmark = [pytest.mark.server, pytest.mark.slow]

DRAFT2L = REPO_MODELS / "draft2l"
if not (DRAFT2L / "config.json").exists():
    pytest.skip("the two-layer demo draft is not built (traces/models/draft2l)", allow_module_level=True)


def test_a_two_layer_draft_served_by_sglang_matches_its_training_forward(tmp_path):
    assert json.loads((DRAFT2L / "config.json").read_text())["num_hidden_layers"] == 2
    serve, accepted = serve_demo_prompts(DRAFT2L, tmp_path)
    proc = train_and_diff(DRAFT2L, serve, tmp_path / "train.trace")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["first_divergence"] is None, report["first_divergence"]
    # layer 0's own output is recorded by both sides (SGLang: layer 1's hidden + residual) and agrees
    layer0, last = report["tensors"]["draft.layer_out.0"], report["tensors"]["draft.hidden_out"]
    assert layer0["rows"] == last["rows"] > 0 and layer0["coverage"] == last["coverage"], (layer0, last)
    assert not layer0["diverged"], layer0
    lengths = [a for a in accepted if a is not None]
    assert lengths and min(lengths) > 1.5, accepted
    # the training side computed by speculators' own two-layer model (its converter keeps one layer: specdiff
    # loads the second, replay/trainers/speculators.py): no divergence either
    if importlib.util.find_spec("speculators") is not None:
        proc = train_and_diff(DRAFT2L, serve, tmp_path / "train-speculators.trace", "--trainer", "speculators")
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
        assert json.loads(proc.stdout)["first_divergence"] is None
    # the same serving trace against a training side without layer 1: the diff sees the second layer
    one = first_layer_only(DRAFT2L, tmp_path / "draft1l")
    proc = train_and_diff(one, serve, tmp_path / "train1.trace")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    first = json.loads(proc.stdout)["first_divergence"]
    assert first["tensor"] == "draft.hidden_out", first
    # a training side whose layer 0 computes otherwise: the divergence is shown at layer 0's own output
    proc = train_and_diff(_layer0_moved(tmp_path / "draft-moved"), serve, tmp_path / "train-moved.trace")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    first = json.loads(proc.stdout)["first_divergence"]
    assert first["tensor"] == "draft.layer_out.0", first


def _layer0_moved(out):
    """draft2l with layer 0's MLP down projection scaled by 1.5 (layer 1 as trained)."""
    from safetensors.torch import load_file, save_file

    draft_copy(DRAFT2L, out)
    sd = load_file(str(out / "model.safetensors"))
    sd["midlayer.mlp.down_proj.weight"] = sd["midlayer.mlp.down_proj.weight"] * 1.5
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
