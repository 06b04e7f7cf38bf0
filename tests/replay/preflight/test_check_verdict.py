"""``specdiff check``'s verdict follows the engine the user serves with (a correct draft passes).

The engine asked for (``--engine sglang|vllm``) is judged; without one (``--engine all``, the
default) the engines the draft's config is written for are (``eagle3.config_ids.draft_engines``:
SGLang's ``eagle_config`` ids, vLLM's top-level ids / ``dflash_config`` / the speculators layout),
and the other engine's line and findings are information that never fails the check. Without
``--training-layers`` the check says it could not compare the aux layers with the trained ones.
On the committed pair (``traces/models``) and copies of its draft with other config keys.
"""

from __future__ import annotations

import json
import os

import pytest

from specdiff.eagle3.config_ids import draft_engines
from specdiff.replay.preflight.check import run_preflight


def _draft_copy(repo_models, tmp_path, edit) -> str:
    """The committed draft's config edited by ``edit(config)``, its weights linked."""
    out = tmp_path / "draft"
    out.mkdir()
    os.symlink(repo_models / "draft" / "model.safetensors", out / "model.safetensors")
    cfg = json.loads((repo_models / "draft" / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def _json(run_cli, *args):
    r = run_cli("check", *args, "--format", "json")
    return r.exit_code, json.loads(r.stdout)


# ---- item 1: the README's example on the committed (SGLang-format, correct) pair ------------------
def test_readme_example_passes_the_committed_sglang_draft(repo_models, run_cli):
    r = run_cli("check", "--target", repo_models / "target", "--draft", repo_models / "draft")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    sg = next(ln for ln in lines if ln.startswith("  SGLang 0.5.23") and "eagle_config ids" in ln)
    vl = next(ln for ln in lines if ln.startswith("  vLLM 0.32.0") and "eagle_config ids" in ln)
    assert sg.endswith("[3/3 slots, ok]")
    assert vl.endswith("[2/3 slots, would CRASH; not for this engine]")  # what would break, as information
    verdict = [ln for ln in lines if ln.startswith(("  SGLang 0.5.23  ", "  vLLM 0.32.0    "))][-2:]
    assert verdict[0].startswith("  SGLang 0.5.23  ok: 0 error(s)")
    assert verdict[1].startswith("  vLLM 0.32.0    not for this engine (information): 3 error(s) if served there")
    assert lines[-1].startswith("0 error(s)")


def test_the_correct_draft_prints_no_error_row_above_its_0_errors(repo_models, run_cli):
    # the vLLM findings of an SGLang draft are information: their severity is shown in parentheses and the
    # summary says they were not counted, so no "error" row sits above "ok: 0 error(s)"
    r = run_cli("check", "--target", repo_models / "target", "--draft", repo_models / "draft")
    lines = r.output.splitlines()
    assert r.exit_code == 0 and not [ln for ln in lines if ln.startswith(("error ", "warn "))]
    uncounted = [ln.split()[0] for ln in lines if ln.startswith("(")]
    assert sorted(uncounted) == ["(error)", "(error)", "(error)", "(info)", "(warn)"]
    assert lines[-1] == "0 error(s), 0 warning(s), 2 info (not counted, information: vLLM 0.32.0 3 error(s), " \
                        "1 warning(s), 2 info)"


def test_readme_example_json_verdicts(repo_models, run_cli):
    code, d = _json(run_cli, "--target", repo_models / "target", "--draft", repo_models / "draft")
    assert code == 0
    assert d["draft_for"]["engines"] == ["sglang"] and d["judged_engines"] == ["sglang"]
    assert d["verdicts"]["sglang"]["outcome"] == "ok"
    assert d["verdicts"]["vllm"] == {"engine": "vllm", "judged": False, "outcome": "not for this engine",
                                     "counts": {"error": 3, "warn": 1, "info": 2}}
    assert d["counts"]["error"] == 0
    # every vLLM error is still reported, marked as not counted
    assert {f["kind"] for f in d["findings"] if f["engine"] == "vllm" and f["severity"] == "error"} == \
        {"aux.dropped_id", "aux.slot_count", "aux.sglang_ids"}
    assert not [f for f in d["findings"] if f["engine"] == "vllm" and f["judged"]]


@pytest.mark.parametrize("engine,code", [("sglang", 0), ("vllm", 1), ("all", 0)])
def test_the_engine_asked_for_is_judged(repo_models, run_cli, engine, code):
    r = run_cli("check", "--target", repo_models / "target", "--draft", repo_models / "draft", "--engine", engine)
    assert r.exit_code == code, r.output
    if engine == "vllm":  # asked for: judged even though the draft is written for SGLang, and it says so
        assert "  vLLM 0.32.0    FAILS: 3 error(s)" in r.output
        assert "verdict for vLLM, the engine asked for (--engine vllm); the draft is written for SGLang" in r.output


# ---- which engines a draft is written for, from its config keys ------------------------------------
@pytest.mark.parametrize("raw,fmt,want", [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 5]}}, "specforge", ("sglang",)),
    ({"eagle_aux_hidden_state_layer_ids": [0, 3, 6]}, "specforge", ("vllm",)),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 5]},
      "eagle_aux_hidden_state_layer_ids": [0, 3, 6]}, "specforge", ("sglang", "vllm")),
    ({"dflash_config": {"target_layer_ids": [0, 3, 6]}}, "specforge", ("vllm",)),
    ({}, "specforge", ("sglang", "vllm")),  # no ids: each engine's default layers
    ({}, "speculators", ("vllm",)),  # SGLang has no model class for it
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": "2,5,6"}}, "specforge", ("sglang",)),  # malformed: still SGLang's key
    ({}, None, ("sglang", "vllm")),  # not EAGLE-3: every engine
])
def test_draft_engines_from_the_keys_the_config_carries(raw, fmt, want):
    got = draft_engines(raw, fmt)
    assert got.engines == want and got.why


