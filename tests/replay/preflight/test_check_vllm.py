"""``specdiff check --engine vllm``: vLLM 0.32.0's own advice on where its V1 and V2 runners read a
draft's aux ids (each case a config edit of the tiny pair of tests/support/preflight_pair.py), the
option's help, and the key precedence against vLLM's own functions in its venv.
"""

from __future__ import annotations

import json

import pytest
from support.preflight_pair import edit_config

from specdiff.replay.preflight.check import run_preflight


# ---- check --engine vllm: vLLM 0.32.0's own advice (its key and numbering) ------------------------
def _nested(ids):
    return lambda c: (c.pop("eagle_aux_hidden_state_layer_ids", None), c.update(eagle_config={
        "eagle_aux_hidden_state_layer_ids": ids}))


def _only_key(**kw):
    def edit(c):
        c.pop("eagle_aux_hidden_state_layer_ids", None)
        c.pop("eagle_config", None)
        c.update(kw)
    return edit


# (case, config edit, vLLM V1's source + HF fed, [(kind, severity, words in message or fix)])
VLLM_CASES = [
    ("correct: both keys, one per engine", lambda c: None, ("top-level", (0, 4, 7)), [
        ("aux.source", "info", "reads the aux ids [0, 4, 7] from top-level eagle_aux_hidden_state_layer_ids (its "
         "precedence: top-level eagle_aux_hidden_state_layer_ids, else eagle_config.eagle_aux_hidden_state_layer_ids, "
         "else dflash_config.target_layer_ids (+1); vLLM 0.32.0 v1/worker/gpu_model_runner.py:5268-5283 (V1 runner))")]),
    ("SGLang-format draft: nested ids with -1", _nested([-1, 3, 6]), ("eagle_config", (3, 6)), [
        ("aux.sglang_ids", "error", "eagle_config ids [-1, 3, 6] read in SGLang's numbering are HF [0 (embed), 4 (out "
         "L3), 7 (out L6)]"),
        ("aux.sglang_ids", "error", "id -1 matches no layer, so 2 of 3 slots reach fc and the first request crashes"),
        ("aux.sglang_ids", "error", "fix: add top-level eagle_aux_hidden_state_layer_ids = [0, 4, 7]"),
        ("aux.slot_count", "error", "shape '[-1, 192]' is invalid"),
        ("aux.runner_differs", "warn", "V2 (config/vllm.py:722-738; vLLM 0.32.0 v1/worker/gpu/spec_decode/eagle/"
         "eagle3_utils.py:100-137 (V2 runner)) reads none of its keys"),
        ("aux.runner_differs", "warn", "fix: write the ids at top-level eagle_aux_hidden_state_layer_ids, which both "
         "runners read first: [0, 4, 7] (vLLM id k = HF k)"),
        ("aux.runner_differs", "warn", "HF [2 (out L1), 4 (out L3), 5 (out L4)]")]),
    ("SGLang-format draft without -1: every layer shifted", _nested([1, 3, 6]), ("eagle_config", (1, 3, 6)), [
        ("aux.sglang_ids", "warn", "vLLM feeds HF [1 (out L0), 3 (out L2), 6 (out L5)], SGLang HF [2 (out L1), "
         "4 (out L3), 7 (out L6)] from the same key"),
        ("aux.sglang_ids", "warn", "fix: add top-level eagle_aux_hidden_state_layer_ids = [2, 4, 7]")]),
    ("ids only in a key V1 ignores (eagle_config.layer_ids, read by V2)",
     _only_key(eagle_config={"layer_ids": [0, 4, 7]}), ("default", (2, 4, 5)), [
        ("aux.ignored_key", "error", "eagle_config.layer_ids [0, 4, 7] is not a key vLLM V1 reads"),
        ("aux.ignored_key", "error", "it falls back to its default HF [2 (out L1), 4 (out L3), 5 (out L4)]: vLLM V1 "
         "falls back to get_eagle3_default_aux_hidden_state_layers (interfaces.py:1712-1733) and logs nothing"),
        ("aux.ignored_key", "error", "fix: write the ids at the top level in vLLM's numbering (id k = HF k): "
         "top-level eagle_aux_hidden_state_layer_ids = [0, 4, 7]"),
        ("aux.runner_differs", "warn", "reads eagle_config.layer_ids [0, 4, 7]: HF [0 (embed), 4 (out L3), 7 (out L6)]; "
         "V1 (the CPU build, or VLLM_USE_V2_MODEL_RUNNER=0) feeds HF [2 (out L1), 4 (out L3), 5 (out L4)]")]),
    ("DFlash ids hidden by an eagle_config dict without ids",
     _only_key(dflash_config={"target_layer_ids": [-1, 3, 6]}, eagle_config={"use_aux_hidden_state": True}),
     ("default", (2, 4, 5)), [
        ("aux.shadowed_key", "warn", "dflash_config.target_layer_ids [-1, 3, 6] is not used: vLLM V1 takes no ids "
         "because eagle_config is a dict without eagle_aux_hidden_state_layer_ids"),
        ("aux.runner_differs", "warn", "reads dflash_config.target_layer_ids [0, 4, 7]")]),
    ("fc width from the nested config only", lambda c: c.update(num_aux_hidden_states=4), ("top-level", (0, 4, 7)), [
        ("aux.fc_width", "error", "vLLM builds fc for 4 aux slots (num_aux_hidden_states; llama_eagle3.py:209-216 "
         "does not count the top-level ids) but fc.weight holds 3"),
        ("aux.fc_width", "error", "fix: set num_aux_hidden_states = 3")]),
]


