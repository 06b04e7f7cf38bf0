"""The README's GPU recipe, the parts that run without a server or a GPU: its prompts file example is read
by ``record client --prompts`` as the README says (a ``jsonl`` block: text, input_ids with its own
max_new_tokens, a bare string), ``record train``'s ``--device`` there is an option it takes, and the
recipe's own commands, but for the server's, run as written on the CPU with the shipped models and
the shipped seed pair's serving trace in place of the reader's."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

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


#: the recipe's placeholders -> what this checkout ships: the demo's correct draft as the one trained,
#: and a serving trace of the seed's draft (its aux ids in the wrong numbering) as what the server recorded
_SHIPPED = {"/models/llama-8b": "traces/models/target", "/ckpt/eagle3": "traces/models/draft",
            "--training-layers 1,15,28": "--training-layers 0,2,5", "--device cuda": "--device cpu"}
_SERVER_LINES = ("python -m sglang.launch_server", "specdiff record client")


def _recipe_commands() -> list[str]:
    """The ``specdiff`` commands of the GPU recipe's bash block (continuation lines joined, comments cut),
    but the server's own and the client's, which need a server (the server tests run those)."""
    section = (ROOT / "README.md").read_text().split("## On your own models", 1)[1]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    recipe = next(b for b in blocks if "launch_server" in b).replace("\\\n", " ")
    lines = [line.split(" #")[0].strip() for line in recipe.splitlines()]
    return [line for line in lines if line.startswith(("specdiff", "SPECDIFF_TRACE"))
            and not any(s in line for s in _SERVER_LINES)]


@pytest.mark.slow
def test_the_recipes_commands_run_on_the_cpu_with_the_shipped_models(tmp_path):
    """check, record train and the compare step of the recipe, as written but for the paths: check names
    the training layers' mismatch (exit 1), record train writes the training side of the shipped serving
    trace, and the compare step (``diff`` for ``view``, which needs a terminal) finds the seed's mistake."""
    (tmp_path / "serve.trace").symlink_to(ROOT / "traces/examples/seed/serve.trace")
    commands = _recipe_commands()
    assert [c.split()[1] for c in commands] == ["check", "record", "view"], commands
    results = []
    for command in commands:
        for placeholder, shipped in _SHIPPED.items():
            command = command.replace(placeholder, shipped if not shipped.startswith("traces") else str(ROOT / shipped))
        args = shlex.split(command)[1:]
        args[0] = "diff" if args[0] == "view" else args[0]
        results.append(subprocess.run([sys.executable, "-m", "specdiff.tui", *args], cwd=tmp_path,
                                      capture_output=True, text=True, timeout=600))
    check, train, compare = results
    assert check.returncode == 1 and "training.mismatch" in check.stdout, check.stdout + check.stderr
    assert train.returncode == 0 and (tmp_path / "train.trace").is_dir(), train.stderr[-2000:]
    assert compare.returncode == 1, compare.stderr[-2000:]
    assert compare.stdout.startswith("first divergence: target.aux.0"), compare.stdout[:500]
    assert "aux_layer_shift" in compare.stdout
