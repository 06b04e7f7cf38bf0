"""What a newcomer reads first: the text report of the shipped example pair says each
thing once, most important first, within the terminal width; ``specdiff info`` prints facts for
people (no Python reprs, rounded floats); the help texts describe each option one way."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specdiff.tracer.store import open_trace

EXAMPLE = Path(__file__).resolve().parents[3] / "traces" / "examples" / "seed"
WIDTH = 120
needs_example = pytest.mark.skipif(not (EXAMPLE / "serve.trace").exists(), reason="the shipped example pair is absent")


@pytest.fixture
def columns(monkeypatch):
    """The terminal width the CLI wraps at (shutil.get_terminal_size reads COLUMNS first)."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    return WIDTH


def _tables(text: str) -> set[str]:
    """Lines of the text report's tensor table (the one block that is not wrapped)."""
    block = text.split("\ntensors\n", 1)[1].split("\n\n", 1)[0]
    return set(block.splitlines())


@needs_example
def test_diff_of_the_shipped_pair_says_the_headline_once_within_the_width(run_cli, columns):
    r = run_cli("diff", EXAMPLE / "train.trace", EXAMPLE / "serve.trace", "--format", "text")
    assert r.exit_code == 1
    text = r.stdout
    j = json.loads(run_cli("diff", EXAMPLE / "train.trace", EXAMPLE / "serve.trace", "--format", "json").stdout)
    flat = " ".join(text.split())
    headline = " ".join(j["verdict"].split())
    assert len(headline) > WIDTH  # wrapped, not cut
    assert flat.startswith(headline) and flat.count(headline) == 1
    cause = j["explanations"][0]
    assert flat.count(" ".join(cause["message"].split())) == 1  # the headline holds it; not repeated
    assert flat.count(" ".join(cause["fix"].split())) == 1
    for m in j["contract_mismatches"]:  # each contract difference once, with its fix once
        assert flat.count(" ".join(m["message"].split())) == 1, m["message"]
        assert flat.count(" ".join(m["fix"].split())) == 1, m["fix"]
    long = [line for line in text.splitlines() if len(line) > columns and line not in _tables(text)]
    assert long == []
    # most important first: the first divergence, then its explanation and fix, then the evidence
    order = [text.index(s) for s in ("\nfirst divergence\n", "\nexplanation: aux_layer_shift", "  fix: set the",
                                     "\ncontract\n", "\nacceptance", "\ntensors\n")]
    assert order == sorted(order)
    assert "unmatched: 0 on training, 0 on serving" in text


def test_a_fact_an_older_recorder_left_unknown_is_not_blamed_on_the_sglang_version():
    # The example pair shipped before the pair was re-recorded by regenerate.py (SGLang 0.5.23, in the tested range) held aux_concat_order
    # 'unknown' and no unobservable list: the recorder that wrote it did not record the fact. An engine
    # concatenates its captures in layer order, so the slots are its aux_hf_indices: an info, and the
    # fix is a re-record. A fact the engine's unobservable list names keeps the version fix.
    from types import SimpleNamespace

    from specdiff.replay.diff.contract.check import check_contracts
    from specdiff.replay.diff.types import Pair
    from specdiff.tracer.contract import unknown_facts

    train = {"side": "train", "aux_hf_indices": [0, 3, 6], "aux_concat_order": [0, 3, 6], "num_layers": 8}
    old_serve = {"side": "serve", "engine": "sglang", "engine_version": "0.5.23", "aux_hf_indices": [3, 6, 7],
                 "aux_concat_order": "unknown", "num_layers": 8}
    traces = Pair(SimpleNamespace(contract=train, side="train"), SimpleNamespace(contract=old_serve, side="serve"))
    (m,) = [m for m in check_contracts(traces) if m.field == "aux_concat_order"]
    assert m.severity == "info" and "aux_hf_indices [3, 6, 7]" in m.message
    assert "version" not in m.fix and m.fix.startswith("re-record serving")
    assert unknown_facts(old_serve)["aux_concat_order"].startswith("written as unknown by an older")

    hidden = {**old_serve, "aux_hf_indices": "unknown", "unobservable": [
        {"name": "LlamaModel.layers_to_capture", "facts": ["aux_hf_indices"], "sglang_version": "0.5.99"}]}
    traces = Pair(traces.x, SimpleNamespace(contract=hidden, side="serve"))
    (m,) = [m for m in check_contracts(traces) if m.field == "aux_hf_indices"]
    assert m.severity == "warn" and "has no LlamaModel.layers_to_capture" in m.message
    assert "version" in m.fix


