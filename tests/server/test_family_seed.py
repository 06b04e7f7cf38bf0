"""The motivating bug on its own architecture (DeepSeek-V3, the family it was found on): the seed scenario on a DeepSeek-V3 target.

The Kimi-K2 seed: a draft trained on [embedding, L3, L31] served capturing [L3, L31, L59]. Here the
tiny DeepSeek-V3 pair (``family_models["deepseek_v3"]``: MLA, yarn rope, grouped top-k routing, a
shared expert; the draft trained on HF [0, 3, 6] and saved with SGLang ids [0, 3, 6], which
deepseek_v2.py:3458-3473 reads literally) is served with ids [3, 6, 7] = HF [3, 6, 7] (the layers
shifted by one slot) through ``specdiff demo --family deepseek_v3 --scenario seed`` on a real CPU
SGLang server. specdiff must stop at ``target.aux.*``, explain it as a layer shift and give the
fix in the DeepSeek rule (ids [0, 3, 6]; the Llama rule's [-1, 2, 5] would leave the packed aux
buffer short and fail the first request on this target). Re-serving the draft with the ids the
explanation gives (``specdiff fix``) must then agree with training.

Builds the DeepSeek-V3 pair on first use (3-13 min on 2 cores; cached in pytest's cache), then
two server runs. Run with ``pytest -m server tests/server/test_family_seed.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("sglang")

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(3600)]

FAMILY, ARCH = "deepseek_v3", "DeepseekV3ForCausalLM"
PROMPTS, MAX_NEW = 4, 48


def _cli(*args, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdiff.tui", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def seed_demo(family_models, tmp_path_factory):
    """(process, summary.json, workdir, models) of ``specdiff demo --family deepseek_v3 --scenario
    seed --no-tui --verify-fix`` on the DeepSeek-V3 pair: the seed served and diffed, then what
    ``specdiff fix`` writes for it served again, recorded and diffed."""
    pair = family_models[FAMILY]
    root = tmp_path_factory.mktemp("seed-demo")
    proc = _cli("demo", "--family", FAMILY, "--scenario", "seed", "--no-tui", "--workdir", root,
                "--models", pair.root, "--prompts", PROMPTS, "--max-new-tokens", MAX_NEW, "--verify-fix")
    workdir = root / f"{FAMILY}-seed"
    assert (workdir / "summary.json").exists(), f"demo failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads((workdir / "summary.json").read_text()), workdir, pair.root


def test_the_seed_on_deepseek_stops_at_the_aux_stage_with_the_deepseek_rule_fix(seed_demo):
    proc, summary, _, _ = seed_demo
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert summary["demo_worked"] is True and summary["family"] == FAMILY
    assert summary["served_ids"] == [3, 6, 7]  # the seed's shifted layers, in the DeepSeek rule
    report = summary["report"]
    assert report["first_divergence"]["tensor"].startswith("target.aux.")
    first = report["explanations"][0]
    assert first["cause"] == "aux_layer_shift", report["explanations"]
    assert "serving slot 0 = training HF hidden_states[3]" in first["message"]
    # the fix is in the target's rule: DeepSeek ids are HF indices
    assert "[0, 3, 6]" in first["fix"] and "deepseek" in first["fix"], first["fix"]
    assert "[-1, 2, 5]" not in first["fix"]
    assert "scenario 'seed': served with eagle_aux_hidden_state_layer_ids [3, 6, 7]" in proc.stdout
    assert ARCH in proc.stdout  # the rule the ids were read by is named
    # both sides' contracts say which layers were captured, and the architecture
    from specdiff.tracer.store import open_trace

    _, _, workdir, _ = seed_demo
    serve = open_trace(str(workdir / "serve.trace")).contract
    assert serve["aux_hf_indices"] == [3, 6, 7] and serve["target_architecture"] == ARCH
    assert open_trace(str(workdir / "train.trace")).contract["aux_hf_indices"] == [0, 3, 6]


def test_the_llama_rule_fix_would_fail_the_first_request_on_deepseek():
    """Why the fix must come from the target's rule: [-1, 2, 5] on DeepSeek-V3 captures two slots
    and the packed aux buffer raises on the first request (aux_hidden_states.py:86-89)."""
    from specdiff.eagle3.aux_layers import engine_capture

    plan = engine_capture("sglang", [-1, 2, 5], num_layers=8, architecture=ARCH)
    assert plan.slots == 2 and plan.dropped == (-1,) and "RuntimeError" in plan.failure
    assert engine_capture("sglang", [0, 3, 6], num_layers=8, architecture=ARCH).hf_indices == (0, 3, 6)


def test_fix_verify_writes_the_deepseek_ids_and_the_re_served_pair_agrees(seed_demo):
    """``specdiff fix`` writes the family-correct ids (DeepSeek: HF indices [0, 3, 6], not the Llama
    rule's [-1, 2, 5]) into a copy of the served draft; ``--verify`` serves it, records, replays and
    diffs: no divergence, the captured layers are training's."""
    from specdiff.tracer.store import open_trace

    proc, summary, workdir, _ = seed_demo
    fix = summary["fix"]
    assert "refused" not in fix and fix["cause"] == "aux_layer_shift", fix
    assert [(c["old"], c["new"]) for c in fix["config"]] == [([3, 6, 7], [0, 3, 6])], fix["config"]
    cfg = json.loads((workdir / "fixed-draft" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6], cfg
    v = fix["verify"]
    assert v["verified"] is True and v["line"].startswith("fix verified: no divergence"), v
    served = open_trace(v["traces"][1]).contract
    assert served["aux_hf_indices"] == [0, 3, 6] and served["target_architecture"] == ARCH
    # Acceptance is no witness here: the 60-step DeepSeek-V3 target's continuations loop (18 ids over
    # 16 held-out prompts), so even the shifted layers are accepted (measured: seed 3.77, fixed 3.66).
    # The layer mistake shows in the traces, which is what specdiff reads.
    print(f"DeepSeek-V3 seed: {v['line']}")
    assert v["accept_length_after"] > 1.0, v  # the trained draft is accepted once fed its layers
