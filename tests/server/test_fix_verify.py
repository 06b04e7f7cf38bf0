"""``specdiff fix --verify`` on a real CPU SGLang server: the shipped seed pair's fix (the
trained aux ids written into a copy of its served draft) served again with the recorded target, settings
and prompts, both sides recorded again and diffed: no divergence, and serving accepts what training does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.demo.run import REPO_MODELS

pytestmark = [pytest.mark.server, pytest.mark.slow]

SEED = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"

if not (REPO_MODELS / "draft" / "config.json").exists() or not (SEED / "serve.trace").exists():
    pytest.skip("the demo models or the shipped seed pair are absent", allow_module_level=True)


def test_the_seed_fix_verifies_with_no_divergence_and_the_trained_acceptance(tmp_path):
    out = tmp_path / "fixed"
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "fix", str(SEED / "train.trace"),
                           str(SEED / "serve.trace"), "-o", str(out), "--verify", "--format", "json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    d = json.loads(proc.stdout)
    v = d["verify"]
    assert d["cause"] == "aux_layer_shift" and v["verified"] is True, v
    assert v["line"].startswith("fix verified: no divergence; accept length "), v["line"]
    before, after, training = v["accept_length_before"], v["accept_length_after"], v["accept_length_training"]
    # the seed served 3.10 over the aligned positions (README); fixed, serving accepts what training does
    assert after > before + 0.2, v
    assert abs(after - training) <= 0.15, v
    # the graft's estimate before the run stands next to the measured one, its error visible
    assert v["accept_length_estimate"] is not None and abs(v["accept_length_estimate"] - after) <= 0.3, v
    assert f"estimated {v['accept_length_estimate']:.2f} before the run" in v["line"]
    assert not (out / "serve.trace").exists()
    # every served sequence on both sides: the pair was read once the writer had closed it
    from specdiff.tracer.store import open_trace

    for path in v["traces"]:
        assert Path(path).parent == tmp_path / "fixed-verify"
        t = open_trace(path)
        assert t.closed and len(t.sequences) == 3, (path, len(t.sequences))


@pytest.mark.anyio
async def test_the_apps_v_serves_the_fix_w_wrote_and_shows_the_verdict(tmp_path, tui):
    """The app's fix panel actions (tui/fix_actions.py): ``w`` into a chosen folder, ``v`` re-serves it in
    a worker (the CLI's verify_fix) and the verdict line says the divergence is gone."""
    from specdiff.tui.app import SpecdiffApp

    app = SpecdiffApp(str(SEED / "train.trace"), str(SEED / "serve.trace"))
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("w")
        await tui.wait_for(pilot, lambda: app.screen.query("#fix-dir"))
        app.screen.query_one("#fix-dir").value = str(tmp_path / "fixed")
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.fixed is not None)
        await pilot.press("v")
        assert "verifying the fix" in tui.static_text(app, "#verdict")
        await tui.wait_for(pilot, lambda: getattr(app, "verdict", None) is not None, timeout=600)
        await pilot.pause()
        assert app.verdict.verified, app.verdict.line
        assert tui.static_text(app, "#verdict").startswith("fix verified: no divergence; accept length ")
    assert (tmp_path / "fixed-verify" / "serve.trace").exists()
