"""record train --features (replay/record/record_features.py): a trainer's stored features as the training
side, written in each trainer's own file format from the committed demo target's real hidden states, and
specdiff never loading the target on the features side.

The sequences are the shipped seed serving trace's (traces/examples/seed/serve.trace: served with HF [3, 6, 7]
while the demo draft was trained on HF [0, 3, 6]); a target replay of the same tokens (record train
--replay of the features trace) is the other side of the row-owner pairs, and the seed serving trace itself
the other side of the seed's mistake. The draft stages are also computed by a trainer's own forward
(``--trainer``), and features that are not what the target computes at the recorded layers (another revision's
weights, other layers) are diffed against a target replay that measured its noise floor.
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
    from specdiff.replay.record.sequences import sequences_from_trace

    serve = repo_models.parent / "examples" / "seed" / "serve.trace"
    seqs, _ = sequences_from_trace(str(serve))
    tokens = [s.tokens for s in seqs]
    return {"serve": serve, "tokens": tokens, **_hidden_states(repo_models / "target", tokens),
            "target": repo_models / "target", "draft": repo_models / "draft"}


def _hidden_states(target_dir, tokens) -> dict:
    """The target at ``target_dir`` run on each of ``tokens`` (bf16): ``hs`` [T, L+1, H] every HF hidden state,
    ``prenorm`` [T, H] the last layer's output before the final norm, ``L``."""
    from specdiff.replay.model.target_capture import capture_target, load_target

    target = load_target(target_dir)
    L = target.config.num_hidden_layers
    caps = [capture_target(target, torch.as_tensor(t)[None], [L], keep_all=True, prenorm=(L,)) for t in tokens]
    return {"L": L, "hs": [torch.stack([h[0] for h in c.hidden_states], 1) for c in caps],
            "prenorm": [c.aux[0][0] for c in caps]}


def _features(demo, out, fmt="specforge", *, hf=TRAIN_HF, edit=None, gz=False, states=None):
    """``demo``'s tokens with the hidden states of ``states`` (``_hidden_states``; default the demo target's) at
    HF ``hf``, written in ``fmt``'s files at ``out``."""
    states = states or demo
    slots = [h[:, hf].clone() for h in states["hs"]]
    if edit:
        edit(slots)
    last = states["prenorm"] if fmt == "speculators" else [h[:, states["L"]] for h in states["hs"]]
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


@pytest.mark.parametrize(("fmt", "trainer"), [("specforge", "specforge"), ("speculators", "specforge"),
                                              ("speculators", "speculators")])
def test_a_trainers_own_draft_forward_on_the_stored_features(demo, correct, run_cli, tmp_path, fmt, trainer):
    """--features with --trainer: the draft stages are the trainer's own forward on the stored rows. The trace
    names the trainer that ran (trainer, trainer_class, engine) and its features; on the correct features its
    every draft stage agrees with the reference forward on the same stored rows (speculators' rope offset removed
    as the recorded shift it is), and the pair against a target replay of the tokens is clean, exit 0."""
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.trainers.registry import trainer_version

    speculators = fmt == "speculators"
    feats = _features(demo, tmp_path / "data" / "hidden_states" if speculators else tmp_path / "sf", fmt)
    trace = tmp_path / f"{trainer}.trace"
    conv = ("--aux-convention", "vllm") if speculators else ()
    res = run_cli("record", "train", "--target", demo["target"], "--draft", demo["draft"], "--features",
                  tmp_path / "data" if speculators else feats, "-o", trace, "--aux-layers", "0,3,6", *conv,
                  "--trainer", trainer)  # with the noise floor: the trainer's draft re-run at float32
    assert res.exit_code == 0, res.output
    c = open_trace(str(trace)).contract
    floor = c["noise_floor"]
    assert floor.get("tensors") and not any(n.startswith("target.") for n in floor["tensors"]), floor
    assert "draft.fc_out" in floor["tensors"] and floor["method"].startswith("the recorded "), floor
    assert (c["trainer"], c["engine"], c["trainer_version"]) == (trainer, trainer, trainer_version(trainer)), c
    assert c["trainer_class"].endswith("LlamaForCausalLMEagle3" if trainer == "specforge" else "Eagle3DraftModel")
    assert c["features"]["format"] == fmt and c["features"]["capture_layers"]["hf_indices"] == TRAIN_HF
    report = diff_traces(str(trace), str(correct[1]), narrow=False)  # the reference on the same stored rows
    assert report.first is None, report.first.name
    draft = {"draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.attn_in", "draft.positions",
             "draft.hidden_out", "draft.logits_topk.values", "draft.logsumexp", "draft.topk_target"}
    assert set(report.comparisons) >= draft, sorted(report.comparisons)
    assert not any(report.comparisons[n].diverged for n in draft)
    shift = report.comparisons["draft.positions"].stats.get("recorded_shift")
    assert shift == ([1, 0] if trainer == "speculators" else None), shift
    assert _diff(run_cli, correct[2], trace, 0)["first_divergence"] is None


