"""The app's keys, palette and Sequences pane as a newcomer meets them: every
binding shown in the footer or on the keys screen (``?``) at 80x24 and 120x40, ``q`` in the footer,
the keys screen rendered (no raw markup), specdiff's actions in the command palette, and the prompt
text (not token ids) in the Sequences pane where the target's tokenizer is found.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.command import CommandList, CommandPalette
from textual.widgets import DataTable
from textual.widgets._footer import FooterKey

from specdiff.tui.app import SpecdiffApp
from specdiff.tui.grid import PipelineGrid
from specdiff.tui.screens import ExportScreen, HelpScreen

pytestmark = pytest.mark.anyio
SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "examples" / "seed"
needs_example = pytest.mark.skipif(not (EXAMPLE / "serve.trace").exists(), reason="the shipped example pair is absent")


@pytest.fixture
def seed_pair(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "train.trace", side="train", hf=[0, 3, 6], probes=True)
    b = aux_traces.write(tmp_path / "serve.trace", side="serve", hf=[3, 6, 7])
    return a, b


def _footer_keys(app, width: int) -> set[str]:
    """Keys whose footer entry is drawn whole on screen (not cut at the right edge, not hidden)."""
    return {k.key for k in app.screen.query(FooterKey)
            if k.display and k.region.width and k.region.right <= width}


@SIZES
async def test_every_binding_is_in_the_footer_or_on_the_keys_screen(seed_pair, tmp_path, size, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    bindings = [*app.BINDINGS, *PipelineGrid.BINDINGS]
    async with app.run_test(size=size) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        await pilot.pause()
        footer = _footer_keys(app, size[0])
        # what the footer offers is whole at both sizes: q and the keys screen's ? included, and the palette
        assert {b.key for b in app.BINDINGS if b.show} <= footer
        assert {"q", "question_mark", "ctrl+p"} <= footer
        await pilot.press("question_mark")
        await tui.wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = tui.static_text(app.screen, "#help")
        rows = {line.split("  ")[0].strip(): line for line in text.splitlines() if "  " in line}
        for b in bindings:  # every key, each on a row of its own group's keys (n / N, not the footer's n/N)
            key = app.get_key_display(b.with_key(b.key))
            assert any(key in keys.split(" / ") for keys in rows), (b.key, key, text)
        assert "[/" not in text and "[b]" not in text  # rendered, not markup
        assert "next / previous failing row" in text and "command palette" in text
        box = app.screen.query_one("#help-box")
        if box.max_scroll_y:  # shorter than the list (80x24): it scrolls to its last line
            await pilot.press("end")
            await tui.wait_for(pilot, lambda: box.scroll_y == box.max_scroll_y)
        await pilot.press("escape")
        await tui.wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.press("q")
    assert app.return_code == 1


async def _palette(pilot, app, tui, query: str, title: str) -> None:
    """Open the palette, type ``query``, wait for the entry ``title`` and run it."""
    await pilot.press("ctrl+p")
    await tui.wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
    await pilot.press(*query)

    def listed() -> list[str]:
        options = app.screen.query_one(CommandList).options
        return [str(o.hit.text) for o in options]

    await tui.wait_for(pilot, lambda: title in listed())
    palette = app.screen.query_one(CommandList)
    palette.highlighted = listed().index(title)
    await pilot.press("enter")
    await tui.wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette))


async def test_the_palette_finds_and_runs_specdiffs_own_actions(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        first = app.sel
        await pilot.press("n")
        assert app.sel != first
        await _palette(pilot, app, tui, "first div", "Jump to first divergence")
        assert app.sel == first
        await _palette(pilot, app, tui, "export", "Export the selected slice")
        await tui.wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        await pilot.press("escape")
        await _palette(pilot, app, tui, "loose", "Tolerance preset: loose")
        await tui.wait_for(pilot, lambda: app.preset == "loose")
        await _palette(pilot, app, tui, "explan", "Open explanation")
        assert app.focused is app.query_one("#explain")


@needs_example
async def test_the_sequences_pane_shows_the_prompt_text_from_any_working_directory(tmp_path, monkeypatch, tui):
    monkeypatch.chdir(tmp_path)  # the pair names traces/models/target relative to the repo root
    app = SpecdiffApp(str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace"), export_root=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert app.vm.tokenizer is not None
        assert app.query_one("#seq-box").border_title == "Sequences"
        pair = app.vm.pairs[app.sel.pair]
        tokens = app.report.traces.x.sequence(pair.seq.x).tokens[:pair.prompt_len]
        words = app.vm.tokenizer.decode([int(t) for t in tokens], skip_special_tokens=True).split()
        shown = " ".join(tui.static_text(app, "#prompt").split())
        assert shown.startswith("prompt ") and " ".join(words[:3]) in shown
        await pilot.press("shift+tab")  # the list (before the grid): another sequence, its prompt under it
        assert isinstance(app.focused, DataTable)
        await pilot.press("down")
        await tui.wait_for(pilot, lambda: app.sel.pair == 1)
        assert " ".join(tui.static_text(app, "#prompt").split()) != shown


async def test_without_a_tokenizer_the_sequences_pane_says_it_shows_token_ids(seed_pair, tmp_path, tui):
    app = SpecdiffApp(*seed_pair, export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert app.vm.tokenizer is None
        assert app.query_one("#seq-box").border_title == "Sequences: ids"
        prompt = tui.static_text(app, "#prompt")
        first = app.report.traces.x.sequence(app.vm.pairs[0].seq.x).tokens[0]
        assert prompt.startswith(f"prompt {int(first)} ") and "no tokenizer" in prompt
