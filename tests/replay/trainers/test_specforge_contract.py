"""What SpecForge 0.2.0 recorded of a training run, read by ``record train`` as training-side facts
(replay/record/specforge_contract.py) and reported by ``diff``.

Every checkpoint here is written by SpecForge's own code, as its training writes one: the run config
through ``specforge.config.load_config`` (YAML), the model bundle (draft, training model, resume contract
with the model provenance) by ``training/assembly.py`` ``build_model_bundle``, the payload by
``TrainerController.save_checkpoint`` (training/controller.py:839-885) through its ``CheckpointManager``;
only the trainer's eight standard resume fields (training/trainer.py:247-256) are spelled out here.
The draft is exported by SpecForge's own ``export_to_sglang``. ``record train`` runs through the CLI on the
seed serving trace's sequences; ``diff`` is the real one against that serving trace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.record.specforge_contract import STATE_FILE, read_checkpoint
from specdiff.replay.trainers.registry import trainer_version
from specdiff.tracer.store import open_trace

pytestmark = pytest.mark.skipif(trainer_version("specforge") is None,
                                reason="specforge is not installed (pip install --no-deps specforge==0.2.0; make install)")

FIELD = "specforge_contract"
FAST = ("--no-noise-floor", "--probe-positions", "0")


def _mooncake(out: Path) -> dict:
    """An online run's disaggregated deployment (SpecForge 0.2.0 accepts online training only so: config/schema.py)."""
    return {"mode": "disaggregated", "disaggregated": {
        "control_dir": str(out / "control"), "backend": "mooncake", "server_urls": ["http://127.0.0.1:30000"],
        "mooncake_metadata_server": "http://127.0.0.1:8080/metadata", "mooncake_master_server_addr": "127.0.0.1:50051"}}


def specforge_run(out: Path, target: Path, draft: Path, *, aux=None, step: int = 10) -> tuple[Path, Path]:
    """A SpecForge EAGLE-3 run config (``out/run.yaml``) warm-starting ``draft`` against ``target``, and the
    checkpoint SpecForge writes for it at ``step`` (module doc): returns (config, checkpoint directory)."""
    import yaml
    from safetensors.torch import load_file
    from specforge.application.composition import resolve_run
    from specforge.config import load_config
    from specforge.training.assembly import build_model_bundle
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerController, TrainerCore

    out.mkdir(parents=True)
    sd = load_file(str(draft / "model.safetensors"))
    torch.save({"t2d": sd["t2d"], "d2t": sd["d2t"]}, out / "vocab_mapping.pt")  # modeling/draft/base.py:193-206
    model = {"target_model_path": str(target), "draft_model_config": str(draft), "draft_checkpoint_path": str(draft),
             "vocab_mapping_path": str(out / "vocab_mapping.pt"), **({} if aux is None else {"aux_hidden_state_layer_ids": aux})}
    config = out / "run.yaml"
    config.write_text(yaml.safe_dump({"model": model, "data": {"train_data_path": str(out / "train.jsonl")},
                                      "run_id": "run", "output_dir": str(out / "outputs"), "deployment": _mooncake(out)}))
    run = resolve_run(load_config(str(config)))
    with contextlib.redirect_stdout(sys.stderr):
        bundle = build_model_bundle(run.config, algorithm=run.algorithm)
    backend = FSDPTrainingBackend(ParallelConfig.from_distributed())
    wrapped = backend.prepare_model(bundle.model, wrap=False, optimizer_target=bundle.draft_model)
    runtime = bundle.strategy_kwargs
    strategy = run.algorithm.providers.step.build(wrapped, target_head=bundle.target_head, **dict(runtime))
    standard = {"dataset_size": None, "batch_size": 1, "accumulation_steps": 1, "num_epochs": 1,
                "effective_total_steps": step, "tp_size": 1, "sp_ulysses_size": 1, "sp_ring_size": 1}
    controller = TrainerController(TrainerCore(strategy, backend), run_id="run", output_dir=str(out / "outputs"),
                                   checkpoint_extra={**standard, **runtime.resume_contract})
    ckpt = Path(controller.save_checkpoint(step).checkpoint_uri.removeprefix("file://"))
    return config, ckpt


def export(ckpt: Path, draft: Path, out: Path) -> Path:
    """SpecForge's exporter (export/to_sglang.py) of ``ckpt`` with ``draft``'s config, into ``out``."""
    from specforge.export.to_sglang import export_to_sglang

    with contextlib.redirect_stdout(sys.stderr):
        export_to_sglang(str(ckpt), str(draft / "config.json"), str(out))
    return out