@pytest.fixture(scope="module")
def floored(demo, correct, run_cli, tmp_path_factory):
    """A target replay of the features' tokens with its noise floor (the floor a systematic shift is judged
    against: the features side measures none at target.*)."""
    out = tmp_path_factory.mktemp("floored") / "replay.trace"
    res = run_cli("record", "train", "--target", demo["target"], "--draft", demo["draft"], "--replay", correct[1],
                  "-o", out)
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def mismatched(demo, floored, run_cli, tmp_path_factory, other_layer_target) -> dict:
    """Two kinds of features that are not what the user's target computes at the recorded layers, each recorded
    against that target and diffed against its replay of their tokens (``floored``): kind -> diff report.

    ``revision``: stored by a target whose layer-5 weights differ (another revision: moved by 0.4 of their std,
    ``other_layer_target``); ``layers``: the demo target's own states at HF [3, 6, 7] where the records say
    [0, 3, 6]; ``permuted``: its states at HF [3, 0, 6] (two slots swapped)."""
    root = tmp_path_factory.mktemp("mismatched")
    other = other_layer_target(demo["target"], root / "target-rev", layer=5, scale=0.4)
    files = {"revision": _features(demo, root / "rev", states=_hidden_states(other, demo["tokens"])),
             "layers": _features(demo, root / "layers", hf=[3, 6, 7]),
             "permuted": _features(demo, root / "permuted", hf=[3, 0, 6])}
    reports = {}
    for kind, feats in files.items():
        trace = root / f"{kind}.trace"
        _record(run_cli, demo, feats, trace, "--aux-layers", "0,3,6")
        reports[kind] = _diff(run_cli, floored, trace, 1)
    return reports


def test_features_of_another_target_revision_are_a_shift_at_the_layers_after_the_change(mismatched):
    """Another revision's features: target.aux.2 (HF 6, the output of the moved layer 5) diverges first as a
    systematic shift over the floor (its rows inside rel 0.05), the slots before it agree, and the contracts
    agree (the features trace records the user's target: only the stored rows came from another revision)."""
    report = mismatched["revision"]
    first = report["first_divergence"]
    assert first["tensor"] == "target.aux.2", first
    for slot in ("target.aux.0", "target.aux.1"):
        assert not report["tensors"][slot]["diverged"], slot
    assert first["stats"]["shift"]["fired"], first["stats"]
    lead = report["explanations"][0]
    assert lead["cause"] == "systematic_shift" and lead["message"].startswith("target.aux.2 is shifted"), lead
    assert not [m for m in report["contract_mismatches"] if m["field"].startswith("target_weights")]


def test_features_of_other_layers_are_the_layer_shift_with_the_layers_the_files_hold(mismatched):
    """Features of other layers: target.aux.0 first, named as the layer shift with the HF layer each stored slot
    holds (the replay probes every layer)."""
    report = mismatched["layers"]
    assert report["first_divergence"]["tensor"] == "target.aux.0", report["first_divergence"]
    lead = report["explanations"][0]
    assert lead["cause"] == "aux_layer_shift", lead
    for j, hf in enumerate((3, 6, 7)):
        assert f"B slot {j} = A HF hidden_states[{hf}]" in lead["message"], lead["message"]


@pytest.mark.parametrize("kind", ["revision", "layers", "permuted"])
def test_the_cause_of_mismatched_features_names_the_stored_features(mismatched, kind):
    """The fix of a layer shift or a systematic shift on a features trace is in the stored files (the draft
    config's ids or the target's weights were the fix before: the wrong place; explain/stored_features.py)."""
    lead = mismatched[kind]["explanations"][0]
    assert lead["fix"].startswith("the stored features (") and "features in " in lead["fix"], lead
    assert ("--aux-layers" in lead["fix"]) == (kind != "revision"), lead["fix"]
