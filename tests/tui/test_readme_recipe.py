"""The README's GPU recipe, the parts that run without a server or a GPU: its prompts file example is read
by ``record client --prompts`` as the README says (a ``jsonl`` block: text, input_ids with its own
max_new_tokens, a bare string), and ``record train``'s ``--device`` there is an option it takes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specdiff.tui.serve_http import read_prompts

ROOT = Path(__file__).resolve().parents[2]


def _jsonl_blocks() -> list[str]:
    return re.findall(r"^```jsonl\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_the_readmes_prompts_file_is_read_as_it_says(tmp_path):
    (block,) = _jsonl_blocks()
    path = tmp_path / "prompts.jsonl"
    path.write_text(block)
    prompts = read_prompts(str(path))
    assert [json.loads(line) for line in block.splitlines()][2] == "Explain speculative decoding in one paragraph."
    assert prompts[0] == {"text": "def quicksort(xs):"}
    assert prompts[1]["input_ids"] == [128000, 755, 4062, 10629] and prompts[1]["max_new_tokens"] == 128
    assert prompts[2] == {"text": "Explain speculative decoding in one paragraph."}  # a bare string is a text


def test_the_recipes_record_train_options_exist(run_cli):
    text = run_cli("record", "train", "--help").output
    for option in ("--target", "--draft", "--replay", "-o", "--device"):
        assert re.search(rf"(^|\s){re.escape(option)}[ ,]", text), option
