"""The trained pair of each target family served correctly (DeepSeek-V3, Qwen3-MoE, GPT-OSS, ...): a tiny trained target with
an EAGLE-3 draft trained on it (``family_models``, ``specdiff.demo_models.families``), served on
a real CPU SGLang server with the ids that family's rule reads as the training layers, through
``specdiff demo --family F --scenario correct``: the draft is accepted well above 1 token per
step and ``diff`` finds no divergence (exit 0), every compared tensor under its limits.

tests/demo_models/test_family_models.py checks the pairs offline (the draft predicts its target);
tests/tracer/engines/test_family_*.py serve random targets with random drafts (kernels, capture, replay);
this is the two together. DeepSeek-V3's trained pair is served correctly by
tests/server/test_family_seed.py (the seed's fix re-served); GPT-OSS's trained pair is not served here
(its random correct pair is, in tests/tracer/engines/test_family_correct_pairs.py).

Each family's pair is built on first use (3-13 min on 2 cores, cached in pytest's cache), so
these are marked ``family_pair``: ``make test-families``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("sglang")

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.family_pair, pytest.mark.timeout(3600)]

FAMILIES = ("llama", "qwen3", "qwen3_moe")
PROMPTS, MAX_NEW = 4, 48
#: the trained drafts' held-out chain accept length offline is > 1.3 (test_family_models); served
#: greedy, a draft that predicts its target must be accepted at least this well
MIN_ACCEPT = 1.3


@pytest.mark.parametrize("family", FAMILIES)
def test_trained_pair_served_correctly_has_no_divergence(family, family_models, tmp_path):
    pair = family_models[family]
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "demo", "--family", family, "--scenario", "correct",
                           "--no-tui", "--workdir", str(tmp_path), "--models", str(pair.root), "--prompts", str(PROMPTS),
                           "--max-new-tokens", str(MAX_NEW)], capture_output=True, text=True, timeout=2400)
    # the demo's folder under --workdir: the scenario's name, after the family's but for the demo's own (tui/cmd_demo.py)
    summary_path = tmp_path / ("correct" if family == "llama" else f"{family}-correct") / "summary.json"
    assert summary_path.exists(), f"demo failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads(summary_path.read_text())
    report = summary["report"]
    where = f"{family}: {report['verdict']}"
    assert proc.returncode == 0 and summary["demo_worked"] is True, where
    assert report["first_divergence"] is None and report["diverged"] is False, where
    assert [m for m in report["contract_mismatches"] if m["severity"] == "error"] == [], where
    assert not any(t["diverged"] for t in report["tensors"].values()), where
    assert summary["served_mean"] > MIN_ACCEPT, (where, summary["served_accept_length"])
    margin = report["margin"]
    print(f"{family}: served accept length {summary['served_mean']:.2f} "
          f"(training-side estimate {summary['training_estimate']}); margin {margin['tensor']} {margin['limit']} "
          f"use {margin['use']:.2f}; explained {[(e['cause'], e['tensor']) for e in report['explained_differences']]}")
    assert 0 < margin["use"] < 1.0, (where, margin)
