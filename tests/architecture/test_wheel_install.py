"""A user's own install: the wheel built from the checkout, installed NON-editable in a fresh
environment, holds every package and runs every command (a hand-written package
list left ``specdiff.replay.fix`` and ``specdiff.replay.trainers`` out of the wheel; ``record
train`` and ``fix`` ended in ModuleNotFoundError there, and every other test installs editable).

The fresh environment downloads nothing: a venv without pip whose site-packages holds the wheel
(installed by this environment's pip, ``--no-index --no-deps``) and one plain-path ``.pth`` line
naming this environment's site-packages for the dependencies (torch, zarr, click, ...). A plain path
line puts that folder on the import path without processing the ``.pth`` files inside it (site.py
``addpackage``), so the editable install's finder there stays off: ``specdiff`` can only come from
the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "traces" / "examples" / "seed"
#: the folders that hold no product code (the rest of the top folders with an __init__.py are specdiff.<folder>)
NOT_SHIPPED = {"tests", "traces", "benchmarks"}

pytestmark = pytest.mark.slow


def _product_packages() -> set[str]:
    """``specdiff.<folder>[.<sub>...]`` of every folder with an ``__init__.py`` under a top folder of the
    checkout that itself has one (read from the tree, independently of setup.py)."""
    tops = [p.parent for p in ROOT.glob("*/__init__.py") if p.parent.name not in NOT_SHIPPED]
    assert {t.name for t in tops} >= {"eagle3", "tracer", "replay", "tui", "demo", "demo_models"}
    return {"specdiff." + ".".join(init.parent.relative_to(ROOT).parts)
            for top in tops for init in top.rglob("__init__.py") if "__pycache__" not in init.parts}


def _run(args, *, cwd: Path, ok=(0,), timeout=300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode in ok, (args, done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, str]:
    """(the built wheel, the fresh environment's ``bin/``, what the build printed): ``python -m build`` (the
    sdist, then the wheel from it, as a user's build does), installed in a fresh venv as described above."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", ROOT], cwd=tmp)
    wheel = next((tmp / "dist").glob("specdiff-*.whl"))
    fresh = tmp / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", fresh], cwd=tmp)
    _run([sys.executable, "-m", "pip", "--python", fresh / "bin" / "python", "install", "--no-index", "--no-deps",
          "--quiet", wheel], cwd=tmp)
    site = Path(_run([fresh / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=tmp).stdout.strip())
    (site / "zz_deps_from_the_test_env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return wheel, fresh / "bin", build.stdout + build.stderr


def test_every_package_folder_of_the_checkout_is_in_the_wheel(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {n.removesuffix("/__init__.py").replace("/", ".") for n in names if n.endswith("/__init__.py")}
    missing = _product_packages() - in_wheel
    assert not missing, f"packages of the checkout missing from the wheel: {sorted(missing)}"
    assert {"specdiff.replay.fix", "specdiff.replay.trainers"} <= in_wheel
    assert "specdiff_zarr_hook.pth" in names  # setup.py's copy, through the sdist (MANIFEST.in)


def test_the_build_warns_of_nothing_deprecated(installed):
    # the license as a TOML table printed setuptools' deprecation notice, ~45 lines per install
    printed = installed[2]
    assert "deprecat" not in printed.lower(), printed[-3000:]


def test_the_installed_specdiff_is_the_wheels_not_the_checkout(installed, tmp_path):
    _, bin_, _ = installed
    where = json.loads(_run([bin_ / "python", "-c",
                             "import json, sys, importlib.metadata as md, specdiff.tui.cli, specdiff.replay.fix, "
                             "specdiff.replay.trainers.registry as r; print(json.dumps([specdiff.tui.cli.__file__, "
                             "r.__file__, str(md.distribution('specdiff').locate_file('')), "
                             "[type(f).__module__ for f in sys.meta_path]]))"], cwd=tmp_path).stdout)
    fresh_site = str(bin_.parent)
    assert all(p.startswith(fresh_site) for p in where[:3]), where
    assert not any("__editable__" in m for m in where[3]), where[3]


def _commands(bin_: Path, cwd: Path) -> list[list[str]]:
    """Every command and subcommand, as the installed ``specdiff --help`` lists them."""
    from specdiff.tui.cli import SUBCOMMANDS

    listed = _run([bin_ / "specdiff", "--help"], cwd=cwd).stdout
    assert all(f"  {name} " in listed for name in SUBCOMMANDS), listed
    subs = _run([bin_ / "specdiff", "record", "--help"], cwd=cwd).stdout
    record = [line.split()[0] for line in subs.split("Commands:")[1].splitlines() if line.strip()]
    assert record == ["client", "serve", "train"], subs
    return [[name] for name in SUBCOMMANDS if name != "record"] + [["record", r] for r in record]


def test_every_command_and_the_no_server_examples_run_from_the_installed_wheel(installed, tmp_path, repo_models):
    _, bin_, _ = installed
    sd = bin_ / "specdiff"
    for cmd in _commands(bin_, tmp_path):
        out = _run([sd, *cmd, "--help"], cwd=tmp_path).stdout
        assert out.startswith(f"Usage: specdiff {' '.join(cmd)} "), (cmd, out[:300])
    train, serve = SEED / "train.trace", SEED / "serve.trace"
    assert "sequences" in _run([sd, "info", serve], cwd=tmp_path).stdout
    report = _run([sd, "diff", train, serve], cwd=tmp_path, ok=(1,)).stdout
    assert report.startswith("first divergence: target.aux.0 at seq 0 pos 0"), report[:500]
    assert "SGLang 0.5.23" in _run([sd, "check", "--target", repo_models / "target", "--draft",
                                    repo_models / "draft"], cwd=tmp_path).stdout
    fixed = tmp_path / "fixed"
    _run([sd, "fix", train, serve, "-o", fixed], cwd=tmp_path)  # specdiff.replay.fix
    cfg = json.loads((fixed / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 5]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input_ids": [1, 5, 9, 13, 17, 21, 25, 29]}\n')
    out = tmp_path / "train.trace"
    _run([sd, "record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft", "--prompts",
          prompts, "-o", out, "--steps", "1", "--probe-positions", "0", "--no-noise-floor"], cwd=tmp_path)
    assert "\nsequences  1\n" in _run([sd, "info", out], cwd=tmp_path).stdout
