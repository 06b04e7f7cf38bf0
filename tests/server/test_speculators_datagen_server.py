"""speculators 0.9.0's own offline data as the training side: ``speculators prepare-data`` and ``speculators
generate-offline-data`` against a real vLLM 0.32.0 CPU server launched as speculators' ``scripts/launch_vllm.py``
launches it (the ``extract_hidden_states`` method, hs_connectors' file backend), then ``record train --features``
on the ``hs_{i}.safetensors`` they wrote; specdiff never loads the target on that side.

The sequences are the shipped seed serving trace's (traces/examples/seed/serve.trace, served with HF [3, 6, 7] while
the demo draft was trained on HF [0, 3, 6]). The server extracts the training layers in vLLM's numbering (vLLM id k
is HF ``hidden_states[k]``: the state after layer k-1, model_executor/models/llama.py:427-441), ``--target-layer-ids
0 3 6`` plus the last id L = 8 that launch_vllm.py appends (``--include-last-layer``, its default): the verifier's
last hidden state before the final norm.

What runs is the trainers' code but for one class: speculators' CLIs build and read the data
(``prepare-data`` passes pre-tokenized ``input_ids`` / ``loss_mask`` rows through without a render server,
data_generation/preprocessing.py:458-483; ``generate-offline-data`` sends each row's ``input_ids`` with
``max_tokens=1``, data_generation/vllm_client.py:194-244, waits on the file's lock and moves it to
``hs_{i}.safetensors``, cli/generate_offline_data.py:144-160), hs_connectors' ``FileBackend`` builds the
``kv_transfer_config`` (transfer.py:196-205), and vLLM's ``ExampleHiddenStatesConnector`` reads the rows from the
cache and writes the file. That connector cannot write on the CPU wheel (two GPU-only lines:
tests/server/vllm_connectors/specdiff_cpu_hs_connector.py), so the server loads it through its CPU-safe subclass
by ``kv_connector_module_path``, the hook hs_connectors loads its own connectors through.

- the files hold what the dataset sent: ``token_ids`` equal to each row's ``input_ids``, ``hidden_states``
  [T, 4, 256] bf16 (speculators' own ``check_hidden_states`` ran on each: ``--validate-outputs``);
- the seed's mistake: those features against the seed's serving trace diverge first at ``target.aux.0``, named
  as the layer shift with serving's fix (the draft config's SGLang ids [-1, 2, 5]);
- the correct pair: the features trace against a target replay of its tokens (``record train --replay``):
  exit 0, the vLLM-extracted rows within the tolerance of the transformers target's.

The server starts with ``--enforce-eager`` (no torch.compile, so no compile cache shared with the other vLLM
tests) and prefills 3 sequences of 124-142 tokens with one token out each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("speculators")
pytest.importorskip("hs_connectors")

from specdiff.demo.run import REPO_MODELS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
SPECULATORS = Path(sys.executable).with_name("speculators")
CONNECTOR_DIR = Path(__file__).resolve().parent / "vllm_connectors"
SEED = ROOT / "traces" / "examples" / "seed"
TARGET = REPO_MODELS / "target"
DRAFT = REPO_MODELS / "draft"
#: the demo draft's training layers in vLLM's numbering (= HF indices), as ``--target-layer-ids`` gives them
TRAIN_IDS = [0, 3, 6]

pytestmark = [pytest.mark.skipif(not VLLM_PY.exists(), reason="no vLLM venv at .venv-vllm (build it with "
                                                              "`make vllm-venv`; `make test` does)"),
              pytest.mark.skipif(not SPECULATORS.exists(), reason="no speculators CLI beside this Python "
                                                                  "(`make install` installs speculators 0.9.0)")]


def _speculators(*args, env) -> float:
    """Run ``speculators ARGS`` (its console script); returns its wall seconds. Fails the test with its output."""
    t0 = time.monotonic()
    res = subprocess.run([str(SPECULATORS), *map(str, args)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"speculators {args[0]} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return time.monotonic() - t0


def _launch_settings(hidden_states_path: Path, num_layers: int) -> tuple[dict, dict]:
    """(speculative_config, kv_transfer_config) as speculators' scripts/launch_vllm.py builds them for
    ``--target-layer-ids 0 3 6`` and the file backend, the connector swapped for its CPU-safe subclass."""
    from hs_connectors.transfer import FileBackend

    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [*TRAIN_IDS, num_layers]}}}
    kv = FileBackend.build_kv_transfer_config(argparse.Namespace(hidden_states_path=str(hidden_states_path)))
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector", kv  # what the CPU subclass stands in for
    kv |= {"kv_connector": "CPUHiddenStatesConnector", "kv_connector_module_path": "specdiff_cpu_hs_connector"}
    return spec, kv


@pytest.fixture(scope="module")
def generated(tmp_path_factory, server_env):
    """speculators' preprocessed dataset of the seed's sequences and the hs_{i}.safetensors its
    generate-offline-data wrote through the CPU vLLM server: {data, rows, timings}."""
    from specdiff.replay.record.sequences import sequences_from_trace
    from specdiff.tracer.engines.vllm.cpu import VLLMServerProcess

    root = tmp_path_factory.mktemp("speculators")
    seqs, _ = sequences_from_trace(str(SEED / "serve.trace"))
    rows = [{"input_ids": [int(t) for t in s.tokens],
             "loss_mask": [0] * s.prompt_len + [1] * (len(s.tokens) - s.prompt_len)} for s in seqs]
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**server_env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    data = root / "data"
    timings = {"prepare_data_s": _speculators("prepare-data", "--model", TARGET, "--data", root / "rows.jsonl",
                                              "--output", data, "--seq-length", 1024,
                                              "--num-preprocessing-workers", 1, env=env)}

    num_layers = json.loads((TARGET / "config.json").read_text())["num_hidden_layers"]
    spec, kv = _launch_settings(root / "staging", num_layers)
    server = VLLMServerProcess(TARGET, python=str(VLLM_PY), cache_root=str(root / "vllm-cache"),
                               env=server_env(PYTHONPATH=os.pathsep.join(filter(None, [str(CONNECTOR_DIR),
                                                                                      os.environ.get("PYTHONPATH")]))),
                               log_path=str(root / "server.log"),
                               extra_args=["--speculative-config", json.dumps(spec),
                                           "--kv-transfer-config", json.dumps(kv), "--enforce-eager"])
    t0 = time.monotonic()
    with server:
        timings["server_start_s"] = server.startup_s
        timings["generate_offline_data_s"] = _speculators(
            "generate-offline-data", "--preprocessed-data", data, "--endpoint", f"{server.url}/v1",
            "--concurrency", 1, "--validate-outputs", "--fail-on-error", "--request-timeout", 120, env=env)
    timings["server_s"] = time.monotonic() - t0
    print(f"speculators datagen on vLLM CPU: {timings}")
    return {"data": data, "rows": rows, "timings": timings}


@pytest.fixture(scope="module")
def features_trace(generated, run_cli, tmp_path_factory):
    """``record train --features`` of the generated data, the layers given as speculators was launched."""
    out = tmp_path_factory.mktemp("trace") / "features.trace"
    res = run_cli("record", "train", "--target", TARGET, "--draft", DRAFT, "--features", generated["data"],
                  "-o", out, "--no-noise-floor", "--aux-layers", ",".join(map(str, TRAIN_IDS)),
                  "--aux-convention", "vllm")
    assert res.exit_code == 0, res.output
    return out


def _diff(run_cli, a, b, code):
    res = run_cli("diff", a, b, "--format", "json", "--no-narrow")
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


def test_the_vllm_lines_the_cpu_connector_stands_in_for_hold_what_it_says():
    """No engine: the installed wheel still has the two GPU-only lines the CPU subclass changes (when a vLLM
    release drops them, the subclass is no longer needed and the server can take the connector as it is)."""
    site = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"))

    def line(path, n):
        return (site / path).read_text().splitlines()[n - 1].strip()

    connector = "distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
    assert line(connector, 403) == 'hidden_states_gpu, device="cpu", pin_memory=True'
    assert line(connector, 587) == "if event is not None and not event.query():"
    shm = "v1/worker/cpu/shm.py"
    assert line(shm, 30) == "class _EventPlaceholder:" and line(shm, 62) == "torch.cuda.Event = _EventPlaceholder"
    assert "query" not in "".join(line(shm, n) for n in range(31, 35))


@pytest.mark.server
@pytest.mark.slow
def test_generate_offline_data_writes_each_rows_tokens_and_the_launched_layers(generated):
    """One hs_{i}.safetensors per dataset row i, holding that row's tokens and k + 1 = 4 slices of 256."""
    from datasets import load_from_disk
    from safetensors.torch import load_file

    ds = load_from_disk(str(generated["data"]))
    hs_dir = generated["data"] / "hidden_states"
    assert sorted(p.name for p in hs_dir.iterdir()) == [f"hs_{i}.safetensors" for i in range(len(ds))]
    sent = sorted(tuple(r["input_ids"]) for r in generated["rows"])
    held = []
    for i in range(len(ds)):
        f = load_file(str(hs_dir / f"hs_{i}.safetensors"))
        assert f["token_ids"].tolist() == list(ds[i]["input_ids"]), i  # prepare-data shuffles: row i's own
        assert list(f["hidden_states"].shape) == [len(f["token_ids"]), len(TRAIN_IDS) + 1, 256], f["hidden_states"].shape
        held.append(tuple(f["token_ids"].tolist()))
    assert sorted(held) == sent


