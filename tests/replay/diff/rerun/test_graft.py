"""Graft: the training draft re-run on serving's inputs, one training input substituted at a time.

Both traces come from the real ``specdiff record train`` on the committed demo models: the
"training" side with the draft's own aux layers, the "serving" stand-in with the seed's bug
(``--aux-layers 3,6,7 --aux-convention hf``: [layer a, layer b, layer c] instead of
[embed, layer a, layer b]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

MODELS = Path(__file__).resolve().parents[4] / "traces" / "models"
pytestmark = pytest.mark.skipif(not (MODELS / "draft" / "config.json").is_file()
                                or not (MODELS / "target" / "model.safetensors").is_file(),
                                reason="the committed demo models are not built")


@pytest.fixture(scope="module")
def pair(tmp_path_factory, run_cli) -> tuple[Path, Path]:
    from specdiff.demo.data import DATA_FILE, load_prompt_lens, load_sequences
    from specdiff.demo.run import MIN_DISTINCT
    d = tmp_path_factory.mktemp("graft")
    data = MODELS / "data" / DATA_FILE
    # held-out sequences (prompt + continuation) whose continuation is not a loop, like the demo's
    lines = [{"input_ids": s[: p + 40].tolist(), "prompt_len": p, "rid": f"p{i}"}
             for i, (s, p) in enumerate(zip(load_sequences(data, split="heldout"),
                                            load_prompt_lens(data, split="heldout"), strict=True))
             if len(set(s[p:p + 64].tolist())) >= MIN_DISTINCT][:4]
    prompts = d / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = {}
    for side, extra in (("train", []), ("serve", ["--aux-layers", "3,6,7", "--aux-convention", "hf"])):
        out[side] = d / f"{side}.trace"
        res = run_cli("record", "train", "--target", str(MODELS / "target"), "--draft", str(MODELS / "draft"),
                    "--prompts", str(prompts), "-o", str(out[side]), "--steps", "3", "--probe-positions", "0",
                    *extra)
        assert res.exit_code == 0, res.output
    return out["train"], out["serve"]


def test_aux_substitution_recovers_the_seed_bug_gap(pair):
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.report import render_text
    from specdiff.replay.diff.rerun.graft import GraftResult, graft
    report = diff_traces(str(pair[0]), str(pair[1]))
    grafts = graft(report.inputs)
    assert [g.name for g in grafts][0] == "target.aux_cat"
    assert all(isinstance(g, GraftResult) for g in grafts)
    by = {g.name: g for g in grafts}
    aux, d2t = by["target.aux_cat"], by["draft.d2t"]
    assert "norm flags" not in by  # both contracts carry the same flags
    assert aux.training_accept_length - aux.baseline_accept_length > 0.1  # a real gap to recover
    assert aux.recovered >= 0.9
    assert abs(d2t.recovered) < 0.05
    assert aux.mean_accept_length == pytest.approx(1 + sum(aux.per_depth))
    assert len(aux.per_depth) == 3 and aux.samples > 0
    report.grafts = grafts
    text = render_text(report)
    assert "substituting training's target.aux_cat recovers" in text
    assert text.index("graft") > text.index("acceptance")
    js = report.to_json()
    assert js["grafts"][0]["name"] == "target.aux_cat" and js["grafts"][0]["recovered"] >= 0.9


def test_cli_graft_and_missing_draft(pair, tmp_path, run_cli):
    res = run_cli("diff", str(pair[0]), str(pair[1]), "--graft", "--format", "json")
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["grafts"][0]["name"] == "target.aux_cat"
    missing = tmp_path / "no-draft"
    res = run_cli("diff", str(pair[0]), str(pair[1]), "--graft", "--draft", str(missing), "--format", "text")
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if "error" in ln]
    assert len(lines) == 1 and str(missing) in lines[0] and "--draft" in lines[0]


def test_missing_draft_named_by_the_contract(pair):
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.rerun.graft import GraftError, graft
    report = diff_traces(str(pair[0]), str(pair[1]))
    tr = report.traces.x
    tr.contract = {**tr.contract, "draft_name": "/nonexistent/draft"}
    with pytest.raises(GraftError) as e:
        graft(report.inputs)
    msg = str(e.value)
    assert "\n" not in msg and "/nonexistent/draft" in msg and "draft_name" in msg and "--draft" in msg