def test_a_vllm_format_draft_passes_without_failing_on_sglang(repo_models, tmp_path, run_cli):
    # ids only at the top level, in vLLM's numbering: SGLang would ignore them (an error there), vLLM reads them
    draft = _draft_copy(repo_models, tmp_path, lambda c: (c.pop("eagle_config"),
                                                          c.update(eagle_aux_hidden_state_layer_ids=[0, 3, 6])))
    code, d = _json(run_cli, "--target", repo_models / "target", "--draft", draft)
    assert code == 0
    assert d["judged_engines"] == ["vllm"] and d["verdicts"]["vllm"]["outcome"] == "ok"
    assert any(f["kind"] == "aux.ignored_key" and f["engine"] == "sglang" and not f["judged"] for f in d["findings"])
    assert run_cli("check", "--target", repo_models / "target", "--draft", draft, "--engine", "sglang").exit_code == 1


def test_a_draft_for_both_engines_fails_when_either_is_wrong(repo_models, tmp_path, run_cli):
    # both keys written, vLLM's shifted by one and holding -1: judged for both, vLLM's error fails the check
    draft = _draft_copy(repo_models, tmp_path, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[-1, 2, 5]))
    code, d = _json(run_cli, "--target", repo_models / "target", "--draft", draft)
    assert code == 1
    assert d["judged_engines"] == ["sglang", "vllm"]
    assert d["verdicts"]["sglang"]["outcome"] == "ok" and d["verdicts"]["vllm"]["outcome"] == "error"


def test_a_speculators_draft_is_judged_for_vllm_only(repo_models, tmp_path, run_cli):
    from specdiff.replay.model.checkpoint import load_draft, save_draft
    out = save_draft(load_draft(repo_models / "draft").model, tmp_path / "spec", "speculators", target_num_layers=8)
    report = run_preflight(repo_models / "target", out)
    assert report.judged == ("vllm",) and not report.failing
    assert [f.kind for f in report.errors] == ["format.unsupported"]  # reported, for SGLang, not counted
    r = run_cli("check", "--target", repo_models / "target", "--draft", out)
    assert r.exit_code == 0, r.output
    assert "  SGLang 0.5.23  not for this engine (information): cannot load this checkpoint" in r.output


# ---- item 2: what could not be checked, and the flag that checks it -------------------------------
def test_shifted_ids_without_training_layers_say_they_were_not_checked(repo_models, run_cli):
    seed_draft = repo_models.parent / "examples" / "seed" / "served-draft"  # the trained draft, ids [2, 5, 6]
    if not seed_draft.is_dir():
        pytest.skip("the shipped example pair is absent")
    args = ("--target", repo_models / "target", "--draft", seed_draft)
    r = run_cli("check", *args)
    assert r.exit_code == 0, r.output  # nothing in the files alone shows the shift
    line = next(ln for ln in r.output.splitlines() if ln.startswith("not checked: "))
    assert "trained on" in line and "--training-layers" in r.output
    code, d = _json(run_cli, *args)
    assert code == 0 and [u["flag"] for u in d["not_checked"]] == ["--training-layers"]
    # with the flag the shift is found, and nothing is left unchecked
    code, d = _json(run_cli, *args, "--training-layers", "0,3,6")
    assert code == 1 and d["not_checked"] == []
    assert any(f["kind"] == "training.mismatch" and f["engine"] == "sglang" for f in d["findings"])
    r = run_cli("check", *args, "--training-layers", "0,3,6")
    assert "not checked:" not in r.output
