"""The app's fix actions (tui/fix_actions.py): ``w`` writes what ``specdiff fix`` writes into a
folder the user picks, ``v`` refuses before a fix is written; the palette offers both. ``v``'s
re-serving on a real CPU SGLang server: tests/server/test_fix_verify.py. Where ``w`` and ``e`` write by
default (tui/default_dirs.py): beside the traces, or the checkout's ignored specdiff-out/ for the shipped
pair, so that using them leaves the working tree (and every test) as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.tui.app import SpecdiffApp
from specdiff.tui.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "traces" / "examples" / "seed"
SIZE = (120, 40)
pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(not (SEED / "serve.trace").exists(), reason="the shipped seed pair is absent")]


@pytest.fixture
def seed_copy(tmp_path) -> Path:
    """The shipped seed pair and its served draft, copied outside the checkout (the traces name the draft
    as traces/examples/seed/served-draft, found from the traces' own folders: tracer/paths.py)."""
    seed = tmp_path / "traces" / "examples" / "seed"
    shutil.copytree(SEED, seed)  # the served draft's weights symlink is copied as the file it names
    return seed


async def test_w_writes_the_seed_fix_into_the_folder_chosen_and_never_over_an_earlier_one(seed_copy, tmp_path, tui):
    app = SpecdiffApp(str(seed_copy / "train.trace"), str(seed_copy / "serve.trace"))
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("v")  # nothing written yet: refused, nothing runs
        await pilot.pause()
        assert app.fixed is None and not app.workers
        await pilot.press("w")
        await tui.wait_for(pilot, lambda: app.screen.query("#fix-dir"))
        box = app.screen.query_one("#fix-dir")
        assert box.value == str(seed_copy / "fixed-draft")  # beside the serving trace (a free name)
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
    assert app.fixed == tmp_path / "fixed" and sorted(p.name for p in tmp_path.iterdir()) == ["fixed", "traces"]
    assert sorted(p.name for p in seed_copy.iterdir()) == ["serve.trace", "served-draft", "train.trace"]



@pytest.fixture
def clone(tmp_path, monkeypatch) -> Path:
    """A fresh clone's layout (a git work tree with the checkout's .gitignore and pyproject.toml and the
    shipped seed pair), taken by the app as the specdiff checkout (tui/default_dirs.py ``CHECKOUT``)."""
    from specdiff.tui import default_dirs

    root = tmp_path / "clone"
    shutil.copytree(SEED, root / "traces" / "examples" / "seed")
    for name in (".gitignore", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.setattr(default_dirs, "CHECKOUT", root)
    return root


def _untracked(root: Path) -> list[str]:
    """What ``git status`` shows in ``root`` (nothing is committed there: every file not ignored)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.splitlines()


@pytest.mark.slow
async def test_w_e_and_fix_on_the_shipped_pair_by_default_leave_the_working_tree_as_it_was(clone, tui):
    before, seed = _untracked(clone), clone / "traces" / "examples" / "seed"
    ignored = clone / "specdiff-out" / "traces" / "examples" / "seed"
    app = SpecdiffApp(str(seed / "train.trace"), str(seed / "serve.trace"))
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("w")
        await tui.wait_for(pilot, lambda: app.screen.query("#fix-dir"))
        assert app.screen.query_one("#fix-dir").value == str(ignored / "fixed-draft")
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.fixed is not None)
        await pilot.press("e")
        await tui.wait_for(pilot, lambda: app.screen.query("#export-dir"))
        assert app.screen.query_one("#export-dir").value == str(ignored / "specdiff-exports")
        await pilot.press("enter")
        await tui.wait_for(pilot, lambda: app.exported is not None)
    assert (ignored / "fixed-draft" / "config.json").is_file() and app.exported.parent == ignored / "specdiff-exports"
    # the README's fix example, from the clone's root
    done = subprocess.run([sys.executable, "-m", "specdiff.tui", "fix", "traces/examples/seed/train.trace",
                           "traces/examples/seed/serve.trace", "-o", "specdiff-demo/fixed-seed-draft", "--overwrite"],
                          cwd=clone, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (clone / "specdiff-demo" / "fixed-seed-draft" / "config.json").is_file(), done.stderr
    assert _untracked(clone) == before


def test_defaults_lie_beside_traces_outside_the_checkout_and_under_its_ignored_folder_inside(tmp_path):
    from specdiff.tui.default_dirs import CHECKOUT, IGNORED, default_dir

    assert default_dir(tmp_path / "a" / "serve.trace", "fixed-draft") == tmp_path / "a" / "fixed-draft"
    assert default_dir(SEED / "serve.trace", "fixed-draft") == CHECKOUT / IGNORED / "traces/examples/seed/fixed-draft"
    assert default_dir(tmp_path / "serve.trace", "x", checkout=tmp_path) == tmp_path / "x"  # no pyproject.toml
    (tmp_path / "pyproject.toml").write_text("")
    assert default_dir(tmp_path / "serve.trace", "x", checkout=tmp_path) == tmp_path / IGNORED / "x"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(CHECKOUT / IGNORED / "traces")], cwd=CHECKOUT)
    assert ignored.returncode == 0  # ignored by the checkout's .gitignore

def test_the_palette_offers_write_and_verify_with_their_keys():
    from specdiff.tui.keys import BINDINGS

    for action in ("write_fix", "verify_fix"):
        assert any(c.action == action for c in COMMANDS), action
        assert any(b.action == action for b in BINDINGS), action