@needs_example
@pytest.mark.parametrize("side", ["train", "serve"])
def test_info_prints_facts_for_people_not_python_reprs(run_cli, columns, side):
    r = run_cli("info", EXAMPLE / f"{side}.trace")
    assert r.exit_code == 0
    text = r.stdout
    assert not re.search(r"[{\[]'|'[:,]\s|': ", text), "a Python dict/list repr"
    assert not re.search(r"\d\.\d{5,}", text), "an unrounded float"
    assert [line.split()[0] for line in text.splitlines() if re.match(r"\s*side\b", line)] == ["side"]
    assert max(len(line) for line in text.splitlines()) <= columns
    contract = open_trace(str(EXAMPLE / f"{side}.trace")).contract
    for key, value in contract.items():  # every fact still shown, nested ones by their keys
        if key in ("side", "unobservable", "crash"):
            continue
        assert f"  {key}" in text
        if isinstance(value, dict):
            assert all(str(k) in text for k in value)


def test_capture_is_described_one_way_and_record_train_shows_its_defaults_through_click(run_cli):
    from specdiff.tracer.rows import TOPK_WIDTH
    from specdiff.tui.cli import CAPTURE_HELP
    from specdiff.tui.cmd_record_train import TRAIN_TOPK

    assert TRAIN_TOPK == TOPK_WIDTH  # the CLI states the width the training recorder uses
    serve = " ".join(run_cli("record", "serve", "--help").stdout.split())
    train = " ".join(run_cli("record", "train", "--help").stdout.split())
    # click may wrap after a hyphen ("top-" / "k"): the words are compared without any whitespace
    def bare(text: str) -> str:
        return "".join(text.split())

    assert bare(CAPTURE_HELP.format(k="--logits-topk")) in bare(serve)
    assert bare(CAPTURE_HELP.format(k=TRAIN_TOPK)) in bare(train)
    assert "(default:" not in train  # every default through click's [default: ...]
    for option, default in (("--dtype", "bfloat16"), ("--batch-size", "8"), ("--probe-positions", "64")):
        assert re.search(re.escape(option) + r" (?:(?! --).)*\[default: \(?" + default, train), option


def test_demo_help_explains_every_scenario_it_lists(run_cli):
    from specdiff.demo.scenarios import SCENARIOS, describe

    text = run_cli("demo", "--help").stdout
    section = " ".join(text.split("Scenarios", 1)[1].split())
    for name in SCENARIOS:
        assert f" {name} {' '.join(describe(name).split())}" in section, name


@pytest.mark.parametrize(("train_order", "said"), [([0, 3, 6], False), ([6, 0, 3], True)],
                         ids=["other-layers-same-order", "permuted"])
def test_aux_concat_order_is_said_only_when_the_order_differs(train_order, said):
    # training [0, 3, 6] vs serving [3, 6, 7]: the layers differ (aux_hf_indices says so), the order does not
    from types import SimpleNamespace

    from specdiff.replay.diff.contract.check import check_contracts
    from specdiff.replay.diff.types import Pair

    train = {"side": "train", "aux_hf_indices": sorted(train_order), "aux_concat_order": train_order}
    serve = {"side": "serve", "engine": "sglang", "aux_hf_indices": [3, 6, 7], "aux_concat_order": [3, 6, 7]}
    fields = [m.field for m in check_contracts(Pair(SimpleNamespace(contract=train, side="train"),
                                                    SimpleNamespace(contract=serve, side="serve")))]
    assert fields.count("aux_hf_indices") == 1
    assert ("aux_concat_order" in fields) is said


def test_the_margin_line_says_when_no_passing_tensor_used_any_limit(tmp_path, aux_traces):
    # the seed's mistake: every float tensor diverges, the id tensors that pass have no failing row; the line
    # named the first of them, tokens, "0 of 36 counted rows fail, 0% of the 0 fail fraction allowed"
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.report import render_text

    a = aux_traces.write(tmp_path / "train.trace", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[3, 6, 7])
    report = diff_traces(a, b, narrow=False)
    assert report.first is not None and report.margin()["use"] == 0
    lines = [ln for ln in render_text(report).splitlines() if ln.startswith("margin:")]
    assert lines == ["margin: every tensor that passed is at 0% of its limits: none of their counted rows fails"]
