"""A systematic shift inside the tolerance (replay/diff/judge/shift.py, replay/record/
noise_floor.py): ``record train`` measures its own forward's bf16 vs float32 gap per stage, and the diff
calls a stage diverged when most of its rows sit well above that floor, every row inside rel 0.05.

The pairs are two training traces of the shipped seed sequences (``record train --replay``), one on the
demo target and one on a copy with other decoder weights in layer 5 (HF hidden state 6, the draft's aux
slot 2): moved by 0.4 of their std the aux rows shift to about five times the floor with fewer failing
the tolerance than a pair may have; by 0.05, to under the floor (bf16 rounding of the same kernels): no divergence, the
contract still names the weights.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from specdiff.replay.diff.judge.shift import (
    FLOOR_RATIO,
    MIN_ROWS,
    ROUNDING_FLOOR,
    pair_floor,
    systematic_shift,
)
from specdiff.replay.record.noise_floor import probe_sequences

#: the decoder layer whose weights the other target moves (HF hidden state 6 = the draft's aux slot 2)
LAYER = 5


def _side(floors: dict | None, method: str = "bf16 re-run in float32"):
    facts = {} if floors is None else {"noise_floor": {"method": method, "tensors": {
        n: {"median_rel": v, "p90_rel": v, "rows": 100} for n, v in floors.items()}}}
    return SimpleNamespace(contract=facts)


def test_the_pair_floor_is_the_noisier_sides_raised_to_one_rounding():
    pair = SimpleNamespace(x=_side({"target.aux.1": 0.004}), y=_side({"target.aux.1": 0.006}))
    assert pair_floor(pair, "target.aux.1", "bfloat16") == (0.006, "bf16 re-run in float32")
    assert pair_floor(pair, "target.aux.2", "bfloat16") is None  # neither side measured it
    assert pair_floor(SimpleNamespace(x=_side(None), y=_side(None)), "target.aux.1", "bfloat16") is None
    exact = SimpleNamespace(x=_side({"target.aux.0": 0.0}), y=_side(None))  # the embedding slot: floor 0
    value, how = pair_floor(exact, "target.aux.0", "bfloat16")
    assert value == ROUNDING_FLOOR["bfloat16"] and how.startswith("one bfloat16 rounding; measured 0")


def test_a_shift_fires_on_the_median_row_not_on_a_tail():
    floor = (0.004, "m")
    rng = np.random.default_rng(0)
    noise = rng.uniform(0.002, 0.006, 200).astype(np.float32)
    usable = np.ones(200, bool)
    calm = systematic_shift(noise, usable, floor)
    assert calm is not None and not calm.fired and calm.ratio < 1.5
    tail = noise.copy()
    tail[:60] = 0.04  # 30 % of rows far out (a routing flip's run): the median stays at the noise
    assert not systematic_shift(tail, usable, floor).fired
    shifted = noise * 4
    s = systematic_shift(shifted, usable, floor)
    assert s.fired and s.ratio >= FLOOR_RATIO and s.above > 0.5 and s.rows == 200
    assert "x the pair's noise floor 0.004 (m)" in s.words()
    few = np.zeros(200, bool)
    few[: MIN_ROWS - 1] = True
    assert systematic_shift(shifted, few, floor) is None  # too few rows to judge a median


def test_the_rerun_takes_the_first_sequences_up_to_its_token_budget():
    assert probe_sequences([100, 100, 100, 100, 100], tokens=256) == [0, 1, 2]
    assert probe_sequences([1000, 5], tokens=256) == [0]
    assert probe_sequences([10] * 9, tokens=256, most=4) == [0, 1, 2, 3]
    assert probe_sequences([]) == []


@pytest.fixture(scope="module")
def traces(tmp_path_factory, repo_models, run_cli, other_layer_target):
    """Training traces of the seed sequences on the demo target and on two copies with other layer-5
    weights (scale 0.4 and 0.05 of their std)."""
    root = tmp_path_factory.mktemp("shift")
    serve = repo_models.parent / "examples" / "seed" / "serve.trace"
    out = {}
    for name, scale in (("same", None), ("moved", 0.4), ("nudged", 0.05)):
        target = (repo_models / "target" if scale is None else
                  other_layer_target(repo_models / "target", root / f"target-{name}", layer=LAYER, scale=scale))
        out[name] = root / f"{name}.trace"
        r = run_cli("record", "train", "--target", target, "--draft", repo_models / "draft", "--replay", serve,
                    "-o", out[name])
        assert r.exit_code == 0, r.output[-2000:]
    return out


def _diff(run_cli, a, b) -> tuple[int, dict]:
    r = run_cli("diff", a, b, "--format", "json", "--no-narrow")
    return r.exit_code, json.loads(r.stdout)


def test_record_train_measures_its_floor_per_stage(traces):
    from specdiff.tracer.store import open_trace

    nf = open_trace(str(traces["same"])).contract["noise_floor"]
    assert nf["method"] == "the recorded bfloat16 forward re-run in float32" and nf["sequences"] >= 1
    floors = {n: t["median_rel"] for n, t in nf["tensors"].items()}
    assert floors["target.aux.0"] == 0.0  # the embedding output: a lookup, exact at either precision
    for name in ("target.aux.1", "target.aux.2", "draft.fc_out", "draft.hidden_out"):
        assert 1e-3 < floors[name] < 2e-2, (name, floors[name])  # bf16 rounding of a layer (SGLang vs HF: 3-6e-3)
    assert all(t["rows"] > MIN_ROWS for t in nf["tensors"].values())


def test_other_decoder_weights_inside_the_tolerance_are_a_shift_named_by_the_weights(traces, run_cli):
    code, report = _diff(run_cli, traces["same"], traces["moved"])
    assert code == 1 and report["diverged"]
    first = report["first_divergence"]
    assert first["tensor"] == "target.aux.2", first["tensor"]
    # the fixed tolerance alone passes it: fewer rows outside rel 0.05 than the 2 % a pair may have
    assert first["stats"]["own_fail_frac"] <= first["tolerance"]["max_fail_frac"], first["stats"]
    shift = first["stats"]["shift"]
    assert shift["fired"] and shift["ratio"] >= FLOOR_RATIO, shift
    causes = [e["cause"] for e in report["explanations"]]
    assert causes[0] == "contract.target_weights", causes  # the differing fact is the cause, with its fix
    assert report["explanations"][0]["message"].startswith(f"target_weights.model.layers.{LAYER}: ")
    assert "systematic_shift" in causes
    for slot in ("target.aux.0", "target.aux.1"):  # before layer 5: the same computation, no shift
        assert not report["tensors"][slot]["diverged"], slot
    text = run_cli("diff", traces["same"], traces["moved"], "--no-narrow").stdout
    assert "a systematic shift inside the fail fraction: median row rel" in text


def test_a_shift_under_the_floor_is_no_divergence_but_the_contract_still_names_it(traces, run_cli):
    code, report = _diff(run_cli, traces["same"], traces["nudged"])
    assert code == 0 and report["first_divergence"] is None, report["verdict"]
    shift = report["tensors"]["target.aux.2"]["shift"]
    assert 0 < shift["ratio"] < FLOOR_RATIO and not shift["fired"], shift
    warned = [m["field"] for m in report["contract_mismatches"] if m["severity"] == "warn"]
    assert f"target_weights.model.layers.{LAYER}" in warned
    assert "but the contract differs: target_weights" in report["verdict"]


def test_the_same_computation_twice_shows_no_shift(traces, run_cli, tmp_path):
    # a copy of the store: diff refuses one store against itself (tui/cmd_diff.py), so the same computation
    # recorded twice is the trace and its byte-identical copy
    copy = tmp_path / "same-copy.trace"
    shutil.copytree(traces["same"], copy)
    code, report = _diff(run_cli, traces["same"], copy)
    assert code == 0
    ratios = {n: t["shift"]["ratio"] for n, t in report["tensors"].items() if "shift" in t}
    assert ratios and max(ratios.values()) == 0.0, ratios


def test_the_floor_says_how_it_was_measured_per_model_when_their_dtypes_differ():
    import torch

    from specdiff.replay.record.noise_floor import _method

    assert _method(torch.bfloat16, torch.bfloat16) == "the recorded bfloat16 forward re-run in float32"
    assert _method(torch.float32, torch.float32) == "the recorded float32 forward re-run in bfloat16"
    # speculators' draft: float32 weights under bf16 autocast, beside a bf16 target
    assert _method(torch.bfloat16, torch.float32) == ("the recorded forward (target bfloat16, draft float32) re-run "
                                                      "with target float32, draft bfloat16")


def test_the_apps_row_pane_says_the_floor_and_the_shift(traces):
    """The app's detail pane (tui/panes.py ``_metrics``) of the shifted slot: the floor line, marked a shift."""
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.tui import panes
    from specdiff.tui.view import Sel, ViewModel

    report = diff_traces(str(traces["same"]), str(traces["moved"]), narrow=False)
    comp = report.comparisons["target.aux.2"]
    i = int(np.nonzero(comp.shift_rows)[0][0])
    sel = Sel("target.aux.2", 0, int(comp.match.pair[i]), int(comp.match.pos[i]))
    text = panes._metrics(ViewModel(report), sel, i).plain
    assert "noise floor median row rel " in text and "— a systematic shift" in text, text


def test_a_zero_floor_fires_on_a_shift_and_not_on_exact_rows():
    usable = np.ones(64, bool)
    assert not systematic_shift(np.zeros(64, np.float32), usable, (0.0, "exact")).fired
    assert systematic_shift(np.full(64, 1e-6, np.float32), usable, (0.0, "exact")).fired


def test_the_floor_is_not_measured_where_the_copies_would_not_fit(monkeypatch):
    from types import SimpleNamespace as NS

    import torch

    from specdiff.replay.record import noise_floor

    monkeypatch.setattr(noise_floor, "_free_bytes", lambda device: 1024)
    replayer = NS(target=torch.nn.Linear(64, 64), draft=torch.nn.Linear(64, 64))
    got = noise_floor.measure_noise_floor(replayer, [], [])
    assert got["method"] is None and "more than half the free memory" in got["unmeasured"], got
    assert noise_floor.measure_noise_floor(replayer, [], [], skip=True) == {
        "method": None, "unmeasured": "record train --no-noise-floor"}
