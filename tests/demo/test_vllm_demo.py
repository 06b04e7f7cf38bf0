"""``specdiff demo --engine vllm``: the demo's scenarios in vLLM's key and numbering,
served by a real vLLM 0.32.0 CPU engine from the vLLM venv (``.venv-vllm``, ``make vllm-venv``).

One engine start per scenario run (the demo starts and stops its server, as a user's run does):
50-210 s on the project's 2-core machines, so only the seed runs here; the scenario table itself
(ids, keys, what vLLM captures) is checked without an engine.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdiff.demo.scenarios import (
    SCENARIOS,
    TRAINED_HF,
    describe,
    scenario_for,
    scenario_ids,
    write_served_draft,
)
from specdiff.eagle3.aux_layers import engine_capture
from specdiff.eagle3.config_ids import config_aux_ids
from specdiff.eagle3.config_keys import KEY_NESTED, KEY_TOP
from specdiff.eagle3.engines import engine_spec

ROOT = Path(__file__).resolve().parents[2]
HAS_VLLM = (ROOT / ".venv-vllm" / "bin" / "python").exists()


def test_every_scenario_is_written_in_vllms_key_and_numbering(repo_models, tmp_path):
    ids = scenario_ids(None, 8, "vllm")
    assert (ids.correct, ids.seed, ids.key) == ([0, 3, 6], [3, 6, 7], KEY_TOP)  # vLLM id k = HF k
    spec = engine_spec("vllm")
    for name in SCENARIOS:
        text = describe(name, ids)
        assert "SGLang reads" not in text and "SGLang concatenates" not in text, (name, text)
        served = write_served_draft(name, repo_models / "draft", tmp_path / name, ids=ids)
        read = config_aux_ids(spec.name, json.loads((served / "config.json").read_text()))
        hf = engine_capture("vllm", read.ids, num_layers=8).hf_indices
        if name == "off-by-one":  # an SGLang-format draft as shipped: vLLM reads eagle_config literally
            assert read.key == KEY_NESTED and list(read.ids) == [-1, 2, 5] and hf == (2, 5)
            assert scenario_for(name, "vllm").expected_crash
        elif name == "seed":
            assert read.key == KEY_TOP and list(hf) == [3, 6, 7]
        else:
            assert read.key == KEY_TOP and list(hf) == TRAINED_HF, name
    # the SGLang scenarios are untouched
    assert scenario_for("seed") is SCENARIOS["seed"] and scenario_ids().key == KEY_NESTED


def test_demo_engine_vllm_without_the_vllm_venv_says_make_vllm_venv(run_cli, monkeypatch, tmp_path):
    import specdiff.tracer.engines.vllm.cpu as vcpu

    monkeypatch.setattr(vcpu, "vllm_python", lambda root=None: str(tmp_path / "nope" / "bin" / "python"))
    r = run_cli("demo", "--engine", "vllm", "--no-tui", "--workdir", tmp_path / "w")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: ") and "`make vllm-venv`" in lines[0], r.output


@pytest.fixture(scope="module")
def seed_demo(tmp_path_factory, server_env):
    """``specdiff demo --engine vllm --scenario seed --no-tui --verify-fix`` as a user runs it (the CLI
    in a subprocess): a real vLLM CPU engine (50-210 s a start here) serves the seed's mistake in vLLM's
    numbering (top-level [3, 6, 7], trained on HF [0, 3, 6]), traced; record train and diff follow;
    then ``specdiff fix``'s corrected draft is served by vLLM again, recorded and diffed."""
    if not HAS_VLLM:
        pytest.skip("no vLLM venv at .venv-vllm (build it with `make vllm-venv`)")
    work = tmp_path_factory.mktemp("vllm-demo")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "demo", "--engine", "vllm", "--scenario", "seed",
                           "--no-tui", "--prompts", "3", "--max-new-tokens", "32", "--workdir", str(work),
                           "--verify-fix"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200,
                          env=server_env())
    return SimpleNamespace(rc=proc.returncode, out=proc.stdout, dir=work / "vllm-seed", seconds=time.monotonic() - t0)


