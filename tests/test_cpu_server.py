"""Real SGLang 0.5.23 serving EAGLE-3 on this CPU, through specdiff's launcher.

Starts real servers (``specdiff.tracer.cpu.launch.ServerProcess``: stand-in ``sgl_kernel``
first on PYTHONPATH, AMX platform override in the launching process) on throwaway tiny
models built offline (``tests/_bringup_models.py``). Each server takes ~30-60 s to start.
Run with ``pytest -m server``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from specdiff.tracer.cpu.launch import ServerError, ServerProcess, SpecSettings  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPTS = ["def main():\n    ", "import os\nimport sys\n\nclass "]
MAX_NEW = 24


def _bringup():
    spec = importlib.util.spec_from_file_location("_bringup_models", Path(__file__).with_name("_bringup_models.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bringup")
    mod = _bringup()
    mod.build_bringup_models(root)
    mod.build_oracle_models(root)
    return root


def _generate_all(srv: ServerProcess) -> list[dict]:
    return [srv.generate(p, max_new_tokens=MAX_NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain_outputs(model_root) -> list[list[int]]:
    with ServerProcess(model_root / "target") as srv:
        outs = _generate_all(srv)
    for o in outs:
        assert "spec_accept_length" not in o["meta_info"]
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize(
    "spec",
    [SpecSettings(num_steps=3, topk=1, num_draft_tokens=4), SpecSettings(num_steps=3, topk=2, num_draft_tokens=4)],
    ids=["chain", "topk2-tree"],
)
def test_greedy_eagle3_output_equals_non_speculative_output(model_root, plain_outputs, spec):
    with ServerProcess(model_root / "target", draft_model_path=model_root / "draft", spec=spec) as srv:
        pid = srv.pid
        outs = _generate_all(srv)
    assert srv.proc.poll() is not None, f"server {pid} still running after stop()"
    for o, plain in zip(outs, plain_outputs, strict=True):
        meta = o["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW
        assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] >= 1.0
        assert o["output_ids"] == plain


def test_an_always_right_draft_is_fully_accepted(model_root):
    spec = SpecSettings(num_steps=3, topk=1, num_draft_tokens=4)
    with ServerProcess(model_root / "oracle-target", draft_model_path=model_root / "oracle-draft", spec=spec) as srv:
        out = srv.generate(PROMPTS[0], max_new_tokens=MAX_NEW)
    meta = out["meta_info"]
    assert out["output_ids"] == [0] * MAX_NEW
    # every verify commits 3 drafts + 1 bonus
    assert meta["spec_verify_ct"] == MAX_NEW // 4
    assert meta["spec_accept_length"] == pytest.approx(4.0)
    assert meta["spec_num_correct_drafts"] == meta["spec_num_proposed_drafts"]


def test_a_server_that_dies_at_startup_reports_its_log(tmp_path):
    srv = ServerProcess(tmp_path / "no-such-model", startup_timeout_s=300, log_path=tmp_path / "server.log")
    with pytest.raises(ServerError, match="exited with code") as err:
        srv.start()
    assert "last lines" in str(err.value)
    assert srv.proc.poll() is not None


def test_standin_attention_matches_sglang_torch_native_backend_in_fp32(model_root):
    """Independent check of the attention stand-ins inside SGLang: the same model served
    with SGLang's own torch_native attention. In fp32 greedy outputs agree token for token
    (in bf16 a random model's near-tied logits can flip between implementations)."""
    outs = {}
    for backend in ("intel_amx", "torch_native"):
        extra = ["--dtype", "float32"] + (["--attention-backend", "torch_native"] if backend == "torch_native" else [])
        with ServerProcess(model_root / "target", extra_args=extra) as srv:
            outs[backend] = [o["output_ids"] for o in _generate_all(srv)]
    assert outs["intel_amx"] == outs["torch_native"]
