"""Contract paths (tracer/paths.py): recorders write local paths absolute (or relative to
``SPECDIFF_RECORD_RELATIVE_TO``), readers find a relative one from the trace's folders whatever the
working directory, and say which one they could not find."""

from __future__ import annotations

from types import SimpleNamespace

from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.paths import RELATIVE_TO_ENV, contract_path, is_model_dir, recorded_path


def _model(d):
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def test_recorded_path_is_absolute_for_a_local_dir_and_as_given_otherwise(tmp_path, monkeypatch):
    _model(tmp_path / "models" / "target")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RELATIVE_TO_ENV, raising=False)
    assert recorded_path("models/target") == str(tmp_path / "models" / "target")
    assert recorded_path("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"  # a hub id names nothing here
    assert recorded_path("s3://bucket/x.trace") == "s3://bucket/x.trace"
    assert recorded_path(None) == ""


def test_recorded_path_relative_to_a_root_for_shipped_traces(tmp_path, monkeypatch):
    _model(tmp_path / "repo" / "models" / "target")
    _model(tmp_path / "elsewhere" / "draft")
    monkeypatch.chdir(tmp_path / "repo")
    monkeypatch.setenv(RELATIVE_TO_ENV, str(tmp_path / "repo"))
    assert recorded_path("models/target") == "models/target"
    assert recorded_path(str(tmp_path / "elsewhere" / "draft")) == str(tmp_path / "elsewhere" / "draft")  # not under it


def _trace(path, **contract):
    return SimpleNamespace(path=str(path), contract=contract)


def test_a_relative_path_is_found_from_the_traces_folders_in_any_working_directory(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    target = _model(repo / "traces" / "models" / "target")
    trace = _trace(repo / "traces" / "examples" / "seed" / "serve.trace", model_name="traces/models/target")
    for cwd in (repo, tmp_path, target):
        monkeypatch.chdir(cwd)
        found = contract_path(trace, "model_name", want=is_model_dir)
        assert found.path is not None and found.path.resolve() == target.resolve() and not found.missing


def test_a_path_not_found_says_which_and_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = _trace(tmp_path / "moved" / "serve.trace", model_name="traces/models/target",
                   draft_name=str(tmp_path / "gone"), engine=UNKNOWN)
    rel = contract_path(trace, "model_name", want=is_model_dir)
    assert rel.missing and rel.path is None
    assert rel.message().startswith(f"model_name traces/models/target recorded in {tmp_path / 'moved' / 'serve.trace'} "
                                    "is not found here (relative: looked under the trace's folder")
    assert contract_path(trace, "draft_name", want=is_model_dir).missing
    absent = contract_path(trace, "replay_of")
    assert absent.recorded is None and not absent.missing