@pytest.fixture(scope="module")
def seed(repo_models):
    """(target, the seed's served draft: SGLang ids [2, 5, 6] = HF [3, 6, 7], the seed serving trace)."""
    ex = repo_models.parent / "examples" / "seed"
    return repo_models / "target", ex / "served-draft", ex / "serve.trace"


def _record(run_cli, target, draft, serve, out, *extra):
    res = run_cli("record", "train", "--target", target, "--draft", draft, "--replay", serve, "-o", out, *FAST, *extra)
    assert res.exit_code == 0, res.output
    return res, open_trace(str(out)).contract[FIELD]


def _leading(report) -> list[str]:
    """The report's verdict and the block before the first divergence / contract blocks."""
    text = render_text(report, width=400).splitlines()
    return text[: text.index("contract")]


@pytest.mark.slow
def test_provenance_and_capture_contract_that_match_the_recording_add_no_warning(seed, tmp_path, run_cli):
    target, draft, serve = seed
    config, ckpt = specforge_run(tmp_path / "sf", target, draft)
    exported = export(ckpt, draft, ckpt / "sglang")  # found: the draft sits in the checkpoint directory
    res, sf = _record(run_cli, target, exported, serve, tmp_path / "t.trace", "--specforge-config", config)
    assert sf["disagreements"] == [], sf["disagreements"]
    assert sf["checkpoint"]["file"] == str((ckpt / STATE_FILE).resolve())
    assert sf["checkpoint"]["found_in"] == "the draft directory's parent" and sf["checkpoint"]["global_step"] == 10
    prov = sf["checkpoint"]["model_provenance"]
    assert prov["capture_layers"] == [2, 5, 6] and prov["torch_dtype"] == "bfloat16"  # as SpecForge recorded them
    assert prov["target_model"][1] == str(target.resolve())
    assert sf["capture_contract"]["aux_layer_ids"] == [2, 5, 6] and sf["capture_contract"]["method"] == "eagle3"
    assert all(v.startswith("agrees") for v in sf["checked"].values()), sf["checked"]
    assert {"model_provenance.target_model", "model_provenance.capture_layers", "model_provenance.torch_dtype",
            "capture_contract.aux_layer_ids", "capture_contract.target_hidden_size"} <= set(sf["checked"])
    assert "read SpecForge's model provenance" in res.stderr and FIELD not in res.stderr
    report = diff_traces(str(tmp_path / "t.trace"), str(serve), narrow=False)
    assert report.first is None and not [m for m in report.contract if m.field.startswith(FIELD)]
    assert report.silent_warnings() == []


@pytest.mark.slow
def test_capture_layers_other_than_the_recordings_are_named_with_the_fix(seed, tmp_path, run_cli):
    target, draft, serve = seed
    config, ckpt = specforge_run(tmp_path / "sf", target, draft, aux=[1, 4, 5])  # SpecForge ids = HF [2, 5, 6]
    _, sf = _record(run_cli, target, draft, serve, tmp_path / "t.trace", "--specforge-checkpoint", ckpt,
                    "--specforge-config", config)
    found = {d["fact"]: d for d in sf["disagreements"]}
    assert set(found) == {"model_provenance.capture_layers", "capture_contract.aux_layer_ids"}, found
    d = found["model_provenance.capture_layers"]
    assert (d["specforge"], d["recording"]) == ([1, 4, 5], [3, 6, 7])
    assert "HF [2, 5, 6]" in d["message"] and "--aux-layers 1,4,5 --aux-convention specforge" in d["fix"]
    assert "eagle_aux_hidden_state_layer_ids [1, 4, 5]" in d["fix"]  # SGLang's plus-one numbering of HF [2, 5, 6]
    report = diff_traces(str(tmp_path / "t.trace"), str(serve), narrow=False)
    assert report.first is None  # the recording itself agrees with serving: the warning is the checkpoint's
    named = [m for m in report.silent_warnings() if m.field == f"{FIELD}.model_provenance.capture_layers"]
    assert len(named) == 1 and named[0].fix == d["fix"] and named[0].severity == "warn"
    assert any(f"{FIELD}.model_provenance.capture_layers" in line for line in _leading(report))


