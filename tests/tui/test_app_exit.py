"""The app's exit code is the verdict, however it is left: ``q`` before the report
landed exited 0 ("the traces agree") on a diverged pair, Textual's own ctrl+q exited 0 at any time,
and Ctrl-C showed Textual's "press ctrl+q to quit" instead of the one line and 130 the CLI promises.
Now: 1 while a divergence is shown or the diff is still deciding, 0 only once the report says the
traces agree, 130 with its one line for Ctrl-C.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from specdiff.tui.app import SpecdiffApp

SIZE = (120, 40)
SEED = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def seed_pair(tmp_path_factory, aux_traces):
    """The seed bug as a small synthetic pair (training HF [0, 3, 6], serving [3, 6, 7]): diverged."""
    root = tmp_path_factory.mktemp("seed")
    return (aux_traces.write(root / "train.trace", side="train", hf=[0, 3, 6], probes=True),
            aux_traces.write(root / "serve.trace", side="serve", hf=[3, 6, 7]))


@pytest.fixture(scope="module")
def correct_pair(tmp_path_factory, aux_traces):
    """The same layers on both sides (other row order, noise): no divergence."""
    root = tmp_path_factory.mktemp("correct")
    return (aux_traces.write(root / "train.trace", side="train", hf=[0, 3, 6], probes=True),
            aux_traces.write(root / "serve.trace", side="serve", hf=[0, 3, 6], order=[1, 0], noise=2e-4))


@pytest.fixture
def held_diff(monkeypatch):
    """The app's diff held where it starts until the test sets the returned event (then it runs as
    ever): the report cannot land before the test has pressed its key."""
    from specdiff.replay.diff import pipeline

    go, diff_opened = threading.Event(), pipeline.diff_opened

    def held(*args, **kwargs):
        go.wait(60)
        return diff_opened(*args, **kwargs)

    monkeypatch.setattr(pipeline, "diff_opened", held)
    yield go
    go.set()


async def _quit_before_the_report(pair, key: str, held_diff, tui) -> SpecdiffApp:
    held_diff.clear()  # held again for this app: an earlier call released it (a fast CPU then landed the report first)
    app = SpecdiffApp(*pair, export_root=Path(pair[0]).parent)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, lambda: "opening traces" in tui.static_text(app, "#verdict"))
        await pilot.press(key)
        assert app.report is None  # still deciding
        held_diff.set()
    return app


@pytest.mark.parametrize("key", ["q", "ctrl+q"])
async def test_quitting_before_the_report_is_never_the_agree_code(seed_pair, correct_pair, held_diff, key, tui):
    # the diverged pair and the correct one alike: nothing has said they agree yet
    for pair in (seed_pair, correct_pair):
        app = await _quit_before_the_report(pair, key, held_diff, tui)
        assert app.return_code == 1, (pair, key)


@pytest.mark.parametrize("key", ["q", "ctrl+q"])
async def test_quitting_after_the_report_exits_with_its_verdict(seed_pair, correct_pair, key, tui):
    for pair, code in ((seed_pair, 1), (correct_pair, 0)):
        app = SpecdiffApp(*pair, export_root=Path(pair[0]).parent)
        async with app.run_test(size=SIZE) as pilot:
            await tui.wait_for(pilot, tui.ready(app))
            await pilot.press(key)
        assert app.return_code == code, (pair, key)


async def test_ctrl_c_in_the_app_exits_130_before_and_after_the_report(seed_pair, held_diff, tui):
    app = await _quit_before_the_report(seed_pair, "ctrl+c", held_diff, tui)
    assert app.return_code == 130
    app = SpecdiffApp(*seed_pair, export_root=Path(seed_pair[0]).parent)
    async with app.run_test(size=SIZE) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.press("ctrl+c")
    assert app.return_code == 130  # not Textual's "press ctrl+q to quit" notice


@pytest.mark.slow
@pytest.mark.skipif(not (SEED / "serve.trace").exists(), reason="the shipped seed pair is absent")
def test_ctrl_c_in_view_on_a_terminal_is_the_one_interrupted_line_and_130(tui):
    code, screen = tui.on_pty(["view", SEED / "train.trace", SEED / "serve.trace"], ready=b"aux_layer_shift",
                              key=b"\x03")
    assert code == 130
    text = re.sub(r"\x1b(\[[0-9;?<>=$]*[A-Za-z~]|\][^\x07]*\x07|[=>P])", "", screen)
    said = [ln.strip() for ln in text.splitlines() if re.search(r"specdiff:|Traceback|Error|ctrl\+q", ln)]
    assert said == ["specdiff: interrupted: the app was closed; nothing was written (view writes only the slices "
                    "e exports)"], text[-3000:]
