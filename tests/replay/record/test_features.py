"""record train --features (replay/record/record_features.py): a trainer's stored features as the training
side, written in each trainer's own file format from the committed demo target's real hidden states, and
specdiff never loading the target on the features side.

The sequences are the shipped seed serving trace's (traces/examples/seed/serve.trace: served with HF [3, 6, 7]
while the demo draft was trained on HF [0, 3, 6]); a target replay of the same tokens (record train
--replay of the features trace) is the other side of the row-owner pairs, and the seed serving trace itself
the other side of the seed's mistake.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("specforge")
pytest.importorskip("speculators")

from builders import write_stored_features  # noqa: E402

from specdiff.replay.record.feature_files import find_features, read_specforge_file, stored_prompts  # noqa: E402
from specdiff.tracer.store import open_trace  # noqa: E402

TRAIN_HF = [0, 3, 6]  # the demo draft's training layers (its config: SGLang ids [-1, 2, 5])
NO_FLOOR = ("--no-noise-floor",)


@pytest.fixture(scope="module")
def demo(repo_models):
    """The seed serving trace's token sequences and the demo target's real hidden states on them (bf16, the
    serving dtype): every HF hidden state, and the last layer's output before the final norm."""
    from specdiff.replay.model.target_capture import capture_target, load_target
    from specdiff.replay.record.sequences import sequences_from_trace

    serve = repo_models.parent / "examples" / "seed" / "serve.trace"
    seqs, _ = sequences_from_trace(str(serve))
    target = load_target(repo_models / "target")
    L = target.config.num_hidden_layers
    caps = [capture_target(target, torch.as_tensor(s.tokens)[None], [L], keep_all=True, prenorm=(L,)) for s in seqs]
    del target
    return {"serve": serve, "tokens": [s.tokens for s in seqs], "L": L,
            "hs": [torch.stack([h[0] for h in c.hidden_states], 1) for c in caps],  # [T, L+1, H]
            "prenorm": [c.aux[0][0] for c in caps], "target": repo_models / "target", "draft": repo_models / "draft"}


def _features(demo, out, fmt="specforge", *, hf=TRAIN_HF, edit=None, gz=False):
    slots = [h[:, hf].clone() for h in demo["hs"]]
    if edit:
        edit(slots)
    last = demo["prenorm"] if fmt == "speculators" else [h[:, demo["L"]] for h in demo["hs"]]
    return write_stored_features(out, fmt, demo["tokens"], slots, last, gz=gz)


def _record(run_cli, demo, features, out, *extra, code=0):
    res = run_cli("record", "train", "--target", demo["target"], "--draft", demo["draft"], "--features", features,
                  "-o", out, *NO_FLOOR, *extra)
    assert res.exit_code == code, res.output
    return res


def _diff(run_cli, a, b, code):
    res = run_cli("diff", a, b, "--format", "json", "--no-narrow")
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def correct(demo, run_cli, tmp_path_factory):
    """(features dir, features trace, a target replay of its tokens): SpecForge features at the training layers."""
    root = tmp_path_factory.mktemp("features")
    feats = _features(demo, root / "sf")
    trace = root / "features.trace"
    _record(run_cli, demo, feats, trace, "--aux-layers", "0,3,6")
    replay = root / "replay.trace"
    res = run_cli("record", "train", "--target", demo["target"], "--draft", demo["draft"], "--replay", trace,
                  "-o", replay, *NO_FLOOR)
    assert res.exit_code == 0, res.output
    return feats, trace, replay


def test_specdiff_reads_a_specforge_file_as_specforge_reads_it(demo, tmp_path):
    """Both files SpecForge writes (.ckpt by its own writer, .ckpt.gz as prepare_hidden_states compresses):
    specdiff's weights-only read holds exactly the tensors SpecForge's load_feature_file returns."""
    from specforge.runtime.data_plane.feature_store import load_feature_file

    for gz, name in ((False, "data_0.ckpt"), (True, "data_0.ckpt.gz")):
        path = _features(demo, tmp_path / name, gz=gz) / name
        theirs, ours = load_feature_file(str(path)), read_specforge_file(path)
        assert torch.equal(ours.aux_cat, theirs["aux_hidden_state"].squeeze(0))
        assert torch.equal(ours.last_hidden, theirs["hidden_state"].squeeze(0))
        assert np.array_equal(ours.tokens, theirs["input_ids"].numpy()) and not ours.last_prenorm
    assert find_features(tmp_path / "data_0.ckpt.gz").format == "specforge"