@pytest.mark.server
def test_demo_engine_vllm_seed_finds_the_shift_with_the_vllm_fix(seed_demo):
    """The demo's diff stops at target.aux.0, explained as the layer shift, with vLLM's key as the fix."""
    assert seed_demo.rc == 0, seed_demo.out[-4000:]
    assert "demo worked: scenario 'seed'" in seed_demo.out and "vLLM up" in seed_demo.out
    summary = json.loads((seed_demo.dir / "summary.json").read_text())
    assert summary["engine"] == "vllm" and summary["served_ids"] == [3, 6, 7] and summary["served_ids_key"] == KEY_TOP
    report = summary["report"]
    assert report["first_divergence"]["tensor"] == "target.aux.0"
    cause = report["explanations"][0]
    assert cause["cause"] == "aux_layer_shift", cause
    assert cause["fix"].startswith("set the draft config's top-level eagle_aux_hidden_state_layer_ids to [0, 3, 6]"), cause
    assert summary["served_accept_length"] and all(a >= 1.0 for a in summary["served_accept_length"])
    from specdiff.tracer.engines.vllm.contract import SOURCE_TOP
    from specdiff.tracer.store import open_trace

    c = open_trace(str(seed_demo.dir / "serve.trace")).contract  # what vLLM's runner read, from its objects
    assert c["aux_ids_source"] == SOURCE_TOP and c["aux_hf_indices"] == [3, 6, 7], c
    print(f"vLLM demo seed: {seed_demo.seconds:.0f} s in all, served AL {summary['served_accept_length']}")


@pytest.mark.server
def test_the_fix_of_the_vllm_seed_is_served_by_vllm_and_verified(seed_demo):
    """``fix --verify`` on a vLLM-served trace re-serves the fix on vLLM (not SGLang): the
    draft's top-level key now holds vLLM's [0, 3, 6], no divergence, acceptance back to training's."""
    assert seed_demo.rc == 0, seed_demo.out[-4000:]
    fix = json.loads((seed_demo.dir / "summary.json").read_text())["fix"]
    assert fix["verify"]["verified"] is True, fix
    assert fix["verify"]["line"].startswith("fix verified: no divergence"), fix
    cfg = json.loads((seed_demo.dir / "fixed-draft" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6], cfg  # vLLM's key (KEY_TOP), HF numbering
    from specdiff.tracer.store import open_trace

    served = open_trace(fix["verify"]["traces"][1]).contract
    assert served["engine"] == "vllm" and served["aux_hf_indices"] == [0, 3, 6], served
    after, training = fix["verify"]["accept_length_after"], fix["verify"]["accept_length_training"]
    assert after is not None and training is not None and abs(after - training) <= 0.25, fix["verify"]
    assert seed_demo.out.count("vLLM up") == 2, seed_demo.out[-3000:]  # the recorded server, then the fix's


@pytest.mark.server
def test_no_line_of_a_vllm_traces_report_names_sglang_wrongly(seed_demo):
    """Every report line that names SGLang on a vLLM-served trace is a contrast that names vLLM too
    (e.g. 'vLLM id k = HF k; SGLang id k captures HF k+1'); fixes, contract lines and pre-flight
    findings are in vLLM's key and numbering."""
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.report import render_text
    from specdiff.tracer.store import open_trace

    assert seed_demo.rc == 0, seed_demo.out[-4000:]
    serve, train = seed_demo.dir / "serve.trace", seed_demo.dir / "train.trace"
    assert open_trace(str(serve)).contract["engine"] == "vllm"
    report = diff_traces(str(train), str(serve))
    d = report.to_json()

    def said(node):  # every explanation, contract line and finding: its message with its fix
        if isinstance(node, dict):
            if isinstance(node.get("message"), str):
                yield f"{node['message']} | fix: {node.get('fix') or ''}"
            for v in node.values():
                yield from said(v)
        elif isinstance(node, list):
            for v in node:
                yield from said(v)

    lines = list(said(d))
    assert len(lines) >= 3, lines  # the cause, the aux_hf_indices line, the pre-flight's training mismatch
    wrong = [ln for ln in lines if "SGLang" in ln and "vLLM" not in ln]
    assert not wrong, "\n".join(wrong)
    text = render_text(report)
    for sglang_only in ("in SGLang's numbering for this target", "eagle_config.eagle_aux_hidden_state_layer_ids in SGLang",
                        "check the SGLang version", "crashes"):  # the served draft has vLLM's key: no crash
        assert sglang_only not in text and sglang_only not in json.dumps(d), sglang_only
    aux = next(m for m in report.to_json()["contract_mismatches"] if m["field"] == "aux_hf_indices")
    assert "top-level eagle_aux_hidden_state_layer_ids (vLLM id = HF index" in aux["fix"], aux


@pytest.mark.parametrize(("engine", "family", "says"), [
    ("tgi", "llama", "unknown engine 'tgi'; specdiff records: "),
    ("vllm", "qwen3", "--engine vllm serves the llama demo pair only"),
])
def test_demo_refuses_an_engine_or_family_it_cannot_run_in_one_line(engine, family, says):
    from specdiff.demo.run import DemoError, check_engine

    with pytest.raises(DemoError, match=re.escape(says)):
        check_engine(engine, family)
