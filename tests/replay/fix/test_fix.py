"""``specdiff fix TRAIN SERVE -o OUT`` without a server: the shipped seed pair (real recorders)
and hand-built pairs (real TraceWriter stores) whose contracts name a served draft that the demo's
scenario writer made from the committed draft (demo/scenarios.py ``write_served_draft``). Each fix is
held against the draft as trained: the written config keys and tensors must be the trained ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.demo.scenarios import write_served_draft
from specdiff.eagle3.norms import read_norm_flags

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "traces" / "examples" / "seed"
DRAFT = REPO_MODELS / "draft"

pytestmark = pytest.mark.skipif(not (SEED / "serve.trace").exists() or not (DRAFT / "config.json").exists(),
                                reason="the shipped example pair or the demo models are absent")


def _tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def _snapshot(d: Path) -> dict:
    """Every file under ``d``: its bytes (links followed) and whether it is a link, to prove it untouched."""
    return {p.relative_to(d): (p.is_symlink(), p.read_bytes()) for p in sorted(d.rglob("*")) if p.is_file()}


def _assert_same_tensors(got: dict, want: dict) -> None:
    import torch

    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


# ---- the shipped seed pair: aux_layer_shift ---------------------------------------------------------
def test_seed_pair_writes_the_trained_ids_and_leaves_the_served_draft_alone(tmp_path, run_cli):
    served = SEED / "served-draft"
    before = _snapshot(served)
    out = tmp_path / "fixed"
    r = run_cli("fix", SEED / "train.trace", SEED / "serve.trace", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[2:5] == [
        "config.json",
        "  - eagle_config.eagle_aux_hidden_state_layer_ids: [2, 5, 6]",
        "  + eagle_config.eagle_aux_hidden_state_layer_ids: [-1, 2, 5]"]
    assert r.stdout.startswith("fix: aux_layer_shift at target.aux.0: set the draft config's")
    # the trained draft's config exactly (the seed changed only the ids), its weights as real files
    assert json.loads((out / "config.json").read_text()) == json.loads((DRAFT / "config.json").read_text())
    assert not (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").read_bytes() == (DRAFT / "model.safetensors").read_bytes()
    assert _snapshot(served) == before
    # the pre-flight check agrees: the fixed draft feeds SGLang the training layers
    chk = run_cli("check", "--target", REPO_MODELS / "target", "--draft", out, "--training-layers", "0,3,6")
    assert chk.exit_code == 0, chk.output


def test_json_names_the_keys_and_out(tmp_path, run_cli):
    r = run_cli("fix", SEED / "train.trace", SEED / "serve.trace", "-o", tmp_path / "fixed", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fix_format"] == 1 and d["cause"] == "aux_layer_shift" and d["tensor"] == "target.aux.0"
    assert d["config"] == [{"key": "eagle_config.eagle_aux_hidden_state_layer_ids", "old": [2, 5, 6],
                            "new": [-1, 2, 5]}]
    assert d["tensors"] == [] and d["out"] == str(tmp_path / "fixed")


def test_an_existing_out_is_refused_in_one_line_and_kept(tmp_path, run_cli):
    out = tmp_path / "fixed"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    r = run_cli("fix", SEED / "train.trace", SEED / "serve.trace", "-o", out)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("specdiff: error: -o ") and "--overwrite" in r.stderr
    assert (out / "mine.txt").read_text() == "keep me"
    r = run_cli("fix", SEED / "train.trace", SEED / "serve.trace", "-o", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert not (out / "mine.txt").exists() and (out / "config.json").is_file()


def test_the_served_draft_itself_is_never_out(tmp_path, aux_traces, run_cli):
    a, b, served = _pair(tmp_path, aux_traces, "seed", train_kw={"probes": True}, serve_kw={"hf": [3, 6, 7]})
    before = _snapshot(served)
    for out in (served, tmp_path):
        r = run_cli("fix", a, b, "-o", out, "--overwrite")
        assert r.exit_code == 2, r.output
        assert r.stderr.count("\n") == 1 and "never edits the user's files in place" in r.stderr
    assert _snapshot(served) == before
    r = run_cli("fix", a, b, "-o", tmp_path / "fixed")  # the same pair, to a new folder: the trained ids
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "fixed" / "config.json").read_text()) == json.loads((DRAFT / "config.json").read_text())


def test_nothing_to_fix_when_nothing_diverges(tmp_path, run_cli):
    out = tmp_path / "fixed"
    r = run_cli("fix", SEED / "train.trace", SEED / "train.trace", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("nothing to fix") and not out.exists()


# ---- hand-built pairs naming a served draft with one scenario's mistake --------------------------
def _trained_d2t() -> np.ndarray:
    return _tensors(DRAFT)["d2t"].numpy().astype(np.int64)


def _pair(tmp_path, aux_traces, scenario: str, *, serve_kw: dict, train_kw: dict | None = None):
    served = write_served_draft(scenario, DRAFT, tmp_path / f"served-{scenario}")
    d2t = _trained_d2t()
    train_kw = {"hf": [0, 3, 6], "d2t": d2t, **(train_kw or {})}
    serve_kw = {"hf": [0, 3, 6], "d2t": d2t, **serve_kw}
    tf, sf = train_kw.pop("facts", {}), serve_kw.pop("facts", {})
    a = aux_traces.write(tmp_path / "train.trace", side="train", facts={"draft_name": str(DRAFT), **tf}, **train_kw)
    b = aux_traces.write(tmp_path / "serve.trace", side="serve", facts={"draft_name": str(served), **sf}, **serve_kw)
    return a, b, served


def _fix(run_cli, a, b, out, cause: str) -> dict:
    r = run_cli("fix", a, b, "-o", out, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["cause"] == cause, d
    return d


def test_d2t_saved_as_direct_ids_is_written_as_the_trained_offsets(tmp_path, aux_traces, run_cli):
    d2t = _trained_d2t()
    a, b, served = _pair(tmp_path, aux_traces, "d2t-direct", serve_kw={"d2t": d2t + np.arange(len(d2t))})
    before = _snapshot(served)
    d = _fix(run_cli, a, b, tmp_path / "fixed", "d2t_direct_ids")
    assert [t["name"] for t in d["tensors"]] == ["d2t"] and d["config"] == []
    _assert_same_tensors(_tensors(tmp_path / "fixed"), _tensors(DRAFT))
    assert _snapshot(served) == before


def test_a_missing_d2t_gets_the_trained_d2t_and_t2d(tmp_path, aux_traces, run_cli):
    a, b, _ = _pair(tmp_path, aux_traces, "no-d2t", serve_kw={"d2t": np.zeros(1024, np.int64)})
    d = _fix(run_cli, a, b, tmp_path / "fixed", "d2t_missing")
    assert [(t["name"], t["dtype"]) for t in d["tensors"]] == [("d2t", "int64"), ("t2d", "bool")]
    _assert_same_tensors(_tensors(tmp_path / "fixed"), _tensors(DRAFT))


def test_norm_before_fc_on_serving_only_is_turned_off_and_its_weight_dropped(tmp_path, aux_traces, run_cli):
    a, b, _ = _pair(tmp_path, aux_traces, "norm-before-fc", train_kw={"fc_in_norm": False, "facts": {
                    "norm_before_fc": False, "fc_norm": False}}, serve_kw={"fc_in_norm": True})
    out = tmp_path / "fixed"
    d = _fix(run_cli, a, b, out, "norm_before_fc")
    assert d["config"] == [{"key": "norm_before_fc", "old": True, "new": False}]
    assert [(t["name"], t["change"]) for t in d["tensors"]] == [("input_norm.weight", "remove")]
    _assert_same_tensors(_tensors(out), _tensors(DRAFT))
    got, want = (read_norm_flags(json.loads((p / "config.json").read_text()), "specforge") for p in (out, DRAFT))
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}


def test_permuted_aux_slots_reorder_fc_to_the_serving_concat(tmp_path, aux_traces, run_cli):
    # trained on HF [6, 0, 3] in that order (the served checkpoint's fc), served ascending: the fix is
    # the demo draft's own fc, trained on [0, 3, 6]
    a, b, _ = _pair(tmp_path, aux_traces, "aux-order", train_kw={"hf": [6, 0, 3], "facts": {
                    "aux_concat_order": [6, 0, 3]}}, serve_kw={"facts": {"aux_concat_order": [0, 3, 6]}})
    d = _fix(run_cli, a, b, tmp_path / "fixed", "aux_slot_permutation")
    assert [t["name"] for t in d["tensors"]] == ["fc.weight"]
    _assert_same_tensors(_tensors(tmp_path / "fixed"), _tensors(DRAFT))


# ---- refusals ----------------------------------------------------------------------------------------
def test_a_cause_with_no_mechanical_fix_is_refused_in_one_line(tmp_path, aux_traces, run_cli):
    a, b, _ = _pair(tmp_path, aux_traces, "correct", serve_kw={"shift_pos": 1})
    out = tmp_path / "fixed"
    r = run_cli("fix", a, b, "-o", out)
    assert r.exit_code == 2 and r.stdout == "" and not out.exists()
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("specdiff: error: no mechanical fix for position_shift at "), r.stderr


def test_traces_of_another_target_are_refused_in_one_line(tmp_path, aux_traces, run_cli):
    a, b, _ = _pair(tmp_path, aux_traces, "seed", train_kw={"facts": {"target_weights_fingerprint": "a" * 64}},
                    serve_kw={"facts": {"target_weights_fingerprint": "b" * 64}})
    r = run_cli("fix", a, b, "-o", tmp_path / "fixed")
    assert r.exit_code == 2 and not (tmp_path / "fixed").exists()
    assert r.stderr.count("\n") == 1 and "traces of different targets" in r.stderr


def test_a_crashed_engine_is_refused_in_one_line(tmp_path, aux_traces, run_cli):
    crash = {"type": "RuntimeError", "message": "mat1 and mat2 shapes cannot be multiplied (7x512 and 768x256)",
             "forward": "draft extend (prefill)", "iter": 0, "kind": "prefill", "rids": []}
    a, b, _ = _pair(tmp_path, aux_traces, "seed", serve_kw={"facts": {"crash": crash}})
    r = run_cli("fix", a, b, "-o", tmp_path / "fixed")
    assert r.exit_code == 2 and not (tmp_path / "fixed").exists()
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("specdiff: error: no mechanical fix: the serving "
                                                             "engine crashed"), r.stderr


# ---- the ids in the serving engine's numbering and key, per target family ----------------------------
@pytest.mark.parametrize(("arch", "want"), [("LlamaForCausalLM", [-1, 2, 5]), ("DeepseekV3ForCausalLM", [0, 3, 6])])
def test_the_seed_ids_follow_the_targets_sglang_rule(tmp_path, aux_traces, run_cli, arch, want):
    facts = {"target_architecture": arch}
    a, b, _ = _pair(tmp_path, aux_traces, "seed", train_kw={"probes": True, "facts": facts},
                    serve_kw={"hf": [3, 6, 7], "facts": facts})
    d = _fix(run_cli, a, b, tmp_path / "fixed", "aux_layer_shift")
    assert d["config"][0]["key"] == "eagle_config.eagle_aux_hidden_state_layer_ids" and d["config"][0]["new"] == want
    cfg = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == want


def test_a_vllm_served_seed_gets_vllms_top_level_ids(tmp_path, aux_traces, run_cli):
    from specdiff.demo.scenarios import scenario_ids

    served = write_served_draft("seed", DRAFT, tmp_path / "served", ids=scenario_ids(engine="vllm"))
    a = aux_traces.write(tmp_path / "train.trace", side="train", hf=[0, 3, 6], probes=True,
                         facts={"draft_name": str(DRAFT)})
    b = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[3, 6, 7],
                         facts={"draft_name": str(served), "engine": "vllm"})
    d = _fix(run_cli, a, b, tmp_path / "fixed", "aux_layer_shift")
    assert d["config"] == [{"key": "top-level eagle_aux_hidden_state_layer_ids", "old": [3, 6, 7], "new": [0, 3, 6]}]
    cfg = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]
    assert cfg["eagle_config"] == json.loads((DRAFT / "config.json").read_text())["eagle_config"]  # untouched


def test_a_norm_whose_trained_weight_the_served_draft_lacks_is_refused(tmp_path, aux_traces, run_cli):
    # training applied norm_before_fc; the served checkpoint has no input_norm.weight to turn on
    a, b, served = _pair(tmp_path, aux_traces, "correct", train_kw={"fc_in_norm": True, "facts": {
                         "norm_before_fc": True, "fc_norm": False}}, serve_kw={"fc_in_norm": False})
    r = run_cli("fix", a, b, "-o", tmp_path / "fixed")
    assert r.exit_code == 2 and not (tmp_path / "fixed").exists()
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("specdiff: error: no mechanical fix for norm_before_fc: training applied "
                               "norm_before_fc, whose input_norm.weight is a trained weight"), r.stderr


# ---- the estimate before --verify serves anything ---------------------------------------------------
def test_the_graft_estimate_of_the_seed_fix_is_the_training_acceptance():
    from specdiff.demo.verify_fix import estimate
    from specdiff.replay.diff.pipeline import diff_traces

    report = diff_traces(str(SEED / "train.trace"), str(SEED / "serve.trace"))
    est, words = estimate(report, "aux_layer_shift")
    # training's aux rows on serving's positions recover the whole gap (README: graft 3.02 -> 3.56)
    assert est is not None and abs(est - report.acceptance.x.mean_accept_length) < 0.1, (est, words)
    assert est > report.acceptance.y.mean_accept_length + 0.3
    assert words.startswith("graft estimate: accept length ") and "with training's target.aux_cat" in words
    assert estimate(report, "position_shift") == (None, "no graft input stands for position_shift")
