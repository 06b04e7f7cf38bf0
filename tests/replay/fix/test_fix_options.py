"""``specdiff fix`` where the cause is a server option (replay/fix/plan.py ``OPTION_PLANNERS``): the
draft window training computed, as SGLang's ``--speculative-draft-window-size`` or none. Hand-built pairs
(real TraceWriter stores) whose first divergence is at ``draft.hidden_out`` and whose contracts record each
side's ``draft_attention_window``; the served draft is the committed demo draft, copied unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.replay.fix.plan import OptionEdit, apply_options
from specdiff.tracer.store import TraceWriter

DRAFT = REPO_MODELS / "draft"
pytestmark = pytest.mark.skipif(not (DRAFT / "config.json").exists(), reason="the demo models are absent")

FULL = [None]
KV8 = [{"window": 8, "distance": "kv"}]


def _trace(path, side: str, window, *, engine: str = "sglang", given: dict | None = None, diverge: bool = False):
    rows = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    facts = {"engine": engine, "hidden_size": 16, "dtype": "float32", "draft_attention_window": window,
             "draft_name": str(DRAFT)}
    if given is not None:
        facts["engine_options_given"] = given
    with TraceWriter(str(path), side=side, contract=facts) as tw:
        tw.add_sequence(np.arange(1, 13, dtype=np.int32), prompt_len=4, rid="r0")
        tw.append("draft.hidden_out", -rows + 3.0 if diverge else rows, seq=0, pos=np.arange(8))
    return str(path)


def _pair(tmp_path, train_window, serve_window, **serve):
    return (_trace(tmp_path / "train.trace", "train", train_window),
            _trace(tmp_path / "serve.trace", "serve", serve_window, diverge=True, **serve))


def _files(d) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_a_window_served_but_not_trained_is_dropped_and_the_draft_copied_as_is(tmp_path, run_cli):
    a, b = _pair(tmp_path, FULL, KV8, given={"speculative_draft_window_size": {"value": 8, "default": None}})
    out = tmp_path / "fixed"
    r = run_cli("fix", a, b, "-o", out, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["cause"] == "contract.draft_attention_window"
    assert d["options"] == [{"flag": "--speculative-draft-window-size", "old": 8, "new": None}]
    assert d["config"] == [] and d["tensors"] == [] and _files(out) == _files(DRAFT)
    text = run_cli("fix", a, b, "-o", tmp_path / "again").stdout
    assert "server options (serve the copy with these" in text
    assert "  - --speculative-draft-window-size 8\n  (drop --speculative-draft-window-size)" in text


def test_a_window_trained_but_not_served_is_given(tmp_path, run_cli):
    a, b = _pair(tmp_path, KV8, FULL)
    r = run_cli("fix", a, b, "-o", tmp_path / "fixed", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["options"] == [{"flag": "--speculative-draft-window-size", "old": None, "new": 8}]


@pytest.mark.parametrize(("train_window", "engine", "said"), [
    ([{"window": 8, "distance": "prefix"}], "sglang", "not one window counted over the KV sequence"),
    (KV8, "vllm", "the option it needs is SGLang's; the serving trace was recorded on vllm"),
])
def test_a_window_sglang_cannot_serve_or_another_engine_is_refused_in_one_line(tmp_path, run_cli, train_window,
                                                                              engine, said):
    a, b = _pair(tmp_path, train_window, FULL, engine=engine)
    out = tmp_path / "fixed"
    r = run_cli("fix", a, b, "-o", out)
    assert r.exit_code == 2 and not out.exists(), r.output
    assert r.stderr.count("\n") == 1 and said in r.stderr, r.stderr


def test_option_edits_replace_every_occurrence_of_their_flag_and_keep_the_rest():
    argv = ["--kv-cache-dtype", "fp8_e5m2", "--speculative-draft-window-size", "8", "--enable-x"]
    drop = OptionEdit("--speculative-draft-window-size", 8, None)
    assert apply_options(argv, [drop]) == ["--kv-cache-dtype", "fp8_e5m2", "--enable-x"]
    assert apply_options(argv, [OptionEdit("--speculative-draft-window-size", 8, 4)]) == [
        "--kv-cache-dtype", "fp8_e5m2", "--enable-x", "--speculative-draft-window-size", "4"]
    assert apply_options(["--enable-x"], [OptionEdit("--enable-x", True, None)]) == []
    assert apply_options([], [OptionEdit("--dtype", None, "bfloat16")]) == ["--dtype", "bfloat16"]
    assert OptionEdit("--flag", None, True).argv() == ["--flag"] and drop.argv() == []


def test_an_fp16_overflow_without_a_recorded_training_dtype_is_refused_not_defaulted(tmp_path):
    from types import SimpleNamespace as NS

    from specdiff.replay.fix.plan import NoMechanicalFix, _dtype_option

    sides = NS(train=NS(contract={"dtype": "unknown"}), serve=NS(contract={"engine": "sglang"}))
    with pytest.raises(NoMechanicalFix, match="the training trace records no dtype to serve in"):
        _dtype_option(sides, NS(cause="fp16_overflow"))
    sides.train.contract["dtype"] = "bfloat16"
    assert _dtype_option(sides, NS(cause="fp16_overflow")) == [OptionEdit("--dtype", None, "bfloat16")]
