"""The diff's pre-flight section does not depend on the working directory: the
shipped pair's contracts name repo-relative model paths, found from the traces' own folders; a pair
moved away from its models says which paths it could not find instead of dropping the section."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
SEED = ROOT / "traces" / "examples" / "seed"

pytestmark = pytest.mark.skipif(not (SEED / "serve.trace").exists(), reason="the shipped example pair is absent")


def _diff(run_cli, train, serve):
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 1, r.output  # the seed diverges
    return json.loads(r.stdout)


def test_pre_flight_findings_from_another_working_directory(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)  # the contracts' traces/models/target is not under it
    d = _diff(run_cli, SEED / "train.trace", SEED / "serve.trace")
    assert [(f["kind"], f["engine"]) for f in d["preflight_findings"]] == [("training.mismatch", "sglang")]
    assert "paths_not_found" not in d


def test_a_moved_pair_says_which_paths_it_could_not_find(tmp_path, monkeypatch, run_cli):
    for side in ("train", "serve"):
        shutil.copytree(SEED / f"{side}.trace", tmp_path / f"{side}.trace")
    monkeypatch.chdir(tmp_path)
    d = _diff(run_cli, "train.trace", "serve.trace")
    assert d["preflight_findings"] == []
    missing = d["paths_not_found"]
    assert [m.split(" recorded in ")[0] for m in missing] == [
        "training: draft_name traces/models/draft", "serving: model_name traces/models/target",
        "serving: draft_name traces/examples/seed/served-draft"]
    assert missing[0].endswith("the training draft cannot be re-run; give it: specdiff diff train.trace "
                               "serve.trace --draft DIR")
    assert all("pre-flight check" in m for m in missing[1:])
    r = run_cli("diff", "train.trace", "serve.trace", "--format", "text")
    assert "paths not found here (what needs them is left out)" in r.stdout


def test_the_draft_given_with_draft_is_not_asked_for_again(tmp_path, monkeypatch, run_cli):
    # a newcomer gave --draft as the line said, and the line still said to give it
    for side in ("train", "serve"):
        shutil.copytree(SEED / f"{side}.trace", tmp_path / f"{side}.trace")
    monkeypatch.chdir(tmp_path)
    r = run_cli("diff", "train.trace", "serve.trace", "--format", "json", "--draft", ROOT / "traces" / "models" / "draft")
    missing = json.loads(r.stdout)["paths_not_found"]
    assert [m.split(" recorded in ")[0] for m in missing] == [
        "serving: model_name traces/models/target", "serving: draft_name traces/examples/seed/served-draft"]
