"""The contract read whole from SGLang 0.5.23's live objects (tracer/engines/sglang/live_facts.py) on one real
CPU server, and three mistakes the suite did not have, each named with its fact and its fix by ``diff``:

- a server option that changes the draft's attention: ``--speculative-draft-window-size 4`` (SGLang's Llama
  EAGLE-3 then attends to the 4 most recent keys only, llama_eagle3.py:287-297);
- a draft config key that makes SGLang build more draft layers than the checkpoint holds:
  ``num_hidden_layers: 2`` (layer 1's weights stay as allocated: NaN on this CPU);
- a serving target whose decoder weights differ from training's in one layer (layer 5; same config and
  embedding, so the target identity facts agree).

All three are served at once (one server start: minutes on a CPU), training recorded on the original demo
pair with ``record train --replay``. The load-path fingerprints of every other draft tensor and target layer
equal training's, and no other fact differs: the sides' recorders read the same facts alike.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.replay.diff.contract.facts import fact_row
from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings
from specdiff.tracer.store import open_trace

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)

#: the decoder layer whose weights the served target changes
LAYER = 5


def _two_layer_draft(out: Path) -> Path:
    shutil.copytree(REPO_MODELS / "draft", out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}, indent=2))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory, server_env, other_layer_target):
    root = tmp_path_factory.mktemp("live-facts")
    serve = root / "serve.trace"
    # the thread writer: this file is about the contract, and a writer process that starts late on a
    # loaded machine would only cost the rows
    env = server_env(SPECDIFF_TRACE=str(serve), SPECDIFF_WRITER="thread")
    with ServerProcess(other_layer_target(REPO_MODELS / "target", root / "target", layer=LAYER, scale=0.5), draft_model_path=_two_layer_draft(root / "draft"),
                       spec=SpecSettings(), env=env, extra_args=["--dtype", "bfloat16",
                                                                 "--speculative-draft-window-size", "4"],
                       log_path=root / "server.log", startup_timeout_s=1200) as server:
        for ids in demo_prompts(REPO_MODELS, 2):
            server.generate(input_ids=ids, max_new_tokens=16)
    train = root / "train.trace"
    rec = subprocess.run([sys.executable, "-m", "specdiff.tui", "record", "train", "--target", REPO_MODELS / "target",
                          "--draft", REPO_MODELS / "draft", "--replay", serve, "-o", train],
                         capture_output=True, text=True, timeout=900)
    assert rec.returncode == 0, rec.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", train, serve, "--format", "json", "--no-narrow"],
                          capture_output=True, text=True, timeout=900)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return open_trace(str(train)).contract, open_trace(str(serve)).contract, proc.returncode, json.loads(proc.stdout)


def test_the_serving_contract_is_read_whole_from_the_live_objects(pair):
    train, serve, _, _ = pair
    assert serve["draft_config"]["num_hidden_layers"] == 2 and train["draft_config"]["num_hidden_layers"] == 1
    assert len(serve["target_config"]) > 30 and serve["target_config"]["num_hidden_layers"] == 8
    assert serve["engine_options"]["speculative_draft_window_size"] == 4  # every ServerArgs field, resolved
    assert len(serve["engine_options"]) > 300
    assert serve["engine_options_given"]["speculative_draft_window_size"] == {"value": 4, "default": None}
    assert "model.layers.1.self_attn.qkv_proj.weight" in serve["draft_structure"]  # SGLang's names, as built
    # the parameters SGLang built for layer 1 that the checkpoint does not hold; the embedding it shares
    # with the target after loading is not one of them
    assert serve["draft_unloaded"] and all(p.startswith("model.layers.1.") for p in serve["draft_unloaded"])
    assert serve["target_unloaded"] == [] and train["draft_unloaded"] == train["target_unloaded"] == []


def test_the_load_path_fingerprints_equal_trainings_except_the_changed_layer(pair):
    train, serve, _, _ = pair
    assert serve["draft_weights"] == train["draft_weights"]  # one checkpoint, read by SGLang and by record train
    differ = {u for u in train["target_weights"] if serve["target_weights"].get(u) != train["target_weights"][u]}
    assert differ == {f"model.layers.{LAYER}"}


def test_each_mistake_is_named_with_its_fact_and_fix(pair):
    _, _, code, report = pair
    assert code == 1
    first = report["first_divergence"]["tensor"]
    causes = [e["cause"] for e in report["explanations"]]
    assert "unloaded_params" in causes  # the NaN of the layer left as allocated, wherever it appears
    if first == "target.aux.2":  # HF 6 = after layer 5: the other weights show there first on these prompts
        assert causes[0] == "contract.target_weights", causes
        assert report["explanations"][0]["message"].startswith(f"target_weights.model.layers.{LAYER}: training ")
    else:
        assert first == "draft.hidden_out" and causes[0] == "unloaded_params", (first, causes)
    warnings = {m["field"]: m for m in report["contract_mismatches"] if m["severity"] in ("warn", "error")}
    # the window option is named as the window both sides computed (contract draft_attention_window: SGLang
    # reads each live draft layer's RadixAttention window), not as the option against the engine's default
    expected = {"draft_attention_window", "draft_config.num_hidden_layers",
                "draft_unloaded.model.layers.1", f"target_weights.model.layers.{LAYER}"}
    assert set(warnings) == expected, set(warnings) ^ expected  # nothing else differs
    for field in expected:
        assert warnings[field]["fix"] == fact_row(field).fix, field
    # rope tables are compared layer by layer (contract/fact_diff.py STATE_FACTS): layer 0's is training's, so
    # no warning; the served draft's second layer has one training has no layer for: one side only, not compared
    one_sided = [m["message"] for m in report["contract_mismatches"] if m["field"] == "one_sided_facts"]
    assert len(one_sided) == 1 and "draft_rope.layers.1" in one_sided[0], one_sided
    said = warnings["draft_attention_window"]["message"]  # both served layers windowed, training's one not
    assert said.startswith("draft_attention_window: training [None], serving [{'window': 4, 'distance': 'kv'}, "), said
    assert "--speculative-draft-window-size" in warnings["draft_attention_window"]["fix"]