@pytest.mark.slow
def test_a_checkpoint_trained_against_another_target_leads_the_report(seed, tmp_path, run_cli):
    target, draft, serve = seed
    other = tmp_path / "other-target"
    shutil.copytree(target, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "use_cache": not cfg["use_cache"]}))
    _, ckpt = specforge_run(tmp_path / "sf", other, draft)
    export(ckpt, draft, ckpt)  # found: the checkpoint directory is the draft directory
    _, sf = _record(run_cli, target, ckpt, serve, tmp_path / "t.trace")
    assert sf["checkpoint"]["found_in"] == "the draft directory"
    assert [d["fact"] for d in sf["disagreements"]] == ["model_provenance.target_model"], sf["disagreements"]
    d = sf["disagreements"][0]
    assert d["specforge"] == str(other.resolve()) and "config.json sha256" in d["message"]
    assert "model.safetensors" not in d["message"]  # the weights are the same bytes: only the config differs
    report = diff_traces(str(tmp_path / "t.trace"), str(serve), narrow=False)
    field = f"{FIELD}.model_provenance.target_model"
    assert report.first is None and f"but the contract differs: {field}" in report.verdict()
    lead = _leading(report)
    assert lead[2].startswith("contract warnings") and lead[3].startswith(f"  [warn] {field}: training: "), lead


@pytest.mark.slow
def test_a_target_differing_only_in_mtime_is_the_same_target_and_another_dtype_is_named(seed, tmp_path, run_cli):
    from specforge.training.provenance import model_source_identity

    target, draft, serve = seed
    copy = tmp_path / "copied-target"
    shutil.copytree(target, copy)
    shard = copy / "model.safetensors"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns - 86_400 * 10**9))  # a day older
    _, ckpt = specforge_run(tmp_path / "sf", copy, draft)
    _, sf = _record(run_cli, target, draft, serve, tmp_path / "t.trace", "--specforge-checkpoint", ckpt / STATE_FILE,
                    "--dtype", "float32")
    saved = sf["checkpoint"]["model_provenance"]["target_model"]
    here = model_source_identity(str(target))
    stat = {r[1]: r for r in saved[2] if r[0] == "stat"}
    assert stat["model.safetensors"][3] != {r[1]: r for r in here[2]}["model.safetensors"][3]  # the mtimes differ
    assert sf["checked"]["model_provenance.target_model"].startswith("agrees"), sf["checked"]
    assert [d["fact"] for d in sf["disagreements"]] == ["model_provenance.torch_dtype"], sf["disagreements"]
    d = sf["disagreements"][0]
    assert (d["specforge"], d["recording"]) == ("bfloat16", "float32") and d["fix"] == "record training with --dtype bfloat16"


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a torch file\n" * 8)


def _truncated(path: Path) -> None:
    torch.save({"draft_state_dict": {"fc.weight": torch.zeros(64, 64)}}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


class _Opaque:
    """A Python object: torch.load(weights_only=True) refuses to unpickle it."""


def _pickled_object(path: Path) -> None:
    torch.save({"specforge_model_provenance": _Opaque()}, path)


def _foreign(path: Path) -> None:
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3}, path)


@pytest.mark.parametrize("make, given", [(_garbage, False), (_truncated, False), (_pickled_object, True),
                                         (_foreign, True), (_garbage, True)])
def test_an_unreadable_or_foreign_training_state_is_one_line_and_nothing_is_written(seed, tmp_path, run_cli,
                                                                                      make, given):
    target, draft, serve = seed
    d = tmp_path / "draft"
    d.mkdir()
    shutil.copy(draft / "config.json", d)
    (d / "model.safetensors").symlink_to((draft / "model.safetensors").resolve())
    make(d / STATE_FILE)
    out = tmp_path / "t.trace"
    extra = ("--specforge-checkpoint", d) if given else ()
    res = run_cli("record", "train", "--target", target, "--draft", d, "--replay", serve, "-o", out, *extra)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(d / STATE_FILE) in lines[0], res.stderr
    assert ("move it out of the draft directory" in lines[0]) != given  # what to do, for how it was found
    assert not out.exists()


def test_a_found_training_state_without_provenance_is_a_note_not_a_fact(tmp_path):
    assert read_checkpoint(tmp_path) == (None, [])  # none there, none in its parent
    _foreign(tmp_path / STATE_FILE)
    for draft, where in ((tmp_path, "(the draft directory)"), (tmp_path / "exported", "(the draft directory's parent)")):
        record, notes = read_checkpoint(draft)
        assert record is None and len(notes) == 1, notes
        assert where in notes[0] and "holds no specforge_model_provenance" in notes[0]
