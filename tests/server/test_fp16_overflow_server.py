"""A bf16-trained draft served with ``--dtype float16`` on a real SGLang 0.5.23 CPU server:
its activations pass float16's 65504, so serving's ``draft.hidden_out`` goes inf/NaN.

The draft is the demo draft with ``midlayer.mlp.down_proj.weight`` scaled by 2000 (weights still
far below 65504; the MLP output reaches ~1e5), used on BOTH sides, so the only difference is the
served dtype. ``record train`` replays the served sequences in bfloat16. The diff must name the
non-finite values and float16 as the cause with ``--dtype bfloat16``, and must not call the
embeddings / lm_heads hashed in float16 "different weights".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.demo.scenarios import write_served_draft
from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)

SCALE = 2000.0


def test_a_bf16_draft_served_in_float16_overflows_and_the_diff_says_so(tmp_path):
    draft = write_served_draft("correct", REPO_MODELS / "draft", tmp_path / "draft")
    f = next(draft.glob("*.safetensors"))
    w = load_file(str(f))
    w["midlayer.mlp.down_proj.weight"] = w["midlayer.mlp.down_proj.weight"] * SCALE
    assert w["midlayer.mlp.down_proj.weight"].abs().max() < 65504
    save_file(w, str(f), metadata={"format": "pt"})
    serve = tmp_path / "serve.trace"
    env = dict(os.environ, SPECDIFF_TRACE=str(serve))
    with ServerProcess(REPO_MODELS / "target", draft_model_path=draft, spec=SpecSettings(), env=env,
                       extra_args=["--dtype", "float16"], log_path=tmp_path / "server.log") as server:
        for ids in demo_prompts(REPO_MODELS, 2):
            server.generate(input_ids=ids, max_new_tokens=8)
    train = tmp_path / "train.trace"
    rec = subprocess.run([sys.executable, "-m", "specdiff.tui", "record", "train", "--target", REPO_MODELS / "target",
                          "--draft", draft, "--replay", serve, "-o", train, "--dtype", "bfloat16"],
                         capture_output=True, text=True)
    assert rec.returncode == 0, rec.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", train, serve, "--format", "json",
                           "--no-narrow"], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["first_divergence"]["tensor"] == "draft.hidden_out", report["first_divergence"]
    cause = report["explanations"][0]
    assert cause["cause"] == "fp16_overflow", cause
    assert "on serving" in cause["message"] and cause["fix"].startswith("serve in bfloat16: --dtype bfloat16")
    weights = [m for m in report["contract_mismatches"] if m["field"] in ("embed_sha256", "lm_head_sha256")]
    assert all(m["severity"] == "info" and "a cast" in m["message"] for m in weights), weights
    # `specdiff fix`: the cause is the served dtype, so the fix is the draft as it was, served in training's
    # dtype (replay/fix/plan.py OPTION_PLANNERS): the option replaces the float16 the operator gave
    fix = subprocess.run([sys.executable, "-m", "specdiff.tui", "fix", train, serve, "-o", tmp_path / "fixed",
                          "--format", "json"], capture_output=True, text=True)
    assert fix.returncode == 0, fix.stderr[-2000:]
    done = json.loads(fix.stdout)
    assert done["cause"] == "fp16_overflow" and done["config"] == done["tensors"] == []
    assert done["options"] == [{"flag": "--dtype", "old": "float16", "new": "bfloat16"}]
