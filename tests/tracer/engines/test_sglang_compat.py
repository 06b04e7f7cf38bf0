"""What specdiff's CPU launcher needs from the installed SGLang, on whichever release is installed.

The launcher (``tracer/engines/sglang/cpu/serve.py``) must keep SGLang's ``intel_amx`` attention backend on a
CPU without AMX: ``claim_amx`` sets ``override_platform`` (SGLang >= 0.5.19) or, on older
releases (0.5.15.post1 run), the ``cpu_has_amx_support`` name that SGLang's platform fallback
reads. Each check runs in a fresh interpreter because both change process-wide state.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("sglang")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def test_cpu_launcher_keeps_the_intel_amx_backend_on_a_cpu_without_amx():
    r = _run("""
        from types import SimpleNamespace
        from sglang.srt.arg_groups.overrides import _attention_backend_platform_fallbacks as fallbacks
        from specdiff.tracer.engines.sglang.cpu.serve import claim_amx
        view = SimpleNamespace(attention_backend="intel_amx", device="cpu")
        print("NAME", claim_amx())
        print("FALLBACK", fallbacks(view))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FALLBACK {}" in r.stdout  # intel_amx kept: EAGLE's CPU draft backend table accepts only it
    assert "NAME sglang.srt." in r.stdout


def test_cpu_launcher_names_the_missing_sglang_function_in_one_line():
    """An SGLang with neither name: one ``specdiff: error:`` line naming both, exit 1, no traceback."""
    r = _run("""
        import sglang.srt.runtime_context as rc
        import sglang.srt.arg_groups.overrides as ov
        for mod, name in ((rc, "override_platform"), (ov, "cpu_has_amx_support")):
            if hasattr(mod, name):
                delattr(mod, name)
        from specdiff.tracer.engines.sglang.cpu.serve import main
        main(["--model-path", "/nonexistent"])
    """)
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.startswith("specdiff:")]
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert err[0].startswith("specdiff: error: cannot run SGLang ")
    assert "override_platform" in err[0] and "cpu_has_amx_support" in err[0]
