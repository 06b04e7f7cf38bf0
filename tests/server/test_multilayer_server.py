"""A two-layer EAGLE-3 draft (``traces/models/draft2l``, ``num_hidden_layers: 2``) served by a real
SGLang 0.5.23 CPU server against its training side recorded by the reference forward (issue 31).

SGLang builds and chains both layers (srt/models/llama_eagle3.py:198-204, :253-268); the reference
chains them the same way (``replay.model.draft_model``). The served trace and ``record train
--replay`` must agree: diff exit 0, and the draft really drafts (accepted tokens beyond the bonus); so
must the training side computed by speculators 0.9.0's own two-layer model (``--trainer speculators``).
The same serving trace against a training side cut to layer 0 diverges at ``draft.hidden_out``
(exit 1): the test sees the second layer. One server start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

pytestmark = [pytest.mark.server, pytest.mark.slow]

DRAFT2L = REPO_MODELS / "draft2l"
if not (DRAFT2L / "config.json").exists():
    pytest.skip("the two-layer demo draft is not built (traces/models/draft2l)", allow_module_level=True)


def _train_and_diff(draft: Path, serve: Path, train: Path, trainer: str = "specdiff") -> subprocess.CompletedProcess:
    """`record train --draft DRAFT --replay SERVE -o TRAIN --trainer TRAINER` (must succeed), then `diff TRAIN
    SERVE --format json --no-narrow`: the diff's process."""
    rec = subprocess.run([sys.executable, "-m", "specdiff.tui", "record", "train", "--target", REPO_MODELS / "target",
                          "--draft", draft, "--replay", serve, "-o", train, "--trainer", trainer],
                         capture_output=True, text=True)
    assert rec.returncode == 0, rec.stderr[-2000:]
    return subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", train, serve, "--format", "json",
                           "--no-narrow"], capture_output=True, text=True)


def test_a_two_layer_draft_served_by_sglang_matches_its_training_forward(tmp_path):
    assert json.loads((DRAFT2L / "config.json").read_text())["num_hidden_layers"] == 2
    serve = tmp_path / "serve.trace"
    env = dict(os.environ, SPECDIFF_TRACE=str(serve))
    accepted = []
    with ServerProcess(REPO_MODELS / "target", draft_model_path=DRAFT2L, spec=SpecSettings(), env=env,
                       log_path=tmp_path / "server.log") as server:
        for ids in demo_prompts(REPO_MODELS, 2):
            out = server.generate(input_ids=ids, max_new_tokens=16)
            accepted.append(out.get("meta_info", {}).get("spec_accept_length"))
    proc = _train_and_diff(DRAFT2L, serve, tmp_path / "train.trace")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["first_divergence"] is None, report["first_divergence"]
    lengths = [a for a in accepted if a is not None]
    assert lengths and min(lengths) > 1.5, accepted
    # the training side computed by speculators' own two-layer model (its converter keeps one layer: specdiff
    # loads the second, replay/trainers/speculators.py): no divergence either
    if importlib.util.find_spec("speculators") is not None:
        proc = _train_and_diff(DRAFT2L, serve, tmp_path / "train-speculators.trace", trainer="speculators")
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
        assert json.loads(proc.stdout)["first_divergence"] is None
    # the same serving trace against a training side without layer 1: the diff sees the second layer
    one = _first_layer_only(tmp_path / "draft1l")
    proc = _train_and_diff(one, serve, tmp_path / "train1.trace")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    first = json.loads(proc.stdout)["first_divergence"]
    assert first["tensor"] == "draft.hidden_out", first


def _first_layer_only(out):
    """draft2l cut to its first layer: config num_hidden_layers 1, the layers.1.* weights dropped."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    cfg = json.loads((DRAFT2L / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    sd = {k: v for k, v in load_file(str(DRAFT2L / "model.safetensors")).items() if not k.startswith("layers.1.")}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