def test_the_seeds_mistake_in_stored_features_is_the_first_divergence_with_its_fix(demo, correct, run_cli):
    """Features at the training layers against the seed's serving (HF [3, 6, 7]): target.aux.0 first, named as
    the layer shift with serving's fix; the contract says what was read and where the layers came from."""
    _, trace, _ = correct
    c = open_trace(str(trace)).contract
    assert c["features"]["format"] == "specforge" and c["features"]["capture_layers"]["hf_indices"] == TRAIN_HF
    assert c["features"]["capture_layers"]["source"].startswith("--aux-layers 0,3,6")
    assert c["aux_concat_order"] == TRAIN_HF and c["target_structure"] == "unknown"
    assert not any(n.startswith("target.probe") for n in open_trace(str(trace)).names)  # no target ran
    report = _diff(run_cli, trace, demo["serve"], 1)
    first = report["first_divergence"]
    assert first["tensor"] == "target.aux.0", first
    lead = report["explanations"][0]
    assert lead["cause"] == "aux_layer_shift", lead
    assert "[-1, 2, 5]" in lead["fix"], lead["fix"]


def test_stored_features_and_a_target_replay_of_their_tokens_agree(correct, run_cli):
    """The correct pair: the stored features are what the target computes, exit 0."""
    _, trace, replay = correct
    report = _diff(run_cli, replay, trace, 0)
    assert report["first_divergence"] is None


@pytest.mark.parametrize("kind", ["shifted", "swapped"])
def test_feature_rows_of_another_token_or_request_are_named_with_their_rows(demo, correct, run_cli, tmp_path, kind):
    """Rows shifted by one position in request 1, or positions 10..39 exchanged between requests 0 and 1:
    named as such at target.aux, with the rows they mis-assign."""
    def shift(slots):
        slots[1][:-1] = slots[1][1:].clone()

    def swap(slots):
        slots[0][10:40], slots[1][10:40] = slots[1][10:40].clone(), slots[0][10:40].clone()

    feats = _features(demo, tmp_path / "f", edit=shift if kind == "shifted" else swap)
    trace = tmp_path / "features.trace"
    _record(run_cli, demo, feats, trace, "--aux-layers", "0,3,6")
    report = _diff(run_cli, correct[2], trace, 1)
    assert report["first_divergence"]["tensor"].startswith("target.aux"), report["first_divergence"]
    lead = report["explanations"][0]
    n = len(demo["tokens"][1])
    if kind == "shifted":
        assert lead["cause"] == "position_shift" and "rows shifted by 1 position" in lead["message"], lead
        assert lead["fix"].startswith("regenerate the stored features"), lead["fix"]
        assert f"B seq 1 pos 0..{n - 2} hold A's rows at pos 1..{n - 1}" in lead["message"], lead["message"]
    else:
        assert lead["cause"] == "aux_rows_swapped", lead
        assert "requests 0 and 1 exchanged rows" in lead["message"], lead["message"]
        assert "B seq 0 pos 10..39 hold A seq 1's rows at pos 10..39" in lead["message"], lead["message"]


def test_speculators_data_is_read_with_its_pre_norm_last_state_and_agrees(demo, correct, run_cli, tmp_path):
    """speculators' hs_{i}.safetensors (the last slice: vLLM id L, before the final norm) with the layers given
    in vLLM's numbering: the target's greedy tokens from the stored state agree with the replay's, exit 0."""
    feats = _features(demo, tmp_path / "data" / "hidden_states", "speculators")
    trace = tmp_path / "spec.trace"
    _record(run_cli, demo, tmp_path / "data", trace, "--aux-layers", "0,3,6", "--aux-convention", "vllm")
    f = open_trace(str(trace)).contract["features"]
    assert f["format"] == "speculators" and f["last_hidden"].startswith("before") and f["target_tensors"]["norm"]
    assert stored_prompts(feats) == [{"input_ids": [int(t) for t in s], "rid": f"hs_{i}.safetensors"}
                                     for i, s in enumerate(demo["tokens"])]
    report = _diff(run_cli, correct[2], trace, 0)
    assert report["first_divergence"] is None


