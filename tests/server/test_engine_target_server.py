"""`record train --target-backend sglang`: the target forward in SGLang's engine (the CPU recipe), capturing
the training layers through the model's set_eagle3_layers_to_capture, diffs like the transformers backend.

One engine start for the module: the shipped seed serving trace's sequences replayed with the target in SGLang,
capturing SGLang ids [2, 5, 6] (HF [3, 6, 7], the seed's serving layers) for the demo draft, whose training
layers are HF [0, 3, 6]. Against the transformers backend on the same layers it is clean, against the seed
serving trace it is clean, and against the transformers backend on the draft's own training layers it is the
seed's mistake, named at target.aux.0.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sglang")

from specdiff.demo.run import REPO_MODELS  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(1200)]

SEED_SERVE = REPO_MODELS.parent / "examples" / "seed" / "serve.trace"


@pytest.fixture(scope="module")
def engine_trace(repo_models, run_cli, tmp_path_factory):
    """The training trace with the target in SGLang (ids 2,5,6 in SGLang's convention), and its CLI result."""
    out = tmp_path_factory.mktemp("engine") / "engine.trace"
    res = run_cli("record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft",
                  "--replay", SEED_SERVE, "--target-backend", "sglang", "--aux-layers", "2,5,6",
                  "--aux-convention", "sglang", "-o", out)
    assert res.exit_code == 0, res.output
    return out, res


def _transformers(run_cli, repo_models, out, *extra):
    res = run_cli("record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft",
                  "--replay", SEED_SERVE, "-o", out, *extra)
    assert res.exit_code == 0, res.output
    return out


def _diff(run_cli, a, b):
    res = run_cli("diff", a, b, "--format", "json", "--no-narrow")
    return res.exit_code, json.loads(res.stdout)


def test_engine_capture_records_the_sglang_ids_and_the_hf_layers_they_name(engine_trace):
    from specdiff.tracer.store import open_trace

    path, res = engine_trace
    facts = open_trace(str(path)).contract
    got = facts["engine_target"]
    assert got["capture_ids"] == [2, 5, 6] and got["capture_hf_indices"] == [3, 6, 7], got
    assert facts["aux_concat_order"] == [3, 6, 7]
    assert "set_eagle3_layers_to_capture" in got["ids_source"]
    assert facts["engine_options"]["target_backend"] == "sglang"
    assert "ids [2, 5, 6] capture the training layers HF [3, 6, 7]" in res.output


def test_engine_target_diffs_clean_against_transformers_on_the_same_layers(engine_trace, run_cli, repo_models,
                                                                           tmp_path):
    ref = _transformers(run_cli, repo_models, tmp_path / "hf.trace", "--aux-layers", "3,6,7", "--device-map", "auto")
    code, got = _diff(run_cli, engine_trace[0], ref)
    assert code == 0 and got["first_divergence"] is None, got["first_divergence"]
    for j in range(3):
        assert got["tensors"][f"target.aux.{j}"]["coverage"] >= 0.99, got["tensors"][f"target.aux.{j}"]
    assert got["tensors"]["target.argmax"]["coverage"] >= 0.99


def test_engine_target_diffs_clean_against_the_serving_trace(engine_trace, run_cli):
    code, got = _diff(run_cli, engine_trace[0], SEED_SERVE)
    assert code == 0 and got["first_divergence"] is None, got["first_divergence"]


def test_seed_layer_list_on_the_engine_is_the_seed_divergence(engine_trace, run_cli, repo_models, tmp_path):
    trained = _transformers(run_cli, repo_models, tmp_path / "trained.trace")  # the draft's own HF [0, 3, 6]
    code, got = _diff(run_cli, trained, engine_trace[0])
    assert code == 1
    assert got["first_divergence"]["tensor"] == "target.aux.0", got["first_divergence"]
    causes = [e["cause"] for e in got["explanations"]]
    assert causes[:1] == ["aux_layer_shift"], causes