@pytest.mark.parametrize("case,edit,fed,want", VLLM_CASES, ids=[c[0] for c in VLLM_CASES])
def test_check_engine_vllm_gives_vllms_own_advice(pair, run_cli, case, edit, fed, want):
    target, draft, _ = pair
    edit_config(draft, edit)
    report = run_preflight(target, draft, engines=("vllm",))
    cap = report.captures["vllm"]
    assert (cap.source, cap.hf_indices) == fed, case
    assert set(report.captures) == {"vllm"} and {f.engine for f in report.findings} <= {"vllm", "all"}
    for kind, sev, words in want:
        got = [f for f in report.findings if f.kind == kind and f.engine == "vllm"]
        assert got, (case, kind, [(f.kind, f.message) for f in report.findings])
        assert any(f.severity == sev and words in f"{f.message} fix: {f.fix}" for f in got), (case, kind, got)
    # vLLM's advice never asks for SGLang's numbering or key
    assert not [f for f in report.findings if "SGLang convention" in f.fix or "HF index - 1" in f.fix]
    r = run_cli("check", "--target", target, "--draft", draft, "--engine", "vllm")
    assert r.exit_code == (1 if report.errors else 0), r.output
    assert "SGLang 0.5.23" not in r.output.split("\n\n")[0]  # only vLLM's capture line


def test_check_help_explains_engine(run_cli):
    r = run_cli("check", "--help")
    assert r.exit_code == 0
    text = "".join(r.output.split())  # click wraps (and splits long names) at any width
    for words in ("--engine [sglang|vllm|all]", "reads the top-level eagle_aux_hidden_state_layer_ids first, else "
                  "eagle_config's", "id k = HF k", "id k captures HF k+1", "V2 runner"):
        assert "".join(words.split()) in text, words


def test_key_precedence_matches_vllms_own_functions():
    """config_aux_ids against vLLM 0.32.0's V1 ``_get_eagle3_aux_layers_from_config`` and V2's
    ``get_eagle3_aux_layers_from_config``, run in the vLLM venv on the same configs."""
    import subprocess
    from pathlib import Path

    from specdiff.eagle3.config_ids import config_aux_ids

    py = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    if not py.exists():
        pytest.skip("no vLLM venv at .venv-vllm (make vllm-venv)")
    configs = [{}, {"eagle_aux_hidden_state_layer_ids": [0, 4, 7]},
               {"eagle_aux_hidden_state_layer_ids": [], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 3]}},
               {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 3, 6]}},
               {"eagle_config": {"layer_ids": [0, 4, 7]}},
               {"dflash_config": {"target_layer_ids": [-1, 3, 6]}},
               {"dflash_config": {"target_layer_ids": [1, 2]}, "eagle_config": {"use_aux_hidden_state": True}},
               {"dflash_config": {"layer_ids": [5]}}, {"target_layer_ids": [1, 2, 3]},
               {"dspark_target_layer_ids": [1, 2]}, {"dspark_target_layer_ids": [1, 2], "model_type": "deepseek_v41"},
               {"eagle_aux_hidden_state_layer_ids": [1, 2], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [7]}}]
    script = (
        "import json, sys\nfrom types import SimpleNamespace as N\n"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n"
        "from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config as v2\n"
        "out = []\n"
        "for c in json.loads(sys.stdin.read()):\n"
        "    sc = N(draft_model_config=N(hf_config=N(**c)))\n"
        "    a = GPUModelRunner._get_eagle3_aux_layers_from_config(N(speculative_config=sc))\n"
        "    b = v2(sc)\n"
        "    out.append([None if a is None else list(a), None if b is None else list(b)])\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([str(py), "-c", script], input=json.dumps(configs), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for c, (v1, v2) in zip(configs, got, strict=True):
        for runner, want in (("v1", v1), ("v2", v2)):
            ids = config_aux_ids("vllm", c, runner=runner).ids
            assert (None if ids is None else list(ids)) == want, (runner, c)