def test_features_without_a_record_of_their_layers_are_refused_naming_the_option(demo, run_cli, tmp_path):
    """No layer is guessed: speculators keeps none beside its data, SpecForge's need its run's records."""
    spec = _features(demo, tmp_path / "spec", "speculators")
    res = _record(run_cli, demo, spec, tmp_path / "a.trace", code=2)
    assert "--aux-layers IDS --aux-convention vllm" in res.output and not (tmp_path / "a.trace").exists()
    sf = _features(demo, tmp_path / "sf")
    res = _record(run_cli, demo, sf, tmp_path / "b.trace", code=2)
    assert "--specforge-config RUN.yaml" in res.output, res.output
    res = _record(run_cli, demo, sf, tmp_path / "c.trace", "--aux-layers", "0,3", code=2)
    assert "the files hold 3 aux slots" in res.output, res.output


@pytest.mark.slow
def test_specforge_features_take_their_layers_from_the_offline_run_and_pair_with_serving(demo, run_cli, tmp_path):
    """No --aux-layers: SpecForge resolves the offline run's capture layers itself (the seed's served draft
    config, SGLang ids [2, 5, 6] = HF [3, 6, 7]); features holding those layers pair with the seed serving
    trace, which fed the same layers to the same draft: exit 0 against a real SGLang trace, no server run."""
    import yaml

    draft = demo["serve"].parent / "served-draft"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"target_model_path": str(demo["target"]), "draft_model_config": str(draft)},
                                      "data": {"hidden_states_path": str(tmp_path / "f")}, "run_id": "run",
                                      "output_dir": str(tmp_path / "out")}))
    feats = _features(demo, tmp_path / "f", hf=[3, 6, 7])
    trace = tmp_path / "features.trace"
    res = run_cli("record", "train", "--target", demo["target"], "--draft", draft, "--features", feats, "-o", trace,
                  "--specforge-config", config, *NO_FLOOR)
    assert res.exit_code == 0, res.output
    layers = open_trace(str(trace)).contract["features"]["capture_layers"]
    assert layers["ids"] == [2, 5, 6] and layers["hf_indices"] == [3, 6, 7], layers
    assert layers["source"].startswith(f"SpecForge's offline capture of {config.resolve()}"), layers["source"]
    report = _diff(run_cli, trace, demo["serve"], 0)
    assert report["first_divergence"] is None


def test_the_features_noise_floor_leaves_out_the_target_stages_it_cannot_rerun():
    """The re-run at the other precision runs the draft on the same stored rows: a target stage's floor of 0
    would be no measurement, so it is left out (the other side's floor is the pair's there)."""
    from specdiff.replay.record.noise_floor import without_target_floor
    from specdiff.replay.record.record_features import FEATURES_FLOOR_WHY

    floor = {"method": "the recorded bfloat16 forward re-run in float32", "sequences": 2,
             "tensors": {"target.aux.0": {"median_rel": 0.0, "p90_rel": 0.0, "rows": 9},
                         "draft.fc_out": {"median_rel": 0.003, "p90_rel": 0.004, "rows": 9}}}
    got = without_target_floor(floor, FEATURES_FLOOR_WHY)
    assert list(got["tensors"]) == ["draft.fc_out"]
    assert got["method"].endswith(f"target.* not measured: {FEATURES_FLOOR_WHY}")
    unmeasured = {"method": None, "unmeasured": "x"}
    assert without_target_floor(unmeasured, FEATURES_FLOOR_WHY) == unmeasured


def test_record_client_takes_prompts_or_stored_features_not_both(run_cli, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2, 3]}\n')
    for args in (("--prompts", prompts, "--prompts-from-features", tmp_path), ()):
        res = run_cli("record", "client", "--url", "http://127.0.0.1:9", *args)
        assert res.exit_code == 2 and "exactly one of --prompts" in res.output, res.output
    res = run_cli("record", "client", "--url", "http://127.0.0.1:9", "--prompts-from-features", tmp_path, "--chat")
    assert res.exit_code == 2 and "leave --chat out" in res.output, res.output
