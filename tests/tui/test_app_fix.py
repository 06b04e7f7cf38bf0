"""The app's fix actions (issue 32, tui/fix_actions.py): ``w`` writes what ``specdiff fix`` writes into a
folder the user picks, ``v`` refuses before a fix is written; the palette offers both. ``v``'s
re-serving on a real CPU SGLang server: tests/server/test_fix_verify.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiff.tui.app import SpecdiffApp
from specdiff.tui.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "traces" / "examples" / "seed"
SIZE = (120, 40)
pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(not (SEED / "serve.trace").exists(), reason="the shipped seed pair is absent")]


async def test_w_writes_the_seed_fix_into_the_folder_chosen_and_never_over_an_earlier_one(tmp_path, tui):
    app = SpecdiffApp(str(SEED / "train.trace"), str(SEED / "serve.trace"))
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("v")  # nothing written yet: refused, nothing runs
        await pilot.pause()
        assert app.fixed is None and not app.workers
        await pilot.press("w")
        await tui.wait_for(pilot, lambda: app.screen.query("#fix-dir"))
        box = app.screen.query_one("#fix-dir")
        assert box.value == str(SEED / "fixed-draft")  # beside the serving trace (a free name)
        box.value = str(tmp_path / "fixed")
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.fixed is not None)
        await pilot.press("w")
        await tui.wait_for(pilot, lambda: app.screen.query("#fix-dir"))
        app.screen.query_one("#fix-dir").value = str(tmp_path / "fixed")  # exists: refused, kept
        await pilot.press("enter")
        await pilot.pause()
    cfg = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 5]  # tests/replay/fix/test_fix.py
    assert app.fixed == tmp_path / "fixed" and sorted(p.name for p in tmp_path.iterdir()) == ["fixed"]
    assert not (SEED / "fixed-draft").exists()


def test_the_palette_offers_write_and_verify_with_their_keys():
    from specdiff.tui.keys import BINDINGS

    for action in ("write_fix", "verify_fix"):
        assert any(c.action == action for c in COMMANDS), action
        assert any(b.action == action for b in BINDINGS), action
