"""The CLI answers ``--help``, ``info`` and ``check`` without importing torch, transformers or SGLang
(``specdiff --help`` took 5-9 s because torch was imported before click parsed;
``info`` still took 2.5-4 s in ml_dtypes, ``check`` 6 s in torch).

Asserted by design, not by time: each command runs in a fresh interpreter, which then lists the
heavy modules it holds. benchmarks/cli_startup.py measures the times side by side with ``--version``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from specdiff.tui.cli import cli

ROOT = Path(__file__).resolve().parents[2]
SEED_TRACE = ROOT / "traces" / "examples" / "seed" / "serve.trace"

#: a fresh interpreter runs ``specdiff ARGS`` and prints, last, which of these modules it imported
HEAVY = ("torch", "transformers", "sglang", "zarr", "textual", "xarray", "dask", "requests", "ml_dtypes",
         "specdiff.replay.diff.explain")
PROBE = f"""
import sys
from specdiff.tui.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("LOADED", *sorted(m for m in {HEAVY!r} if m in sys.modules))
"""

#: never imported to answer these: they load inside the commands that need them
MODEL_STACK = {"torch", "transformers", "sglang"}


def _probe(*args: str) -> tuple[set[str], str]:
    """(the heavy modules ``specdiff ARGS`` imported, what it printed: stdout, then stderr)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    *printed, last = done.stdout.strip().splitlines()
    assert last.startswith("LOADED"), done.stdout[-2000:] + done.stderr[-2000:]
    return set(last.split()[1:]), "\n".join([*printed, done.stderr])


def _loaded(*args: str) -> set[str]:
    return _probe(*args)[0]


def _every_help() -> list[tuple[str, ...]]:
    """``--help`` of the group and of every command and subcommand the CLI lists."""
    ctx = click.Context(cli)
    out = [("--help",)]
    for name in cli.list_commands(ctx):
        out.append((name, "--help"))
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out += [(name, sub, "--help") for sub in cmd.list_commands(ctx)]
    return out


def test_every_help_imports_neither_the_model_stack_nor_the_trace_store():
    helps = _every_help()
    assert ("record", "train", "--help") in helps and ("check", "--help") in helps
    for args in helps:
        # zarr and Textual too: the help of a command is its options, not its data
        assert _loaded(*args) & (MODEL_STACK | {"zarr", "textual", "xarray", "dask"}) == set(), args


def test_info_reads_a_trace_without_torch_or_ml_dtypes():
    if not (SEED_TRACE / "zarr.json").is_file():
        pytest.skip("the shipped seed pair is missing (traces/examples/regenerate.py)")
    loaded = _loaded("info", str(SEED_TRACE))
    assert "zarr" in loaded  # it did read the trace (bf16 tensors among them)
    assert loaded & MODEL_STACK == set()
    # ml_dtypes' import alone was most of info's 2.5-4 s (tracer/store/arrays.py); the explain checks
    # came in with the report's wrap width
    assert loaded & {"ml_dtypes", "specdiff.replay.diff.explain"} == set()


def test_check_reads_a_safetensors_draft_without_torch():
    args = ("check", "--target", str(ROOT / "traces" / "models" / "target"),
            "--draft", str(ROOT / "traces" / "models" / "draft"))
    for extra in ((), ("--format", "json"), ("--training-layers", "3,6,7")):
        loaded, printed = _probe(*args, *extra)
        assert "vocab.coverage" in printed, printed[-2000:]  # it did read the d2t values
        # config.json, safetensors headers and the d2t / t2d values (numpy): replay/model/weight_files.py
        assert loaded & (MODEL_STACK | {"ml_dtypes", "zarr"}) == set(), extra


@pytest.mark.parametrize("args,words", [
    ([], "give exactly one of --replay SERVE_TRACE, --prompts FILE.jsonl or --features DIR"),
    (["--replay", "s.trace", "--prompts", "p.jsonl"], "(got --replay and --prompts)"),
    (["--prompts", "p.jsonl", "--steps", "0"], "--steps 0: must be >= 1"),
    (["--prompts", "p.jsonl", "--aux-convention", "hf"], "--aux-layers, which is missing"),
    (["--prompts", "p.jsonl", "--aux-layers", "6,,3"], "expected comma-separated integers"),
    (["--replay", "s.trace", "--max-new-tokens", "4"], "replayed exactly as served"),
    (["--features", "d", "--probe-positions", "3"], "--probe-positions acts on a target forward"),
    (["--prompts", "p.jsonl", "--max-samples", "2"], "--max-samples picks stored samples of --features"),
    (["--prompts", "p.jsonl", "-o", str(ROOT)], "already exists; choose another path or pass --overwrite"),
    (["--prompts", "p.jsonl", "--tp-size", "2"], "--tp-size sets SGLang's engine; add --target-backend sglang"),
    (["--features", "d", "--target-backend", "sglang"], "--features does not go with --target-backend sglang"),
    (["--replay", "s.trace", "--target-backend", "sglang", "--device-map", "auto"],
     "--device-map does not go with --target-backend sglang"),
], ids=["no-sequences", "two-sources", "steps", "convention-alone", "bad-ids", "extend-replay", "features-probe",
        "max-samples", "out-exists", "tp-size-alone", "engine-features", "engine-device-map"])
def test_record_train_says_a_usage_error_before_torch_loads(args, words, tmp_path):
    # record train imported torch and transformers first, 2-18 s before its one error line
    models = ROOT / "traces" / "models"
    out = ["-o", str(tmp_path / "t.trace")] if "-o" not in args else []
    loaded, printed = _probe("record", "train", "--target", str(models / "target"), "--draft", str(models / "draft"),
                             *out, *args)
    lines = [ln for ln in printed.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: ") and words in lines[0], printed
    assert loaded & MODEL_STACK == set()


def test_record_train_says_a_bad_device_with_torch_alone(tmp_path):
    # naming the devices there are needs torch, not transformers or SGLang (was after both, 12 s on 2 loaded cores)
    models = ROOT / "traces" / "models"
    loaded, printed = _probe("record", "train", "--target", str(models / "target"), "--draft", str(models / "draft"),
                             "--prompts", "p.jsonl", "-o", str(tmp_path / "t.trace"), "--device", "nope")
    assert printed.strip() == "specdiff: error: --device 'nope': not a torch device; use cpu, cuda or cuda:N"
    assert loaded & MODEL_STACK == {"torch"}