@pytest.mark.server
@pytest.mark.slow
def test_the_seeds_mistake_in_speculators_data_is_the_first_divergence_with_its_fix(features_trace, run_cli):
    """The features speculators generated at the training layers against the seed's serving (HF [3, 6, 7]):
    target.aux.0 first, named as the layer shift with serving's fix."""
    from specdiff.tracer.store import open_trace

    c = open_trace(str(features_trace)).contract
    assert c["features"]["format"] == "speculators" and c["features"]["capture_layers"]["hf_indices"] == TRAIN_IDS
    report = _diff(run_cli, features_trace, SEED / "serve.trace", 1)
    first = report["first_divergence"]
    assert first["tensor"] == "target.aux.0", first
    lead = report["explanations"][0]
    assert lead["cause"] == "aux_layer_shift", lead
    assert "[-1, 2, 5]" in lead["fix"], lead["fix"]


@pytest.mark.server
@pytest.mark.slow
def test_speculators_data_and_a_target_replay_of_its_tokens_agree(features_trace, run_cli, tmp_path):
    """The correct pair: what vLLM extracted is what the target computes on those tokens, exit 0."""
    replay = tmp_path / "replay.trace"
    res = run_cli("record", "train", "--target", TARGET, "--draft", DRAFT, "--replay", features_trace, "-o", replay,
                  "--no-noise-floor")
    assert res.exit_code == 0, res.output
    report = _diff(run_cli, replay, features_trace, 0)
    assert report["first_divergence"] is None
