"""An eager vLLM 0.32.0 CPU server on the demo target, as the vLLM server tests start it.

vLLM runs in its own venv (``.venv-vllm``: its CPU wheel pins another torch; ``make vllm-venv``, which
``make test`` runs). ``--enforce-eager``: the bugs and facts these tests read live in vLLM's Python, not
in a compiled forward, and an eager server starts in about a minute where a compiled one took four.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.demo.run import REPO_MODELS

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
#: skip a test where the vLLM venv is not built
NEEDS_VLLM = pytest.mark.skipif(not VLLM_PY.exists(), reason="no vLLM venv at .venv-vllm (build it with `make "
                                                             "vllm-venv`; `make test` does)")


def vllm_server(tmp_path: Path, draft: Path, env: dict, extra_args=(), log: Path | None = None):
    """The (not yet started) ``VLLMServerProcess`` serving the demo target with ``draft`` under ``env``,
    eager, ``extra_args`` as given; its log at ``log`` (default ``tmp_path / "server.log"``). Use it as a
    context manager: it starts on enter and is stopped by PID on exit."""
    from specdiff.tracer.engines.vllm.cpu import VLLMServerProcess

    return VLLMServerProcess(REPO_MODELS / "target", draft_model_path=draft, python=str(VLLM_PY), env=env,
                             cache_root=str(ROOT / ".cache" / "vllm"), log_path=str(log or tmp_path / "server.log"),
                             extra_args=["--enforce-eager", *extra_args])
